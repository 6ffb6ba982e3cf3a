"""Checkpoints: safetensors weights, pickle refusal, bit-exact resume, atomic directories."""
from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from dpnrepro.errors import CheckpointError
from dpnrepro.io import atomic_dir
from dpnrepro.models import build_vit
from dpnrepro.training.checkpoint import (
    CHECKSUMS,
    MODEL_FILE,
    DamagedCheckpoint,
    load_checkpoint,
    load_weights,
    read_checkpoint_meta,
    safe_torch_load,
    save_checkpoint,
    save_weights,
)


def _vit(arch="Mu/7", stem="dpn", seed=0):
    torch.manual_seed(seed)
    return build_vit(arch, stem=stem, num_classes=10, img_size=28, in_chans=1)


# --- weights -----------------------------------------------------------------------------------------


def test_weights_roundtrip_bit_exact(tmp_path):
    src, dst = _vit(seed=0), _vit(seed=1)
    assert not torch.equal(src.blocks[0].attn.qkv.weight, dst.blocks[0].attn.qkv.weight)
    path = tmp_path / "w.safetensors"
    save_weights(src, path)
    assert load_weights(dst, path) is dst
    a, b = src.state_dict(), dst.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
        assert a[k].dtype == b[k].dtype
    x = torch.randn(2, 1, 28, 28)
    src.eval(), dst.eval()
    assert torch.equal(src(x), dst(x))
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert not f.metadata()  # no header metadata: safetensors writes it in hash order (unstable bytes)
    save_weights(src, tmp_path / "again.safetensors")
    assert (tmp_path / "again.safetensors").read_bytes() == path.read_bytes()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("other", [dict(arch="Mu/4"), dict(stem="conv")])
