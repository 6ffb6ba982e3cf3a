"""LiT on N processes (gloo on CPU): the contrastive loss over the global batch, GradCache chunking,
per-run checkpoints with an exact resume, dvclive curves, and runs isolated from each other's failure.

Tolerances: the 2-process and the chunked steps compute the same gradient with fp32 sums in another
order (a weight gradient is a sum over the batch's 32 x 16 tokens, split 2 x 16 x 16 across ranks or
chunks, and each shard's forward runs on fewer rows). The rounding error of an n-term fp32 sum is about
sqrt(n) x 2^-24 ≈ 1.3e-6 relative for n = 512 (worst case n x 2^-24 ≈ 3e-5 per element), so we require
the whole gradient vector to agree to ||Δg|| / ||g|| <= 1e-5, and the loss to 1e-6 (a log-sum-exp of 32
terms). Trained weights: Adam divides by sqrt(v), so rounding noise on gradient entries whose true value
is ~0 becomes ~lr-sized updates (test_distributed.py's note); 8 steps stay within 1e-4 of the weight
vector's norm (measured: see the test). A given layout is bit-reproducible, and resuming it is bitwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import REPO, stage_env

WORKER = str(REPO / "tests" / "lit_worker.py")
KILL = "DPNREPRO_TEST_KILL_AT_STEP"
GRAD_TOL, LOSS_TOL, WEIGHT_TOL = 1e-5, 1e-6, 1e-4

sys.path.insert(0, str(REPO / "tests"))
from lit_worker import fake_stage_inputs, stage_params, tiny_problem  # noqa: E402


def _worker(out: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    e = {**stage_env(), "PYTHONPATH": str(REPO / "src"), **(env or {})}
    r = subprocess.run([sys.executable, WORKER, str(out), *args], env=e, capture_output=True, text=True,
                       timeout=600)
    if check and r.returncode:
        raise AssertionError(f"worker failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r


def _vec(state: dict) -> torch.Tensor:
    return torch.cat([state[k].flatten().double() for k in sorted(state) if k != "loss"])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Reference jobs, made once: gradients of the first step and 8 trained steps, 1 and 2 processes."""
    root = tmp_path_factory.mktemp("lit_jobs")
    for name, args in {"g1": ["--devices", "1", "--grads"], "g2": ["--devices", "2", "--grads"],
                       "g2c": ["--devices", "2", "--grads", "--chunk", "4"],
                       "t1": ["--devices", "1"], "t2": ["--devices", "2"]}.items():
        _worker(root / name, *args)
    return root


# ---------------------------------------------------------------------------------------------------
# global-batch loss and chunking


def test_chunked_gradients_match_one_pass():
    from dpnrepro.lit.train import lit_loss, text_step

    grads, losses = [], []
    for chunk in (0, 8, 5):  # 5: a ragged last chunk
        lit, zimg, tokens = tiny_problem()
        losses.append(float(text_step(lit, zimg[:32], tokens[:32], lit_loss(None), chunk_size=chunk)))
        grads.append(torch.cat([p.grad.flatten().double() for _, p in lit.trainable_named_parameters()]))
    for g, loss in zip(grads[1:], losses[1:]):
        print(f"chunked vs one pass: ||Δg|| / ||g|| = {_rel(grads[0], g):.2e}, loss {abs(loss - losses[0]):.1e}")
        assert _rel(grads[0], g) <= GRAD_TOL
        assert abs(loss - losses[0]) <= LOSS_TOL * abs(losses[0])
    assert grads[0].norm() > 0


def test_two_processes_give_the_one_process_gradient(jobs):
    """Each rank embeds its half of the global batch; ClipLoss gathers both halves (with gradients), so the
    loss and the averaged gradient are those of one process with the whole batch, chunked or not."""
    one = load_file(str(jobs / "g1" / "grads.safetensors"))
    for name in ("g2", "g2c"):
        two = load_file(str(jobs / name / "grads.safetensors"))
        assert sorted(two) == sorted(one)
        assert abs(float(two["loss"]) - float(one["loss"])) <= LOSS_TOL * float(one["loss"])
        print(f"{name} vs 1 process: ||Δg|| / ||g|| = {_rel(_vec(one), _vec(two)):.2e}, "
              f"loss {abs(float(two['loss']) - float(one['loss'])):.1e}")
        assert _rel(_vec(one), _vec(two)) <= GRAD_TOL, name
        assert _rel(one["log_temperature"].reshape(1).double(), two["log_temperature"].reshape(1).double()) <= GRAD_TOL


