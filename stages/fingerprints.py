"""DVC stage `fingerprints` (the first of dvc.yaml): fingerprints/<stage>.json for every stage, the md5 of
each code file its script imports and the value of each param it reads (dpnrepro.pipeline.exact_stages).
Each stage depends on its fingerprint instead of listing those files and params itself: the same reruns,
and a no-op `dvc repro` hashes one small file per stage."""

from dpnrepro.cli import stage
from dpnrepro.pipeline import write_fingerprints


@stage
def main() -> None:
    write_fingerprints()


if __name__ == "__main__":
    main()