def test_weights_of_another_arch_are_refused(tmp_path, other):
    path = tmp_path / "w.safetensors"
    save_weights(_vit(), path)
    model = _vit(**other)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match="does not match this architecture"):
        load_weights(model, path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched


def test_non_safetensors_path_is_refused(tmp_path):
    path = tmp_path / "w.pt"
    torch.save(_vit().state_dict(), path)
    with pytest.raises(CheckpointError, match="only .safetensors"):
        load_weights(_vit(), path)


def test_missing_weights(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_weights(_vit(), tmp_path / "nope.safetensors")


# --- pickles ----------------------------------------------------------------------------------------


class _Payload:
    """Unpickling this runs a shell command (here: touch a marker file)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch '{self.marker}'",)


def test_safe_torch_load_refuses_malicious_pickle(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"weight": torch.zeros(2), "x": _Payload(marker)}, path)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="refusing to load"):
        safe_torch_load(path)
    assert not marker.exists(), "the pickle's payload ran"
    # control: the payload is live, so the refusal above is what protected us
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_safe_torch_load_accepts_plain_tensors(tmp_path):
    path = tmp_path / "ok.pt"
    sd = {"a": torch.arange(6.0).reshape(2, 3), "b": {"c": torch.ones(2, dtype=torch.int64)}, "n": 3}
    torch.save(sd, path)
    out = safe_torch_load(path)
    assert torch.equal(out["a"], sd["a"]) and torch.equal(out["b"]["c"], sd["b"]["c"]) and out["n"] == 3


# --- resumable training state -------------------------------------------------------------------------


class _Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.3)  # consumes the torch RNG, so RNG restore matters
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.norm(self.fc1(x)))))


def _setup(seed):
    torch.manual_seed(seed)
    model = _Tiny()
    opt = torch.optim.AdamW(
        [{"params": [model.fc1.weight, model.fc2.weight], "weight_decay": 0.1},
         {"params": [model.fc1.bias, model.fc2.bias, *model.norm.parameters()], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.9, 0.99), eps=1e-8,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4) * 0.9 ** s)
    return model, opt, sched


def _train(model, opt, sched, steps):
    model.train()
    for _ in range(steps):
        x = torch.randn(8, 6)  # data from the global torch RNG
        scale = random.uniform(0.5, 1.5)  # and from Python's
        loss = (model(x * scale) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()


def _reference_and_half_run():
    """A 6-step reference run and an identical run stopped after 3 steps (same init and RNG seeds)."""
    ref, ref_opt, ref_sched = _setup(0)
    torch.manual_seed(1)
    random.seed(1)
    _train(ref, ref_opt, ref_sched, 6)
    model, opt, sched = _setup(0)
    torch.manual_seed(1)
    random.seed(1)
    _train(model, opt, sched, 3)
    return (ref, ref_opt, ref_sched), (model, opt, sched)


def test_resume_is_bit_identical(tmp_path):
    (ref, ref_opt, ref_sched), (model, opt, sched) = _reference_and_half_run()
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, step=3, fingerprint="fp", extra={"k": 1})
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        [MODEL_FILE, "optimizer.safetensors", "rng.safetensors", "meta.json", CHECKSUMS])

    # a fresh process: other weights, fresh optimizer/scheduler, scrambled RNGs
    model2, opt2, sched2 = _setup(99)
    torch.manual_seed(12345)
    random.seed(12345)
    meta = load_checkpoint(ckpt, model=model2, optimizer=opt2, scheduler=sched2)
    assert meta["step"] == 3 and meta["fingerprint"] == "fp" and meta["extra"] == {"k": 1}
    assert read_checkpoint_meta(ckpt) == meta
    assert sched2.last_epoch == 3 and sched2.get_last_lr() == sched.get_last_lr()
    assert opt2.param_groups[0]["weight_decay"] == 0.1 and opt2.param_groups[1]["weight_decay"] == 0.0
    assert float(opt2.state[model2.fc1.weight]["step"]) == 3
    _train(model2, opt2, sched2, 3)

    for (name, a), b in zip(ref.state_dict().items(), model2.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    for p_ref, p in zip(ref.parameters(), model2.parameters()):
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(ref_opt.state[p_ref][key], opt2.state[p][key])
    assert sched2.get_last_lr() == ref_sched.get_last_lr()


def test_resume_without_rng_restore_would_differ(tmp_path):
    """Control for the test above: the RNG streams do matter, so a missing restore would be caught."""
    (ref, _, _), (model, opt, sched) = _reference_and_half_run()
    torch.manual_seed(12345)
    _train(model, opt, sched, 3)
    assert not torch.equal(ref.fc1.weight, model.fc1.weight)


def test_load_checkpoint_missing(tmp_path):
    model, opt, sched = _setup(0)
    assert read_checkpoint_meta(tmp_path / "none") is None
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "none", model=model, optimizer=opt, scheduler=sched)


def test_save_checkpoint_replaces_previous(tmp_path):
    model, opt, sched = _setup(0)
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, step=1, fingerprint="a")
    _train(model, opt, sched, 1)
    save_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, step=2, fingerprint="a")
    assert read_checkpoint_meta(ckpt)["step"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no .ckpt.*.tmp / .ckpt.old left


# --- atomic directories ------------------------------------------------------------------------------


def test_atomic_dir_failure_keeps_previous_content(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(out) as tmp:
            assert tmp != out and tmp.parent == out.parent
            (tmp / "keep.txt").write_text("new")
            (tmp / "partial.bin").write_bytes(b"x")
            raise RuntimeError("boom")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_failure_without_previous_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "a").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_success_replaces_and_cleans_stale(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    stale = tmp_path / ".out.abc1_xyz.tmp"  # left by a killed earlier attempt (mkdtemp's name)
    stale.mkdir()
    with atomic_dir(out) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- the trainer's resume (end to end, in-process) ------------------------------------------------------


class _Killed(Exception):
    pass


def _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop: float, live: bool = False,
                            damage=None) -> bool:
    """Train 6 steps uninterrupted, and 3 steps + 'kill' right after the step-3 checkpoint + resume, then
    restore the complete checkpoint once more (as `dvc repro` does after deleting the run directory).
    ``live``: each attempt logs to its own dvclive directory ``tmp_path/live/<attempt>``; ``damage``: called
    with the step-3 checkpoint's folder before the resume."""
    # seed_everything() switches on deterministic algorithms and sets CUBLAS_WORKSPACE_CONFIG: undo after
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    det, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    try:
        return _run_trainer_resume(tmp_path, monkeypatch, idx_dataset, drop, live, damage)
    finally:
        torch.use_deterministic_algorithms(det, warn_only=warn_only)


def _logged(tmp_path, attempt: str, live: bool):
    """A dvclive ``Live`` for one attempt (a no-op context without ``live``), as stages/train.py opens it."""
    import contextlib

    if not live:
        return contextlib.nullcontext()
    from dvclive import Live

    return Live(dir=str(tmp_path / "live" / attempt), save_dvc_exp=False, dvcyaml=None, report=None)


def _run_trainer_resume(tmp_path, monkeypatch, idx_dataset, drop: float, live: bool, damage) -> bool:
    from conftest import data_cfg
    from dpnrepro.config.core import InputParams, TrainParams
    from dpnrepro.config.runtime import RuntimeParams
    from dpnrepro.data.loader import load_split
    from dpnrepro.data.prepare import prepare_dataset
    from dpnrepro.training import trainer

    prepare_dataset(data_cfg(idx_dataset), tmp_path / "prepared")
    ds = load_split(tmp_path / "prepared", "train")
    spec = trainer.ModelSpec(arch="Mu/7", stem="dpn", placement="pre-pre", num_classes=10, img_size=28,
                             in_chans=1, pool="tok", rep_size=False, head_bias_init=0.0, pos_drop_rate=drop,
                             proj_drop_rate=drop, drop_path_rate=drop)
    inp = InputParams(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=True)
    cfg = TrainParams(lr=1e-3, batch_size=8, steps=6, warmup_steps=1, device="cpu")
    runtime = RuntimeParams(ckpt_every=3, log_every=2)

    def attempt(name: str, ckpt: str):
        with _logged(tmp_path, name, live) as logger:
            return trainer.train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / ckpt, runtime=runtime,
                                            progress=False, live=logger)

    ref = attempt("reference", "a")
    real_save = trainer.save_checkpoint

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        raise _Killed

    monkeypatch.setattr(trainer, "save_checkpoint", save_then_die)
    with pytest.raises(_Killed):
        attempt("killed", "b")
    monkeypatch.setattr(trainer, "save_checkpoint", real_save)
    assert read_checkpoint_meta(tmp_path / "b")["step"] == 3
    if damage is not None:
        damage(tmp_path / "b")
    resumed = attempt("resumed", "b")
    assert read_checkpoint_meta(tmp_path / "b")["step"] == 6
    restored = attempt("restored", "b")  # from the complete checkpoint: no step trained
    return all(torch.equal(ref.state_dict()[k], m.state_dict()[k]) for m in (resumed, restored) for k in ref.state_dict())


@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_trainer_resume_bit_identical(tmp_path, monkeypatch, idx_dataset):
    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.0)