def test_local_loss_would_not_match(jobs):
    """The check above can fail: contrasting each rank's half alone (ClipLoss's defaults) gives another loss."""
    from dpnrepro.lit.towers import contrastive_loss

    lit, zimg, tokens = tiny_problem()
    with torch.no_grad():
        z = lit.encode_text(tokens[:32])
        halves = [float(contrastive_loss(zimg[s], z[s], lit.temperature)) for s in (slice(0, 16), slice(16, 32))]
    one = float(load_file(str(jobs / "g1" / "grads.safetensors"))["loss"])
    assert abs(sum(halves) / 2 - one) > 100 * LOSS_TOL * one


def test_two_processes_train_the_one_process_text_tower(jobs):
    one = load_file(str(jobs / "t1" / "text.safetensors"))
    two = load_file(str(jobs / "t2" / "text.safetensors"))
    rel = _rel(_vec(one), _vec(two))
    print(f"8 steps, 1 vs 2 processes: ||Δw|| / ||w|| = {rel:.2e}")
    assert rel <= WEIGHT_TOL
    h1, h2 = (json.loads((jobs / n / "history.json").read_text()) for n in ("t1", "t2"))
    assert h1["loss_last"] < h1["loss_first"]
    assert abs(h1["loss_last"] - h2["loss_last"]) <= 1e-5 * h1["loss_last"]


def test_killed_two_process_run_resumes_bit_identically(jobs, tmp_path):
    out = tmp_path / "killed"
    killed = _worker(out, "--devices", "2", env={KILL: "4"}, check=False)
    assert killed.returncode != 0
    errors = [ln for ln in killed.stderr.splitlines() if ln.startswith("error:")]
    assert errors and "was killed by SIGKILL" in errors[-1], killed.stderr[-2000:]
    assert json.loads((out / "ckpt" / "meta.json").read_text())["step"] == 4
    resumed = _worker(out, "--devices", "2")
    assert "resuming" in resumed.stdout + resumed.stderr
    assert (out / "text.safetensors").read_bytes() == (jobs / "t2" / "text.safetensors").read_bytes()
    assert (out / "history.json").read_bytes() == (jobs / "t2" / "history.json").read_bytes()


# ---------------------------------------------------------------------------------------------------
# the stage's runs: one directory each, checkpoints, dvclive, failure isolation


@pytest.fixture
def lit_project(tmp_path, monkeypatch):
    """A scratch directory whose params train 2 LiT runs on one tower (6 steps, batch 16), with the
    tower and the caption corpus replaced by tiny in-memory ones; returns a function that runs train_lit."""
    from dpnrepro.config.params import load_params
    from dpnrepro.lit import data, run

    p = stage_params()
    corpus, load_tower = fake_stage_inputs()
    monkeypatch.setattr(data, "load_caption_corpus", lambda *a, **k: corpus)
    monkeypatch.setattr(run, "load_tower", load_tower)

    def train(root: Path):
        root.mkdir(exist_ok=True)
        (root / "params.yaml").write_text(yaml.safe_dump(p))
        monkeypatch.chdir(root)
        return run.train_lit(load_params(), progress=False)

    return train


RUN0, RUN1 = "runs/lit/jft_220k/Mu-7_dpn_s0/lit_s0", "runs/lit/jft_220k/Mu-7_dpn_s0/lit_s1"


