"""Multi-process training (torchrun, gloo on CPU): same results as one process, exact resume, clear errors.

Real 2-process runs: the plain stage command with ``runtime.devices: 2`` (it starts torchrun's agent
itself, training/launch.py), under ``dvc repro``, on two loopback "nodes", and under a hand-started
``torchrun``. Weights of differently split runs agree to float rounding, not bitwise: the gradient of a
global batch is summed in another order. (The key bias of attention has a zero true gradient, so Adam
turns its rounding noise into ~1e-6 updates; hence a tolerance on the whole weight vector, not per
element.) The same split is bitwise the same run: 2 processes x 16 == 1 process x 2 micro-batches of 16.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from dpnrepro.config.runtime import RuntimeParams
from helpers import FMNIST, REPO, copy_project, git_init, run, stage_env, tiny_mu7_training, tiny_params, write_params

TRAIN = ["stages/train.py", "--sweep", "table1", "--arch", "Mu-7", "--stem", "dpn", "--seed", "0"]
TORCHRUN = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc_per_node", "2"]
RUN = "runs/table1/Mu-7_dpn_s0"
CKPT = "checkpoints/table1/Mu-7_dpn_s0"
KILL = "DPNREPRO_TEST_KILL_AT_STEP"
TOL = 1e-5

needs_fmnist = pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")


RUNTIME_KEYS = {"devices", "nodes", "accum_steps", "parallel", "compile"}


def _params(**train) -> dict:
    """tiny_params (12 steps, batch 32, checkpoint every 4) with one run in table1 and no other sweep."""
    p = tiny_params(**{f"{'runtime' if k in RUNTIME_KEYS else 'train'}.{k}": v for k, v in train.items()})
    t1 = yaml.safe_load((REPO / "params.yaml").read_text())["table1"]
    # the run trained is Mu-7 dpn s0 (TRAIN names it); conv stays in the sweep for Figures 2-4's params check
    p["table1"] = {**t1, "archs": ["Mu-7"], "stems": ["dpn", "conv"], "seeds": [0]}
    for key in [k for k, v in p.items() if k != "table1" and isinstance(v, dict) and {"archs", "seeds"} <= set(v)]:
        del p[key]
    for key in ("lit", "lit_captions", "segmentation", "export_seg_canvases", "sun397_scratch"):  # need other sweeps
        p.pop(key, None)
    return p


def _vector(path: Path) -> torch.Tensor:
    w = load_file(str(path / "model.safetensors"))
    return torch.cat([w[k].flatten() for k in sorted(w)])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


def _losses(path: Path) -> list[tuple[int, float]]:
    lines = (path / "dvclive" / "plots" / "metrics" / "train" / "loss.tsv").read_text().split()[2:]
    return [(int(s), float(v)) for s, v in zip(lines[::2], lines[1::2])]


class Project:
    """A prepared scratch project; reference runs are made once and kept beside it."""

    def __init__(self, root: Path):
        self.root = root
        self._refs: dict[str, Path] = {}

    def train(self, *, procs: int, env: dict | None = None, check: bool = True, torchrun: bool = False, **train):
        """The stage command (it launches ``procs`` processes itself), or under a hand-started torchrun."""
        write_params(self.root, _params(devices=procs, **train))
        cmd = [*TORCHRUN, *TRAIN] if torchrun else [sys.executable, *TRAIN]
        if env is None:
            return run(cmd, self.root, check=check)
        return subprocess.run(cmd, cwd=self.root, env={**stage_env(), **env}, capture_output=True, text=True)

    def clean(self):
        shutil.rmtree(self.root / RUN, ignore_errors=True)
        shutil.rmtree(self.root / CKPT, ignore_errors=True)

    def reference(self, name: str, **kw) -> Path:
        if name not in self._refs:
            self.clean()
            self.train(**kw)
            self._refs[name] = self.root.parent / f"ref_{name}"
            shutil.copytree(self.root / RUN, self._refs[name])
        return self._refs[name]


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("dist") / "proj")
    write_params(root, _params())
    run([sys.executable, "stages/prepare.py"], root)
    return Project(root)


# --- 2 processes × B/2 == 1 process × B ------------------------------------------------------------


def _assert_same_run(one: Path, other: Path, what: str):
    l1, l2 = _losses(one), _losses(other)
    assert [s for s, _ in l1] == [s for s, _ in l2] == list(range(2, 13, 2))
    for (s, a), (_, b) in zip(l1, l2):
        assert abs(a - b) <= TOL * abs(a), f"step {s}: loss {a} (1 process) vs {b} ({what})"
    assert _rel(_vector(one), _vector(other)) < TOL, what


@needs_fmnist
def test_two_processes_match_one_process(project):
    one = project.reference("1proc", procs=1)
    two = project.reference("2proc", procs=2)  # `python stages/train.py` with runtime.devices: 2
    _assert_same_run(one, two, "2 processes x 16")
    # the same split of the global batch is the same run, bit for bit: 1 process x 2 micro-batches of 16
    same_split = project.reference("1proc_accum2", procs=1, accum_steps=2)
    assert (two / "model.safetensors").read_bytes() == (same_split / "model.safetensors").read_bytes()
    # a hand-started torchrun runs the same job
    project.clean()
    project.train(procs=2, torchrun=True)
    assert (project.root / RUN / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()
    # rank 0 alone writes: one run directory, one set of logs, one checkpoint
    assert sorted(p.name for p in (project.root / "runs" / "table1").iterdir()) == ["Mu-7_dpn_s0"]
    assert json.loads((project.root / CKPT / "meta.json").read_text())["step"] == 12
    # DDP with accumulation: 2 processes x 2 micro-batches of 8 (no_sync on the first)
    project.clean()
    project.train(procs=2, accum_steps=2)
    _assert_same_run(one, project.root / RUN, "2 processes x 2 micro-batches x 8")


# --- crash after a checkpoint, rerun: bit-identical to the uninterrupted 2-process run ----------------


@needs_fmnist
def test_killed_two_process_run_resumes_bit_identical(project):
    reference = project.reference("2proc", procs=2)
    project.clean()
    killed = project.train(procs=2, env={KILL: "4"}, check=False)  # SIGKILL rank 0 after the step-4 checkpoint
    # the agent stops rank 1 and the stage fails in one line (no traceback of the launcher)
    assert killed.returncode == 2, killed.stderr
    # every rank stops in one line at most: rank 1 either notices the broken collective first or is stopped
    errors = re.findall(r"error: [^\n]*", killed.stderr)  # (after rank 0's unfinished progress bar)
    assert "Traceback" not in killed.stderr and 1 <= len(errors) <= 2, killed.stderr
    assert errors[-1].startswith("error: rank 0 of the stages/train.py ") and "was killed by SIGKILL" in errors[-1]
    assert all(e.startswith("error: rank 1 stopped: another process of the job failed") for e in errors[:-1])
    assert json.loads((project.root / CKPT / "meta.json").read_text())["step"] == 4
    assert not (project.root / RUN).exists(), "a killed run must not leave a run directory behind"
    out = project.train(procs=2)
    assert f"resuming from {CKPT} at step 4/12" in out.stdout
    assert out.stdout.count("resuming from") == 1, "only rank 0 prints"
    assert (project.root / RUN / "model.safetensors").read_bytes() == (reference / "model.safetensors").read_bytes()


@needs_fmnist
def test_fsdp_two_processes_resume_and_match_one_process(project):
    """FSDP2 (fully_shard per block + root) on gloo/CPU: full-state checkpoints written by rank 0,
    loaded (and re-sharded) by both ranks after a crash; the result equals one process."""
    one = project.reference("1proc", procs=1)
    project.clean()
    killed = project.train(procs=2, parallel="fsdp", accum_steps=2, env={KILL: "8"}, check=False)
    assert killed.returncode != 0
    ckpt = load_file(str(project.root / CKPT / "model.safetensors"))
    assert ckpt["blocks.0.attn.qkv.weight"].shape == (192, 64), "checkpoint must hold full, unsharded tensors"
    out = project.train(procs=2, parallel="fsdp", accum_steps=2)
    assert f"resuming from {CKPT} at step 8/12" in out.stdout
    assert _rel(_vector(one), _vector(project.root / RUN)) < TOL
    # the rerun logs the killed attempt's curve up to step 8 again, then steps 10 and 12
    ref, resumed = dict(_losses(one)), dict(_losses(project.root / RUN))
    assert sorted(resumed) == sorted(ref) == [2, 4, 6, 8, 10, 12]
    assert all(abs(ref[s] - v) <= TOL * abs(ref[s]) for s, v in resumed.items()), (ref, resumed)


# --- `dvc repro` owns the launch (training/launch.py) ---------------------------------------------------

# Counts process groups: imported at start-up by every worker (first on PYTHONPATH), it logs each
# init_process_group call with the caller's rank.
PG_COUNTER = """import os
if os.environ.get("PG_LOG") and "WORLD_SIZE" in os.environ:
    import torch.distributed as dist
    _init = dist.init_process_group
    def init_process_group(*a, **k):
        with open(os.environ["PG_LOG"], "a") as f:
            f.write(os.environ["RANK"] + "\\n")
        return _init(*a, **k)
    dist.init_process_group = init_process_group
