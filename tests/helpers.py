"""Shared helpers for tests that run stages in a scratch copy of the project."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def copy_project(dst: Path) -> Path:
    """Copy the tracked project files (as git sees them, plus untracked-not-ignored) into ``dst``."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, check=True, capture_output=True,
    ).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def tiny_params(**overrides) -> dict:
    """The repo's params.yaml shrunk to seconds: few images, few steps, the smallest arch."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    # the idx files directly: no export stage to run first (the end-to-end test covers the image folder)
    params["data"].update(format="idx", source=str(FMNIST))
    for section in ("data", "data_i21k", "data_jft"):
        if params.get(section):
            params[section].update(train_examples=256, val_examples=128, minival_examples=64)
    params["train"].update(batch_size=32, steps=12, warmup_steps=2)
    params["runtime"].update(log_every=2, ckpt_every=4, eval_batch_size=128)
    params["table1"] = {"archs": ["Mu-7"], "stems": ["conv", "dpn"], "seeds": [0], "recipe": {}}
    shrink_sweeps(params)
    for dotted, value in overrides.items():
        section, key = dotted.split(".")
        params[section][key] = value
    return params


def shrink_sweeps(params: dict, steps: int = 4, keep: tuple[str, ...] = ("table1",)) -> dict:
    """Every training sweep (config.sweeps.SWEEPS) but ``keep``: Mu/7, seed 0, ``steps`` steps (the pipeline's
    shape, in seconds)."""
    from dpnrepro.config.sweeps import SWEEPS

    for sweep, body in params.items():
        if sweep in SWEEPS and sweep not in keep and isinstance(body, dict):
            body.update(archs=["Mu-7"], seeds=[0])
            body["recipe"].setdefault("train", {}).update(steps=steps, warmup_steps=1)
            body["runtime"] = {"ckpt_every": steps, "log_every": 2}
    params["benchmark"] = {"archs": ["Ti-16"], "stems": ["conv", "dpn"], "timm_reference": True,
                           "batch_size": 2, "img_size": 32, "warmup_steps": 1, "rounds": 6, "steps_per_round": 1}
    return params


def write_params(project: Path, params: dict) -> None:
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def clean_env(**extra: str) -> dict:
    """What a user's fresh shell hands a script: PATH (the venv's bin first), HOME, LANG and TMPDIR, nothing
    else of this test process (no CPU pins, no thread settings), plus ``extra``."""
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
           "HOME": os.environ.get("HOME", "/tmp"), "LANG": os.environ.get("LANG", "C.UTF-8")}
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return {**env, **extra}


def make_targets(makefile: Path = REPO / "Makefile") -> frozenset[str]:
    """The targets ``makefile`` defines (``name:`` at a line's start; ``name :=`` is a variable)."""
    return frozenset(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", makefile.read_text(), re.MULTILINE))


@cache
def dvc_files() -> tuple[str, ...]:
    """The tracked dvc.yaml files, relative to the repository."""
    out = subprocess.run(["git", "ls-files"], cwd=REPO, check=True, capture_output=True, text=True).stdout
    return tuple(f for f in out.split() if f == "dvc.yaml" or f.endswith("/dvc.yaml"))


@cache
def dvc_outputs() -> frozenset[str]:
    """Every out, metric and plot path the dvc.yaml files declare (written by the pipeline, maybe not yet)."""
    outs = set()
    for dvc_file in dvc_files():
        doc = yaml.safe_load((REPO / dvc_file).read_text()) or {}
        base = (REPO / dvc_file).parent
        for stage in (doc.get("stages") or {}).values():
            wdir = base / stage.get("wdir", ".")
            for key in ("outs", "metrics", "plots"):
                for item in stage.get(key) or []:
                    p = next(iter(item)) if isinstance(item, dict) else item
                    outs.add((wdir / p).resolve().relative_to(REPO.resolve()).as_posix())
    return frozenset(outs)


def imported_packages(importtime: str) -> set[str]:
    """The top-level packages a ``python -X importtime`` run imported, from its stderr."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in importtime.splitlines()
            if line.startswith("import time:") and line.count("|") == 2}


def stage_env(no_thread_pin: bool = False) -> dict:
    """The environment of stage subprocesses: a clean one (:func:`clean_env`), offline. Tests run stages on
    one thread (DPNREPRO_CPU_THREADS=1) to share the cores; ``no_thread_pin`` keeps the project's own pin,
    as the committed smoke results were made with it."""
    env = clean_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", DVC_NO_ANALYTICS="1", PYTHONUNBUFFERED="1",
                    OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    if not no_thread_pin:
        env.update(DPNREPRO_CPU_THREADS="1", OMP_NUM_THREADS="1")
    return env


def checkout_env(project: Path) -> dict:
    """:func:`stage_env` with ``project``'s own src/ imported first: what a user of that checkout runs (the
    generator refuses to write a checkout other than the one it is imported from)."""
    return {**stage_env(), "PYTHONPATH": str(project / "src")}


def run(cmd: list[str], cwd: Path, check: bool = True, no_thread_pin: bool = False, env: dict | None = None,
        **kw) -> subprocess.CompletedProcess:
    """Run ``cmd`` in ``cwd`` under ``env`` (default :func:`stage_env`); ``check``: fail with its output."""
    proc = subprocess.run(cmd, cwd=cwd, env=env if env is not None else stage_env(no_thread_pin),
                          capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def dvc_repro(project: Path, *args: str, no_thread_pin: bool = False) -> dict[str, float]:
    """``dvc repro ARGS`` in ``project`` through DVC's API (``python -m dpnrepro.dvc_graph repro``, run as
    :func:`run` runs a command): the stages it ran, each with its seconds."""
    import json
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dvc_repro_") as tmp:
        times = Path(tmp) / "times.json"
        run([sys.executable, "-m", "dpnrepro.dvc_graph", "repro", "--times", str(times), *args], project,
            no_thread_pin=no_thread_pin)
        return json.loads(times.read_text())


def tiny_table6_project(root: Path) -> Path:
    """A scratch copy of the project on tiny params whose Table 6 is Mu/7, DPN and pre-LN, one seed, 4 steps;
    dvc.yaml regenerated as `make profile` does, git-initialised."""
    copy_project(root)
    params = tiny_params(**{"train.steps": 4, "train.warmup_steps": 1})
    params["export_imagefolder"] = None  # tiny_params reads the idx files directly
    params["table6"].update(archs=["Mu-7"], stems=["dpn", "pre"], seeds=[0], recipe={})
    write_params(root, params)
    run([sys.executable, "-m", "dpnrepro.pipeline"], root, env=checkout_env(root))
    git_init(root)
    return root


def git_init(project: Path) -> None:
    run(["git", "init", "-q"], project)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A"], project)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], project)


def differing_outputs(ours: dict, committed: dict) -> list[str]:
    """One line per output whose hash differs between two parsed dvc.lock files, or that only one of them
    records (tools/lock_diff.py's comparison): ``path: committed <md5> != ours <md5>`` (``missing``)."""
    from lock_diff import differing

    return [f"{d['path']}: committed {d['a'] or 'missing'} != ours {d['b'] or 'missing'}"
            for d in differing(committed, ours)]


def plots_errors(root: Path, *revs: str) -> list:
    """What ``dvc plots show --json`` (``dvc plots diff <revs> --json`` with revisions) reports as failed in
    ``root``: its error entries, and every plot of dvc.yaml that rendered nothing."""
    import json

    cmd = ["dvc", "plots", "diff", *revs, "--json"] if revs else ["dvc", "plots", "show", "--json"]
    shown = json.loads(run(cmd, root).stdout)
    names = [next(iter(entry)) for entry in yaml.safe_load((root / "dvc.yaml").read_text()).get("plots", [])]
    return [*(shown.get("errors") or []), *(f"{n}: nothing rendered" for n in names if not shown["data"].get(n))]


def tiny_mu7_training(stem: str = "dpn", dropout: float = 0.0):
    """``(ds, spec)`` for a few-step trainer test: 64 uint8 28x28 images with labels (a fixed NumPy draw)
    and a Mu/7 spec with the smoke model's settings (``dropout`` for its three dropout rates)."""
    import datasets
    import numpy as np

    from dpnrepro.training.trainer import ModelSpec

    rng = np.random.default_rng(0)
    ds = datasets.Dataset.from_dict(
        {"image": list(rng.integers(0, 255, (64, 28, 28), dtype=np.uint8)), "label": list(rng.integers(0, 10, 64))},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)}),
    )
    spec = ModelSpec(arch="Mu/7", stem=stem, placement="pre-pre", num_classes=10, img_size=28, in_chans=1,
                     pool="tok", rep_size=True, head_bias_init=-2.2, pos_drop_rate=dropout, proj_drop_rate=dropout,
                     drop_path_rate=dropout)
    return ds, spec
