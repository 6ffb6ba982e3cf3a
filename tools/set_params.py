"""Edit params.yaml key by key, YAML-aware, and fail loudly (a `sed` once added keys that the profile
already had, and DVC refused the file with duplicate keys).

    python tools/set_params.py [--file params.yaml] runtime.workers=14 runtime.compile=true

Round-trip (ruamel.yaml: comments and order kept; a duplicate key in the input is an error). Each KEY is a dotted
path whose parent mapping must exist; VALUE is read as YAML. The result is validated as the project's params
(dpnrepro.config.params) before it replaces the file, so a typo or a wrong type stops here, not in a stage.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

from ruamel.yaml import YAML


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", default="params.yaml", type=Path)
    ap.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    args = ap.parse_args()
    rt = YAML()  # round-trip; allow_duplicate_keys is False: a duplicate key raises
    rt.preserve_quotes = True
    rt.width = 4096  # no re-wrapping of long flow mappings
    rt.representer.add_representer(type(None), lambda r, _: r.represent_scalar("tag:yaml.org,2002:null", "null"))
    doc = rt.load(args.file.read_text())
    for item in args.assignments:
        if "=" not in item:
            sys.exit(f"set_params: {item!r} is not KEY=VALUE")
        key, raw = item.split("=", 1)
        *parents, leaf = key.split(".")
        node = doc
        for part in parents:
            if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
                sys.exit(f"set_params: {args.file} has no mapping {'.'.join(parents)!r} for {key}")
            node = node[part]
        value = YAML(typ="safe").load(raw)
        print(f"set_params: {key}: {node.get(leaf, '(new)')} -> {value}")
        node[leaf] = value
    buf = io.StringIO()
    rt.dump(doc, buf)
    text = buf.getvalue()
    import yaml

    from dpnrepro.config.params import parse_params
    from dpnrepro.errors import ParamsError
    from dpnrepro.io import write_text_atomic

    try:
        parse_params(yaml.safe_load(text), args.file)  # the project's own schema: unknown keys, types, ranges
    except ParamsError as exc:
        sys.exit(f"set_params: the edited {args.file} is refused: {exc}")
    try:
        write_text_atomic(args.file, text)
    except OSError as exc:
        sys.exit(f"set_params: cannot write {args.file} ({exc.strerror or exc}); it is unchanged")


if __name__ == "__main__":
    main()
