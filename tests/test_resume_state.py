"""Resume states survive a load that maps tensors to another device, and hold the CUDA generators.

mmengine's loader maps a checkpoint to the training device: a generator state kept as a CPU tensor came
back as a CUDA tensor, and ``torch.set_rng_state`` refused it. Every resume state (training and LiT:
training/checkpoint.py; segmentation: segmentation/resume.py) is now plain values (determinism/rng.py).
On the CPU, the ``meta`` device stands for the other device: a load onto it keeps no tensor data at all,
so a state survives it only as plain values. The ``cuda`` tests (``pytest -k cuda``, skipped without a
GPU) kill and resume one tiny training, LiT and segmentation run on CUDA against their uninterrupted twins.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import FMNIST

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _needs_mmseg() -> None:  # dpnrepro.segmentation imports mmseg, which imports mmcv's compiled ops
    pytest.importorskip("mmseg", reason="needs mmsegmentation and mmcv (make env; a GPU machine builds mmcv)")


def _draws(numpy_global: bool = True) -> list:
    """The next numbers of every generator a resume restores (CUDA's too where CUDA is initialised; numpy's
    global one where the state keeps it)."""
    out = [torch.rand(4).tolist(), torch.randint(0, 2**62, (2,)).tolist(), random.random()]
    if numpy_global:
        out.append(np.random.random(3).tolist())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out.append(torch.rand(4, device="cuda").tolist())
    return out


def _to_meta(storage, location):  # a map_location function: every storage onto another device
    return torch.UntypedStorage(storage.nbytes(), device="meta")


MAPS = {"meta": "meta", "function": _to_meta, "dict": {"cpu": "meta"}}


def _saved_and_mapped(obj, tmp_path: Path, map_location):
    path = tmp_path / "state.pth"
    torch.save(obj, path)
    return torch.load(path, map_location=map_location, weights_only=True)


def _training_capture() -> dict:
    from dpnrepro.training.checkpoint import capture_rng

    return capture_rng(numpy_global=False)  # as save_checkpoint captures it


def _training_restore(state: dict) -> None:
    from dpnrepro.training.checkpoint import restore_rng

    restore_rng(state)


def _segmentation_capture() -> dict:
    from dpnrepro.segmentation.resume import capture_rng

    return capture_rng()


def _segmentation_restore(state: dict) -> None:
    from dpnrepro.segmentation.resume import restore_rng

    restore_rng(state)


# (capture, restore, whether numpy's global generator is kept); LiT checkpoints through
# training/checkpoint.py (lit/train.py: save_checkpoint / load_checkpoint)
STATES = {"training_and_lit": (_training_capture, _training_restore, False),
          "segmentation": (_segmentation_capture, _segmentation_restore, True)}


@pytest.mark.parametrize("where", MAPS)
@pytest.mark.parametrize("component", STATES)
def test_rng_state_survives_a_device_mapped_load(tmp_path, component, where):
    """capture -> torch.save -> torch.load mapped to another device -> restore: the same next numbers."""
    if component == "segmentation":
        _needs_mmseg()
    capture, restore, numpy_global = STATES[component]
    state = capture()
    expected = _draws(numpy_global)
    loaded = _saved_and_mapped({"rng": state}, tmp_path, MAPS[where])["rng"]
    _draws(numpy_global)  # the generators move on
    restore(loaded)
    assert _draws(numpy_global) == expected


def test_segmentation_resume_through_mmengines_own_load_path(tmp_path):
    """ResumeStateHook writes a checkpoint (rank 0's and every rank's states), mmengine's _load_checkpoint
    maps it to another device (as Runner.resume maps it to the training device), the hook hands the
    states to the train loop, and the loop's data iterator restores them after the skipped iterations."""
    _needs_mmseg()
    from types import SimpleNamespace

    from mmengine.runner.checkpoint import _load_checkpoint

    from dpnrepro.segmentation.resume import (RANKS_RNG_KEY, RNG_KEY, ResumableIterBasedTrainLoop, ResumeStateHook,
                                              _RestoreAfter, capture_rng, safe_mmengine_load)

    hook = ResumeStateHook()
    expected = {}
    ranks = []
    for rank in (0, 1):  # two ranks' streams: rank 1's differs from rank 0's
        torch.manual_seed(10 + rank), np.random.seed(20 + rank), random.seed(30 + rank)
        ranks.append(capture_rng())
        expected[rank] = _draws()
    hook._ranks_rng = ranks
    checkpoint = {"meta": {"iter": 2}, "state_dict": {"w": torch.ones(2)}}
    hook.before_save_checkpoint(SimpleNamespace(world_size=2), checkpoint)
    assert RNG_KEY in checkpoint and checkpoint[RANKS_RNG_KEY] == ranks
    torch.save(checkpoint, tmp_path / "iter_2.pth")
    for rank in (0, 1):
        with safe_mmengine_load():
            loaded = _load_checkpoint(str(tmp_path / "iter_2.pth"), map_location="meta")
        assert loaded["state_dict"]["w"].device.type == "meta"  # the mapping did happen
        loop = ResumableIterBasedTrainLoop.__new__(ResumableIterBasedTrainLoop)
        hook.after_load_checkpoint(SimpleNamespace(world_size=2, rank=rank, train_loop=loop), loaded)
        _draws()
        batches = _RestoreAfter(iter(["b1", "b2", "b3"]), 2, loop.rng_after_skip)
        assert [next(batches), next(batches)] == ["b1", "b2"]
        assert _draws() == expected[rank]