def test_a_failing_run_keeps_the_finished_ones_and_resumes_bit_identically(lit_project, tmp_path, monkeypatch,
                                                                           capsys):
    from dpnrepro.lit import run
    from dpnrepro.training import checkpoint

    ref = tmp_path / "ref"
    lit_project(ref)
    for r in (RUN0, RUN1):
        assert (ref / r / "text.safetensors").exists() and (ref / r / "lit.json").exists()
        curves = ref / r / "dvclive" / "plots" / "metrics" / "train"
        assert {f.name for f in curves.iterdir()} >= {"loss.tsv", "lr.tsv", "temperature.tsv"}
        assert len((curves / "loss.tsv").read_text().split("\n")) == 1 + 6 + 1  # header, 6 steps, newline

    save = checkpoint.save_checkpoint

    def crash_after_step_4_of_run_1(ckpt_dir, **kw):
        save(ckpt_dir, **kw)
        if kw["step"] == 4 and str(ckpt_dir).endswith("lit_s1"):
            raise RuntimeError("simulated crash")

    monkeypatch.setattr(checkpoint, "save_checkpoint", crash_after_step_4_of_run_1)
    work = tmp_path / "work"
    with pytest.raises(RuntimeError, match="simulated crash"):
        lit_project(work)
    assert (work / RUN0 / "text.safetensors").exists()  # the finished run stays
    assert not (work / RUN1).exists()  # nothing half-written
    kept = (work / RUN0 / "lit.json").stat().st_mtime_ns
    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    fits = []
    fit = run.LitJob.fit
    monkeypatch.setattr(run.LitJob, "fit", lambda self, *a: fits.append(self.seed) or fit(self, *a))
    lit_project(work)
    assert fits == [1]  # run 0 was complete for the same fingerprint: kept, not retrained
    assert (work / RUN0 / "lit.json").stat().st_mtime_ns == kept
    for r in (RUN0, RUN1):
        assert (work / r / "text.safetensors").read_bytes() == (ref / r / "text.safetensors").read_bytes(), r
        for f in ("loss.tsv", "temperature.tsv"):
            curve = Path(r) / "dvclive" / "plots" / "metrics" / "train" / f
            assert (work / curve).read_text() == (ref / curve).read_text()
    spec = json.loads((work / RUN1 / "lit.json").read_text())
    assert spec == json.loads((ref / RUN1 / "lit.json").read_text())
    # `dvc repro` deletes runs/lit before the stage: the complete checkpoints restore it without a step
    import shutil

    shutil.rmtree(work / "runs")
    capsys.readouterr()
    lit_project(work)
    out = capsys.readouterr().out
    assert out.count("at step 6/6") == 2
    for r in (RUN0, RUN1):
        for f in ("text.safetensors", "lit.json", "dvclive/plots/metrics/train/loss.tsv"):
            assert (work / r / f).read_bytes() == (ref / r / f).read_bytes(), (r, f)


def test_another_configuration_does_not_resume(lit_project, tmp_path, capsys):
    """A checkpoint of another fingerprint is not resumed: the run is retrained from step 0."""
    from dpnrepro.training.checkpoint import CHECKPOINT_FILES, CHECKSUMS, write_checksums

    root = tmp_path / "p"
    lit_project(root)
    meta = root / "checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s1/meta.json"
    m = json.loads(meta.read_text())
    assert m["step"] == 6
    m["fingerprint"] = "other"
    meta.write_text(json.dumps(m))
    write_checksums(meta.parent / CHECKSUMS, [meta.parent / name for name in CHECKPOINT_FILES])  # not damaged
    (root / RUN1 / "lit.json").unlink()
    capsys.readouterr()
    lit_project(root)
    out = capsys.readouterr().out
    assert "resuming" not in out and f"{RUN1}: loss" in out


def test_lit_train_on_two_processes_matches_one_and_resumes_after_a_kill(lit_project, tmp_path):
    """The stage's code on 2 gloo processes (launched by itself from runtime.devices: 2): rank 0 alone
    writes each run, the runs match the 1-process runs to WEIGHT_TOL, and after a SIGKILL of rank 0
    right after the first run's step-4 checkpoint a rerun resumes it: every output is bit-identical."""
    one = tmp_path / "one"
    lit_project(one)
    two, killed = tmp_path / "two", tmp_path / "killed"
    _worker(two, "--stage", "--devices", "2")
    r = _worker(killed, "--stage", "--devices", "2", env={KILL: "4"}, check=False)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode != 0 and errors and "was killed by SIGKILL" in errors[-1], r.stderr[-2000:]
    assert not (killed / RUN0).exists()  # nothing half-written (a SIGKILL leaves only a hidden .tmp)
    assert json.loads((killed / "checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s0/meta.json").read_text())["step"] == 4
    for r in (RUN0, RUN1):
        assert not list((two / r).parent.glob(".*"))  # no leftover temporary directory
        a = load_file(str(one / r / "text.safetensors"))
        b = load_file(str(two / r / "text.safetensors"))
        assert _rel(_vec(a), _vec(b)) <= WEIGHT_TOL
        s1, s2 = (json.loads((d / r / "lit.json").read_text()) for d in (one, two))
        assert {k: v for k, v in s1.items() if k not in ("loss_first", "loss_last", "temperature")} == \
               {k: v for k, v in s2.items() if k not in ("loss_first", "loss_last", "temperature")}
        assert abs(s1["loss_last"] - s2["loss_last"]) <= 1e-5 * s1["loss_last"]
    (killed / "params.yaml").write_text((two / "params.yaml").read_text())
    _worker(killed, "--stage", "--devices", "2")
    for r in (RUN0, RUN1):
        assert not list((killed / r).parent.glob(".*"))  # the killed attempt's .tmp is cleaned up
        for f in ("text.safetensors", "lit.json", "dvclive/plots/metrics/train/loss.tsv"):
            assert (killed / r / f).read_bytes() == (two / r / f).read_bytes(), (r, f)