@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_trainer_resume_bit_identical_with_dropout(tmp_path, monkeypatch, idx_dataset):
    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.1)


@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_trainer_resume_keeps_the_dvclive_history(tmp_path, monkeypatch, idx_dataset):
    """A run resumed mid-training and a run restored from its complete checkpoint write the
    uninterrupted run's dvclive directory byte for byte (every curve's TSV and metrics.json)."""
    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.0, live=True)

    def files(attempt):
        root = tmp_path / "live" / attempt
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    reference = files("reference")
    assert {"metrics.json", "plots/metrics/train/loss.tsv", "plots/metrics/grad_norm/stem.tsv"} <= set(reference)
    assert [r.split("\t")[0] for r in reference["plots/metrics/train/loss.tsv"].decode().splitlines()] == \
        ["step", "2", "4", "6"]
    for attempt in ("resumed", "restored"):
        assert files(attempt) == reference, attempt


# --- damaged checkpoints: a resume cache, verified before it is used ------------------------------------------


def _truncate(name: str):
    def damage(ckpt):
        path = ckpt / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path
    return damage


def _random_bytes_into_tensor_data(ckpt):
    """4000 random bytes over the middle of model.safetensors' tensor data (its header left intact)."""
    path = ckpt / MODEL_FILE
    data = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(data[:8], "little") + 1000
    assert len(data) > start + 4000
    data[start : start + 4000] = random.Random(0).randbytes(4000)
    path.write_bytes(bytes(data))
    return path