def test_segmentation_checkpoints_of_the_old_form_still_resume(tmp_path):
    """A state as segmentation checkpoints held it before (tensors; numpy's keys as an int64 tensor)."""
    _needs_mmseg()
    from dpnrepro.segmentation.resume import restore_rng

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    old = {"torch": torch.get_rng_state(), "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
           "numpy": [kind, int(pos), int(has_gauss), float(cached)], "python": random.getstate()}
    expected = _draws()
    loaded = _saved_and_mapped(old, tmp_path, "cpu")
    _draws()
    restore_rng(loaded)
    assert _draws() == expected


def test_training_checkpoint_restores_cuda_devices_in_numeric_order():
    """``torch_cuda_10`` is device 10, not the third of a sorted list."""
    from dpnrepro.training.checkpoint import _rng_state

    tensors = {"torch_cpu": torch.zeros(1), **{f"torch_cuda_{i}": torch.full((1,), i) for i in range(12)}}
    assert [int(t) for t in _rng_state(tensors, [3, [], None])["cuda"]] == list(range(12))


def test_cuda_states_are_left_unused_without_cuda(monkeypatch):
    """A state captured on a GPU machine restores on one without CUDA: the CPU generators as always
    (determinism/rng.py says why the CUDA states cannot matter there)."""
    from dpnrepro.determinism import rng

    state = rng.capture_rng()
    state["cuda"] = [state["torch"][:24]]  # any bytes: they must not be used
    expected = _draws()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rng.restore_rng(state)
    assert _draws() == expected


# --- CUDA: kill -> resume gives the uninterrupted run's bits ---------------------------------------------

@needs_cuda
def test_cuda_generator_state_is_captured_and_survives_a_load_mapped_to_cuda(tmp_path):
    from dpnrepro.determinism import rng

    torch.zeros(1, device="cuda")  # CUDA initialised, as by a run training on it
    state = rng.capture_rng()
    assert len(state["cuda"]) == torch.cuda.device_count()
    expected = _draws()
    loaded = _saved_and_mapped(state, tmp_path, "cuda")
    _draws()
    rng.restore_rng(loaded)
    assert _draws() == expected


@needs_cuda
def test_cuda_training_checkpoint_rng_restores_from_tensors_loaded_onto_cuda(tmp_path):
    """rng.safetensors read onto the GPU (``load_file(device="cuda")``) still restores every generator."""
    import json

    from safetensors.torch import load_file

    from dpnrepro.training.checkpoint import _rng_state, restore_rng, save_checkpoint

    model = torch.nn.Linear(2, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(tmp_path / "ckpt", model=model, optimizer=optimizer, scheduler=None, step=1, fingerprint="fp")
    expected = _draws(numpy_global=False)
    tensors = load_file(str(tmp_path / "ckpt" / "rng.safetensors"), device="cuda")
    assert len([k for k in tensors if k.startswith("torch_cuda_")]) == torch.cuda.device_count()
    _draws(numpy_global=False)
    restore_rng(_rng_state(tensors, json.loads((tmp_path / "ckpt" / "meta.json").read_text())["python_rng"]))
    assert _draws(numpy_global=False) == expected


@needs_cuda
@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_cuda_training_kill_resume_gives_the_uninterrupted_weights(tmp_path, monkeypatch, idx_dataset):
    """tests/test_checkpoint.py's in-process kill -> resume (dropout and stochastic depth 0.1), on CUDA."""
    from test_checkpoint import _trainer_resume_matches

    from dpnrepro.config import core

    cpu_params = core.TrainParams
    monkeypatch.setattr(core, "TrainParams", lambda **kw: cpu_params(**{**kw, "device": "cuda"}))
    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.1)


