"""Shared fixtures: a tiny synthetic idx dataset (MNIST file format), a tiny image folder, one thread."""
from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

# Two test workers share the cores with the stages they start, so a 2-thread stage runs beside other work:
# OpenMP threads that spin at barriers then burn the core the other thread waits for. Passive waiting
# (no effect on any bit: the work split is set by the thread count) measured on the 2-core VM, Mu/7 train
# step at 2 threads beside one busy core: 229 ms spinning vs 96 ms passive; alone 66 vs 71 ms. Set before
# torch (libgomp) loads, inherited by every subprocess.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import dpnrepro  # noqa: F401,I001  (first: its CPU pins must be in place before numpy and torch load)
from dpnrepro.cli import offline_defaults  # noqa: I001

# Offline as every stage is (cli.offline_defaults), before datasets or huggingface_hub load: they read the
# variables once, at import, so a test that sets them later would reach for the network (no network here:
# test_data's hub-name test waited ~20 s on it before failing the way it expects).
offline_defaults()
import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

# The idx fixture: image i of the train split has pixel (0, 0) == i, of the test split == 100 + i, so a
# prepared example can be traced back to the raw example it came from.
IDX_TRAIN = 60
IDX_TEST = 30
IDX_SIZE = 28
TEST_OFFSET = 100


# The end-to-end file runs a whole smoke `dvc repro` (the suite's longest); collected first, so that under
# `pytest -n 2 --dist loadfile` (make test) one worker starts it while the other takes the rest.
LONGEST_FIRST = ("test_pipeline.py",)


def pytest_collection_modifyitems(config, items):
    """Files in LONGEST_FIRST first, then files with slow tests, then the rest; order within a file kept."""
    slow_files = {item.path.name for item in items if item.get_closest_marker("slow")}

    def rank(item):
        name = item.path.name
        return (LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST),
                name not in slow_files)

    items.sort(key=rank)  # stable


# Where the suite's time goes, per file (what `--dist loadfile` schedules): setup, call and teardown of each
# test summed, printed before pytest's own --durations (under xdist the controller sums its workers' reports).
_FILE_SECONDS: dict[str, float] = {}
FILE_TIMES_SHOWN = 25


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + (getattr(report, "duration", 0.0) or 0.0)