"""


@pytest.mark.slow
@needs_fmnist
def test_dvc_repro_spreads_a_sweep_over_runtime_devices(project, tmp_path):
    """Plain `dvc repro train-table1` with runtime.devices: 2 (nothing run by hand): 2 processes train
    both runs of the sweep in one process group per process, the lock records the stage command, and
    the weights are bitwise those of 1 process computing the same split (2 micro-batches of 16)."""
    root = copy_project(tmp_path / "proj")
    params = tiny_params(**{"runtime.devices": 2})  # every section: DVC checks each stage's params
    params["table1"] = _params()["table1"]  # the same two runs (dpn, conv) as `project`'s
    write_params(root, params)
    git_init(root)
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(PG_COUNTER)
    env = stage_env()
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path / "hook"), env.get("PYTHONPATH")])),
               PG_LOG=str(tmp_path / "pg.log"))
    proc = subprocess.run(["dvc", "repro", "train-table1"], cwd=root, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted((tmp_path / "pg.log").read_text().split()) == ["0", "1"], "one process group per rank per sweep"
    assert sorted(p.name for p in (root / "runs" / "table1").iterdir()) == ["Mu-7_conv_s0", "Mu-7_dpn_s0"]
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]["train-table1"]
    assert lock["cmd"] == "python stages/train.py --sweep table1"
    same_split = project.reference("1proc_accum2", procs=1, accum_steps=2)
    assert (root / RUN / "model.safetensors").read_bytes() == (same_split / "model.safetensors").read_bytes()


FAKE_SRUN = """#!/bin/bash
# srun --nodes=N ... CMD: N copies of CMD on this machine (the "nodes"), as srun starts one per node
echo "$@" > "$(dirname "$0")/srun.args"
n=1
while [[ $1 == --* ]]; do [[ $1 == --nodes=* ]] && n=${1#--nodes=}; shift; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_PROCID=$i SLURM_NODEID=$i "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_fmnist
def test_two_node_agents_on_loopback_match_one_node(project, tmp_path):
    """runtime.nodes: 2 inside a SLURM allocation: the stage srun's itself once per node, each copy
    runs its node's torchrun agent (1 process), the two meet at torchrun's c10d rendezvous (here on
    127.0.0.1) and train the run of one node with 2 processes, bit for bit."""
    two = project.reference("2proc", procs=2)
    (tmp_path / "bin").mkdir()
    srun = tmp_path / "bin" / "srun"
    srun.write_text(FAKE_SRUN)
    srun.chmod(0o755)
    env = {"PATH": f"{srun.parent}{os.pathsep}{stage_env()['PATH']}", "SLURM_JOB_ID": "4242",
           "PET_RDZV_ENDPOINT": f"127.0.0.1:{_free_port()}"}
    project.clean()
    out = project.train(procs=2, nodes=2, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "bin" / "srun.args").read_text().split()[:4] == [
        "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert out.stdout.count("trained table1/Mu-7_dpn_s0") == 1, "rank 0 alone writes"
    assert (project.root / RUN / "model.safetensors").read_bytes() == (two / "model.safetensors").read_bytes()


def test_launch_layouts():
    from dpnrepro.errors import UserError
    from dpnrepro.training.launch import torchrun_argv

    assert torchrun_argv(RuntimeParams(devices=1), {}) is None
    assert torchrun_argv(RuntimeParams(devices=8), {"WORLD_SIZE": "8"}) is None  # inside torchrun: train
    assert torchrun_argv(RuntimeParams(devices=8), {}) == ["--standalone", "--nnodes", "1", "--nproc-per-node", "8"]
    assert torchrun_argv(RuntimeParams(devices=16, nodes=2), {"PET_RDZV_ENDPOINT": "n0:29400", "PET_RDZV_ID": "7"}) == [
        "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint", "n0:29400",
        "--rdzv-id", "7"]
    with pytest.raises(UserError, match="set PET_RDZV_ENDPOINT"):
        torchrun_argv(RuntimeParams(devices=16, nodes=2), {})
    with pytest.raises(UserError, match=r"runtime.devices \(12\) is not divisible by runtime.nodes \(8\)"):
        torchrun_argv(RuntimeParams(devices=12, nodes=8), {})


# --- errors ---------------------------------------------------------------------------------------


@needs_fmnist
def test_batch_not_divisible_is_one_line(project):
    project.clean()
    proc = project.train(procs=1, accum_steps=3, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "batch_size (32) is not divisible by devices x accum_steps (1 x 3 = 3)" in lines[0]


@needs_fmnist
def test_devices_disagreeing_with_world_size_is_an_error(project):
    project.clean()
    write_params(project.root, _params(devices=1))
    proc = run([*TORCHRUN, *TRAIN], project.root, check=False)
    assert proc.returncode != 0
    assert "error: runtime.devices is 1 but this job has 2 process(es) (WORLD_SIZE)" in proc.stderr
    assert not (project.root / RUN).exists()


# --- in-process (one process): accumulation, world-size-independent mixup, runtime checks ------------


@pytest.fixture()
def tiny(tmp_path, monkeypatch):
    from dpnrepro.config.core import InputParams, TrainParams

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    det, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    ds, spec = tiny_mu7_training()
    inp = InputParams(image_size=28, channels=1, eval_resize=28, inception_crop=False, flip=True)
    cfg = TrainParams(lr=1e-3, batch_size=16, steps=4, warmup_steps=1, grad_clip=1.0, device="cpu")
    yield ds, spec, inp, cfg
    torch.use_deterministic_algorithms(det, warn_only=warn)


class _Live:
    def __init__(self):
        self.step, self.losses = 0, []

    def log_metric(self, name, value):
        if name == "train/loss":
            self.losses.append(value)


INPUT_KEYS = {"mixup", "repeated_aug"}


def _fit(tiny, tmp_path, name, **over):
    from dpnrepro.training.trainer import train_classifier

    ds, spec, inp, cfg = tiny
    inp = inp.model_copy(update={k: v for k, v in over.items() if k in INPUT_KEYS})
    runtime = RuntimeParams(log_every=1, **{k: v for k, v in over.items() if k in RUNTIME_KEYS})
    cfg = cfg.model_copy(update={k: v for k, v in over.items() if k not in INPUT_KEYS | RUNTIME_KEYS})
    live = _Live()
    model = train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / name, runtime=runtime, live=live,
                             progress=False)
    sd = model.state_dict()
    return torch.cat([sd[k].flatten() for k in sorted(sd)]), live.losses


@pytest.mark.parametrize("mixup,repeats", [(0.0, 1), (0.5, 1), (0.5, 3)])
def test_accumulation_matches_one_batch(tiny, tmp_path, mixup, repeats):
    """accum_steps=4 (micro-batches of 4) == one batch of 16, with mixup too: the partner of example j
    is example j-r of the global batch whatever the split (HaloBatchSampler), r = repeated_aug (with
    r = 3 the halo of 3 is most of a micro-batch of 4)."""
    w1, l1 = _fit(tiny, tmp_path, "a", mixup=mixup, repeated_aug=repeats)
    w4, l4 = _fit(tiny, tmp_path, "b", mixup=mixup, repeated_aug=repeats, accum_steps=4)
    assert len(l1) == len(l4) == 4
    assert all(abs(a - b) <= TOL * abs(a) for a, b in zip(l1, l4)), (l1, l4)
    assert _rel(w1, w4) < TOL


def test_halo_sampler_reassembles_the_global_batch():
    from dpnrepro.data.loader import StepBatchSampler
    from dpnrepro.data.loader import HaloBatchSampler

    kw = dict(seed=3, start_step=0, total_steps=5)
    for step in range(5):
        full = StepBatchSampler(50, 12, **kw).batch_for_step(step)
        parts = [HaloBatchSampler(50, 12, rank=r, world_size=3, **kw).batch_for_step(step) for r in range(3)]
        assert sum((p[1:] for p in parts), []) == full, "ranks' slices (without halo) are the global batch"
        assert [p[0] for p in parts] == [full[-1], full[3], full[7]], "halo = the example before the slice"
        assert parts[1][1:] == StepBatchSampler(50, 12, rank=1, world_size=3, **kw).batch_for_step(step)


def _mixed_pairs(batch_size: int, repeats: int, world: int, accum: int, step: int) -> list[tuple]:
    """``(example, partner)`` for every example of the global batch, in order, as the trainer mixes them
    with ``world`` ranks of ``accum`` micro-batches (the partner read off the mixed one-hot targets)."""
    from dpnrepro.data.loader import HaloBatchSampler
    from dpnrepro.training.losses import mixup

    micro = batch_size // (world * accum)
    pairs = []
    for rank in range(world):
        sampler = HaloBatchSampler(50, batch_size, seed=3, start_step=0, total_steps=4, rank=rank,
                                   world_size=world, repeats=repeats)
        batch, halo = sampler.batch_for_step(step), sampler.halo
        for k in range(accum):
            window = batch[k * micro : k * micro + micro + halo]
            n = len(window)
            _, t = mixup(torch.zeros(n, 1, 2, 2), torch.eye(n), 1.0, seed=3, step=step, shift=halo)
            for p in range(halo, n):  # the micro-batch; the halo is dropped after mixing
                partner = [q for q in torch.nonzero(t[p]).flatten().tolist() if q != p]
                assert len(partner) == 1, t[p]
                pairs.append((window[p], window[partner[0]]))
    return pairs


@pytest.mark.parametrize("batch_size,repeats,layouts", [
    (12, 1, [(1, 1), (2, 1), (1, 4), (3, 2)]),
    (12, 3, [(1, 1), (2, 1), (1, 4), (3, 2), (2, 3), (1, 12)]),  # B divisible by r; micro-batches < halo
    (10, 3, [(1, 1), (2, 1), (1, 5), (5, 2), (2, 5)]),  # the last image of the batch has only one copy
    (6, 3, [(1, 1), (2, 1), (3, 2)]),  # the smallest batch allowed: two distinct images
])
def test_mix_partners_are_never_copies_of_the_same_image(batch_size, repeats, layouts):
    """With repeated augmentation r the partner of example j is example j - r of the global batch (never
    a copy of the same image), whatever the ranks / micro-batches; r = 1 is big_vision's roll by one."""
    from dpnrepro.data.loader import StepBatchSampler

    for step in range(4):
        full = StepBatchSampler(50, batch_size, seed=3, start_step=0, total_steps=4,
                                repeats=repeats).batch_for_step(step)
        expected = [(full[j], full[(j - repeats) % batch_size]) for j in range(batch_size)]
        for world, accum in layouts:
            pairs = _mixed_pairs(batch_size, repeats, world, accum, step)
            copies = [(i, j) for (i, _), (j, _) in pairs if i == j]
            assert not copies, f"examples mixed with a copy of their own image ({world}x{accum}): {copies}"
            assert pairs == expected, (world, accum)


def test_mixing_repeats_needs_two_distinct_images():
    from dpnrepro.data.loader import HaloBatchSampler
    from dpnrepro.errors import UserError

    with pytest.raises(UserError, match=r"repeated_aug 3 needs train.batch_size >= 6 \(two distinct images\), got 5"):
        HaloBatchSampler(50, 5, seed=0, start_step=0, total_steps=1, repeats=3)


def test_runtime_checks_are_user_errors(tiny, tmp_path, monkeypatch):
    from dpnrepro.errors import UserError
    from dpnrepro.training.trainer import train_classifier

    ds, spec, inp, cfg = tiny
    with pytest.raises(UserError, match=r"batch_size \(16\) is not divisible by world_size x accum_steps "
                                        r"\(1 x 3 = 3\)"):
        train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / "c", runtime=RuntimeParams(accum_steps=3),
                         progress=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match=r"runtime.devices is 1 but this job has 4 process\(es\)"):
        train_classifier(spec, ds, inp, cfg, seed=0, ckpt_dir=tmp_path / "c", progress=False)
    assert not (tmp_path / "c").exists()


def test_grad_norms_count_norm_pre_in_the_stem():
    from dpnrepro.models import build_vit
    from dpnrepro.training.trainer import grad_norms_by_layer

    torch.manual_seed(0)
    model = build_vit("Mu/7", stem="post_posemb", num_classes=10, img_size=28, in_chans=1)
    model(torch.randn(2, 1, 28, 28)).sum().backward()
    stem = [p.grad for n, p in model.named_parameters() if n.startswith(("patch_embed.", "norm_pre."))]
    assert any(n.startswith("norm_pre.") for n, _ in model.named_parameters())
    expected = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in stem])))
    assert grad_norms_by_layer(model)["stem"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.slow
def test_compiled_training_matches_eager(tiny, tmp_path):
    """train.compile: torch.compile'd forward, checkpoints and the returned model keep plain names."""
    w1, l1 = _fit(tiny, tmp_path, "eager", steps=2, batch_size=8)
    w2, l2 = _fit(tiny, tmp_path, "compiled", steps=2, compile=True, batch_size=8)
    assert all(abs(a - b) <= 1e-4 * abs(a) for a, b in zip(l1, l2))
    assert _rel(w1, w2) < 1e-4
    assert not any("_orig_mod" in k for k in load_file(str(tmp_path / "compiled" / "model.safetensors")))


@pytest.mark.slow
@needs_fmnist
def test_compiled_ddp_two_processes_match_one_process(project):
    one = project.reference("1proc", procs=1)
    project.clean()
    project.train(procs=2, accum_steps=2, compile=True)
    _assert_same_run(one, project.root / RUN, "compiled DDP, 2 processes x 2 micro-batches")


def test_result_label_names_the_device_that_computed(monkeypatch):
    """On a GPU machine a CPU run (the smoke profile pins train.device: cpu) is labelled CPU, as the
    committed smoke results are; one stage process keeps one device type for all its runs."""
    from dpnrepro.cli import hardware_label
    from dpnrepro.errors import UserError
    from dpnrepro.training import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "FakeGPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert hardware_label().startswith("FakeGPU x1")
    with distributed.session("cpu") as ctx:
        assert hardware_label().startswith("CPU ")
        with pytest.raises(UserError, match="one stage process trains on one device type"):
            with distributed.joined(ctx, "cuda", torch.are_deterministic_algorithms_enabled()):
                pass
        with pytest.raises(RuntimeError, match="inside the open session on cpu: pass the open session's context"):
            with distributed.session("cpu"):  # one entry per process: a second is a bug, never a silent reuse
                pass
    assert hardware_label().startswith("FakeGPU x1")


@needs_fmnist
def test_a_recipe_train_device_override_reaches_training(project):
    """The sweep's resolved ``train.device`` (here a recipe's ``cpu`` under a top-level ``cuda``) is the device
    the session opens and the run trains on, not the top-level value."""
    p = _params()
    p["train"]["device"] = "cuda"
    p["table1"]["recipe"] = {**p["table1"].get("recipe", {}), "train": {"device": "cpu"}}
    write_params(project.root, p)
    project.clean()
    proc = run([sys.executable, *TRAIN], project.root, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = project.root / RUN
    assert json.loads((run_dir / "config.json").read_text())["train"]["device"] == "cpu"
    assert json.loads((run_dir / "run.json").read_text())["hardware"].startswith("CPU")
