"""tools/gpu_carry.py: what pip resolved is filtered against the GPU machine's packages; the torch it resolves
against; the size check."""

from __future__ import annotations

import importlib.util
import subprocess
import zipfile

from helpers import REPO

spec = importlib.util.spec_from_file_location("gpu_carry", REPO / "tools/gpu_carry.py")
gpu_carry = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_carry)


def report(*pins: str) -> dict:
    """A pip ``install --report`` with only the fields gpu_carry reads."""
    return {"install": [{"metadata": {"name": n, "version": v}} for n, v in (p.split("==") for p in pins)]}


def test_the_gpu_machines_packages_are_dropped_whatever_their_spelling():
    resolved = report("dvc==3.67.1", "PyYAML==6.0.3", "typing_extensions==4.16.0", "torch==2.11.0+cu130",
                      "opencv-python==5.0.0.93", "ruamel.yaml.clib==0.2.15", "numpy==2.4.6", "Zc.Lockfile==4.0")
    assert gpu_carry.missing(resolved, gpu_carry.GPU_ENV) == ["dvc==3.67.1", "ruamel-yaml-clib==0.2.15",
                                                              "zc-lockfile==4.0"]
    assert gpu_carry.missing(resolved, {"Ruamel_Yaml.clib"}) == [
        "dvc==3.67.1", "numpy==2.4.6", "opencv-python==5.0.0.93", "pyyaml==6.0.3", "torch==2.11.0+cu130",
        "typing-extensions==4.16.0", "zc-lockfile==4.0"]


def test_the_torch_stub_is_the_gpu_machines_version_without_dependencies(tmp_path):
    (whl,) = gpu_carry.torch_stub(tmp_path / "stub").iterdir()
    name, version, tag = whl.stem.split("-", 2)
    with zipfile.ZipFile(whl) as z:
        metadata = z.read(f"{name}-{version}.dist-info/METADATA").decode()
    assert (name, version, tag) == ("torch", gpu_carry.TORCH, "py3-none-any")
    assert f"Name: torch\nVersion: {gpu_carry.TORCH}\n" in metadata and "Requires-Dist" not in metadata


def test_the_size_check_counts_a_folder_built_inside_the_checkout_once(tmp_path):
    """The folder is built in a temporary folder of the checkout, untracked and not yet ignored: git lists it
    among the checkout's files, so it was counted twice ("135.4 MiB is over the 64 MiB" for a 69.3 MiB carry)."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    (repo / "tracked.bin").write_bytes(b"\0" * 2**20)
    for cmd in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    new = repo / "tmpbuild" / ".gpu_carry"
    (new / "fashion-mnist").mkdir(parents=True)
    (new / "site.tar.xz").write_bytes(b"\0" * 2**20)
    (new / "fashion-mnist" / "train-images-idx3-ubyte.gz").write_bytes(b"\0" * 2**20)
    (new.parent / "whl").mkdir()  # the wheels, installed into site.tar.xz: they do not travel
    (new.parent / "whl" / "x.whl").write_bytes(b"\0" * 2**20)
    assert gpu_carry.checkout_mib(repo) == 4.0  # what git lists: the temporary folder too
    lines = gpu_carry.listing(new, repo / ".gpu_carry", 4.0, repo=repo)
    assert lines[0].endswith("2.0 MiB + checkout 1.0 MiB = 3.0 MiB of 4"), lines
    assert lines[1] == f"send with the checkout: {repo / '.gpu_carry'}", lines
