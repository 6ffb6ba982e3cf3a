"""tools/gpu_carry.py: what pip resolved is filtered against the GPU machine's packages; the torch it resolves against."""

from __future__ import annotations

import importlib.util
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