DAMAGES = {"truncated meta.json": _truncate("meta.json"),
           "truncated optimizer.safetensors": _truncate("optimizer.safetensors"),
           "4000 random bytes in the weights": _random_bytes_into_tensor_data}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_checkpoint_is_not_loaded(tmp_path, damage, capsys):
    model = _vit()
    opt, sched = torch.optim.AdamW(model.parameters()), None
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    opt.step()
    ckpt = tmp_path / "Mu-7_dpn_s0"
    save_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, step=3, fingerprint="a")
    assert read_checkpoint_meta(ckpt)["step"] == 3 and capsys.readouterr().err == ""
    path = DAMAGES[damage](ckpt)
    assert read_checkpoint_meta(ckpt) is None
    assert capsys.readouterr().err == \
        f"checkpoint {path} is damaged (checksum mismatch); retraining Mu-7_dpn_s0 from scratch\n"
    with pytest.raises(DamagedCheckpoint, match=f"checkpoint {path} is damaged"):
        load_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched)


@pytest.mark.usefixtures("hf_cache_in_tmp")
@pytest.mark.parametrize("damage", list(DAMAGES))
def test_trainer_retrains_from_scratch_after_a_damaged_checkpoint(tmp_path, monkeypatch, idx_dataset, damage, capsys):
    """The killed run's checkpoint damaged on disk: the run trains again from step 0 (one line on stderr
    names the file) and ends with the uninterrupted run's weights, never resumed from damaged ones."""
    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.1, damage=DAMAGES[damage])
    notes = [line for line in capsys.readouterr().err.splitlines() if "is damaged" in line]
    assert len(notes) == 1 and notes[0].startswith(f"checkpoint {tmp_path / 'b'}/") and \
        notes[0].endswith("is damaged (checksum mismatch); retraining b from scratch"), notes


@pytest.mark.usefixtures("hf_cache_in_tmp")
def test_resume_hashes_each_checkpoint_file_once(tmp_path, monkeypatch, idx_dataset):
    """The resume from the step-3 checkpoint, the test's own look at the step-6 one and the restore of it
    each read a checkpoint once: every file is hashed once per read, not again when it is loaded."""
    from dpnrepro.training import checkpoint

    hashed, real = [], checkpoint.file_sha256

    def count_hashes(ckpt):  # installed after the killed attempt (the damage hook), before the resume
        def file_sha256(path):
            if Path(path).parent == ckpt:
                hashed.append(Path(path).name)
            return real(path)

        monkeypatch.setattr(checkpoint, "file_sha256", file_sha256)

    assert _trainer_resume_matches(tmp_path, monkeypatch, idx_dataset, drop=0.0, damage=count_hashes)
    assert sorted(hashed) == sorted(checkpoint.CHECKPOINT_FILES * 3)


def test_checkpoint_left_aside_by_a_kill_is_read_back(tmp_path):
    """A kill between atomic_dir's two renames leaves the complete checkpoint at ``.<name>.old``: the
    reader recovers it instead of retraining."""
    model, opt, sched = _setup(0)
    ckpt = tmp_path / "ckpt"
    save_checkpoint(ckpt, model=model, optimizer=opt, scheduler=sched, step=3, fingerprint="a")
    ckpt.rename(tmp_path / ".ckpt.old")
    assert read_checkpoint_meta(ckpt)["step"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