def pytest_terminal_summary(terminalreporter):
    if not _FILE_SECONDS:
        return
    ranked = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])
    total = sum(_FILE_SECONDS.values())
    terminalreporter.write_sep("=", f"seconds per test file ({len(ranked)} files, {total:.0f} s in all)")
    for path, seconds in ranked[:FILE_TIMES_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f} s  {100 * seconds / total:5.1f} %  {path}")


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    """Tiny models and tensors run fastest single-threaded on a busy CPU."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def hf_cache_in_tmp(tmp_path, monkeypatch):
    """Keep `datasets` caches (imagefolder builds) out of the user's home directory."""
    import datasets

    cache = tmp_path / "_hf_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_idx(path: Path, array: np.ndarray, *, gz: bool = True) -> Path:
    """Write ``array`` (uint8) as an idx file: >HBB magic (0, 8, ndim), >I per dim, raw body."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    blob = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)
    return path


def idx_images(n: int, offset: int = 0, size: int = IDX_SIZE) -> np.ndarray:
    r = np.arange(size)[:, None]
    c = np.arange(size)[None, :]
    imgs = np.stack([(offset + i + r * c) % 256 for i in range(n)]).astype(np.uint8)
    imgs[:, 0, 0] = offset + np.arange(n)  # the example id, recoverable after prepare
    return imgs


def make_idx_dataset(root: Path, *, n_train: int = IDX_TRAIN, n_test: int = IDX_TEST, num_classes: int = 10,
                     train_labels: np.ndarray | None = None) -> Path:
    if train_labels is None:
        train_labels = np.arange(n_train) % num_classes
    write_idx(root / "train-images-idx3-ubyte", idx_images(n_train))
    write_idx(root / "train-labels-idx1-ubyte", np.asarray(train_labels))
    write_idx(root / "t10k-images-idx3-ubyte", idx_images(n_test, TEST_OFFSET))
    write_idx(root / "t10k-labels-idx1-ubyte", np.arange(n_test) % num_classes)
    return root


@pytest.fixture
def idx_dataset(tmp_path) -> Path:
    """A Fashion-MNIST-shaped idx directory: 60 train and 30 test 28x28 images, labels i % 10."""
    return make_idx_dataset(tmp_path / "idx")


def make_image_folder(root: Path, classes=("a", "b"), per_class: int = 6, corrupt: str | None = None) -> Path:
    """``<root>/{train,test}/<class>/<n>.jpg``; ``corrupt`` names one extra garbage train file."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", per_class), ("test", max(2, per_class // 2))):
        for c in classes:
            d = root / split / c
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
                Image.fromarray(arr).save(d / f"{i:03d}.jpg", quality=90)
    if corrupt:
        (root / "train" / classes[0] / corrupt).write_bytes(b"\x00this is not a jpeg\xff" * 8)
    return root


def data_cfg(source: Path, **over) -> dict:
    """A validated ``data`` section as the dict prepare_dataset receives (schema-checked)."""
    from dpnrepro.config.core import DataParams

    base = dict(name="tiny", format="idx", source=str(source), train_split="train", eval_split="test",
                minival_fraction=0.1, train_examples=0, minival_examples=0, val_examples=0,
                num_classes=10, skip_corrupt=False, seed=0)
    base.update(over)
    return DataParams(**base).model_dump()


# The CI machine's end-to-end run, shared by every test that needs it (tests/test_pipeline.py): the real
# smoke `dvc repro` of the committed params.yaml in a scratch copy without any committed output.
def pipeline_results() -> list[str]:
    """The files the paper's pipeline (the root dvc.yaml; benchmarks live in benchmarks/dvc.yaml) writes
    into git: its metrics and its uncached outputs (tables, figures), in dvc.yaml order."""
    import yaml

    from helpers import REPO

    files = []
    for body in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        for entry in [*body.get("outs", []), *body.get("metrics", []), *body.get("plots", [])]:
            if isinstance(entry, dict):
                (path, opts), = entry.items()
                if opts.get("cache", True) is False:
                    files.append(path)
    return files


COMMITTED_OUTPUTS = ("dvc.lock", *pipeline_results())


@pytest.fixture(scope="session")
def smoke_repro(tmp_path_factory):
    """``(root, proc, seconds)`` after ``dvc repro`` (every table and figure) of the committed smoke
    profile in a fresh copy: empty DVC cache, no dvc.lock, no pipeline results, its own git repository."""
    import shutil
    import time

    from helpers import FMNIST, copy_project, git_init, run

    if not FMNIST.exists():
        pytest.skip("needs Debian's dataset-fashion-mnist (make env)")
    root = copy_project(tmp_path_factory.mktemp("smoke_repro"))
    for rel in COMMITTED_OUTPUTS:
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    git_init(root)
    t0 = time.perf_counter()
    proc = run(["dvc", "repro"], root, no_thread_pin=True)
    return root, proc, time.perf_counter() - t0


@pytest.fixture(scope="session")
def table6_reproduced(tmp_path_factory):
    """A tiny Table 6 project (helpers.tiny_table6_project) after `dvc repro table6`, its outputs not committed:
    made once per test run, the test workers sharing it through a file lock (test_pr_report and test_dvc_pack
    run on either). Read-only: a test copies it (`shutil.copytree(..., symlinks=True)`)."""
    from filelock import FileLock

    from helpers import FMNIST, run, tiny_table6_project

    if not FMNIST.exists():
        pytest.skip("needs Debian's dataset-fashion-mnist (make env)")
    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every xdist worker of this run
    root, done = shared / "table6_reproduced", shared / "table6_reproduced.done"
    with FileLock(str(shared / "table6_reproduced.lock")):
        if not done.exists():
            import shutil

            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            tiny_table6_project(root)
            run(["dvc", "repro", "table6"], root)
            done.touch()
    return root