def _digest(state: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode() + state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class _Killed(Exception):
    pass


def lit_kill_resume(tmp_path: Path, monkeypatch, device: str, steps: int = 6, kill_at: int = 3) -> tuple[str, str]:
    """The text tower's digest after ``steps`` steps uninterrupted, and after a kill right after the
    checkpoint of step ``kill_at`` and a resume (tests/lit_worker.py's tiny problem)."""
    from lit_worker import tiny_problem, train_cfg

    from dpnrepro.lit.train import TextState, train_text_tower
    from dpnrepro.training import checkpoint

    def run(ckpt: Path) -> str:
        lit, zimg, tokens = tiny_problem()
        train_text_tower(lit, zimg, tokens, train_cfg(steps, batch=16), seed=0, device=torch.device(device),
                         progress=False, ckpt_dir=ckpt, fingerprint="fp", ckpt_every=kill_at)
        return _digest(TextState(lit).state_dict())

    reference = run(tmp_path / "reference")
    save = checkpoint.save_checkpoint

    def save_then_die(ckpt_dir, **kw):
        save(ckpt_dir, **kw)
        if kw["step"] == kill_at:
            raise _Killed

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        run(tmp_path / "killed")
    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    assert checkpoint.read_checkpoint_meta(tmp_path / "killed")["step"] == kill_at
    return reference, run(tmp_path / "killed")


@needs_cuda
def test_cuda_lit_kill_resume_gives_the_uninterrupted_text_tower(tmp_path, monkeypatch):
    reference, resumed = lit_kill_resume(tmp_path, monkeypatch, "cuda")
    assert resumed == reference


def segmentation_kill_resume(tmp_path: Path, device: str) -> tuple[str, str]:
    """The segmentor's digest after 4 iterations uninterrupted, and after a kill before iteration 4
    (checkpoints every 2) and a resume (mmengine maps the checkpoint to ``device``): the recipe of
    tests/test_segmentation.py's resume test, stochastic depth and random crops/flips included."""
    from mmengine.hooks import Hook
    from mmengine.registry import HOOKS

    from dpnrepro.data.segmentation import export_canvases
    from dpnrepro.segmentation.experiment import run_config, train_and_evaluate
    from dpnrepro.training.distributed import DistContext

    canvases = tmp_path / "canvases"
    export_canvases(str(FMNIST), canvases, train_images=16, val_images=3, size=84, items=(2, 4), seed=0)
    probe = {"kill_at": None}

    @HOOKS.register_module(force=True)
    class KillBeforeIter(Hook):  # the same hook config in both attempts: the same fingerprint, so it resumes
        def before_train_iter(self, runner, batch_idx, data_batch=None):
            if runner.iter == probe["kill_at"]:
                raise _Killed

    def run(work: Path) -> str:
        opts = {"train_cfg.max_iters": 4, "param_scheduler.0.end": 4, "default_hooks.checkpoint.interval": 2,
                "train_dataloader.batch_size": 4,
                "custom_hooks": [dict(type="ResumeStateHook"), dict(type="KillBeforeIter")]}
        cfg = run_config(Path(__file__).resolve().parents[1] / "configs/segmentation/canvas_mu7_linear.py",
                         arch="Mu-7", stem="dpn", fraction="1/2", seed=3, data_root=canvases, work_dir=work,
                         options=opts, device=device)
        return _digest(train_and_evaluate(cfg, ctx=DistContext(device=torch.device(device)))["state_dict"])

    reference = run(tmp_path / "reference")
    probe["kill_at"] = 3
    with pytest.raises(_Killed):
        run(tmp_path / "killed")
    assert (tmp_path / "killed" / "iter_2.pth").exists()
    probe["kill_at"] = None
    return reference, run(tmp_path / "killed")


@needs_cuda
@pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")
def test_cuda_segmentation_kill_resume_gives_the_uninterrupted_segmentor(tmp_path):
    _needs_mmseg()
    reference, resumed = segmentation_kill_resume(tmp_path, "cuda")
    assert resumed == reference
