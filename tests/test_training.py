"""The trainer: a run killed with SIGKILL resumes from its last checkpoint to bit-identical weights."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers import FMNIST, copy_project, run, stage_env, tiny_params, write_params

pytestmark = pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")

TRAIN = ["stages/train.py", "--sweep", "table1", "--arch", "Mu-7", "--stem", "dpn", "--seed", "0"]
RUN = "runs/table1/Mu-7_dpn_s0"
CKPT = "checkpoints/table1/Mu-7_dpn_s0"


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = copy_project(tmp_path_factory.mktemp("proj"))
    write_params(root, tiny_params(**{"train.steps": 40, "runtime.ckpt_every": 8}))
    run([sys.executable, "stages/prepare.py"], root)
    return root


@pytest.fixture(scope="module")
def uninterrupted(project):
    """The bytes of the run's weights after one uninterrupted training from scratch (the tests' reference)."""
    run(["rm", "-rf", RUN, CKPT], project)
    run([sys.executable, *TRAIN], project)
    return (project / RUN / "model.safetensors").read_bytes()


def test_uninterrupted_runs_are_bit_identical(project, uninterrupted):
    run(["rm", "-rf", RUN, CKPT], project)
    run([sys.executable, *TRAIN], project)
    assert (project / RUN / "model.safetensors").read_bytes() == uninterrupted, \
        "same seed, same data: weights file must be byte-stable on CPU (DVC hash)"


def test_kill_minus_9_then_resume_matches_uninterrupted(project, uninterrupted):
    run(["rm", "-rf", RUN, CKPT], project)
    proc = subprocess.Popen([sys.executable, *TRAIN], cwd=project, env=stage_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    meta = project / CKPT / "meta.json"
    deadline = time.time() + 240
    while not meta.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert meta.exists(), "no checkpoint appeared before the run ended"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    import json

    killed_at = json.loads(meta.read_text())["step"]
    assert not (project / RUN).exists(), "a killed run must not leave a run directory behind"

    out = run([sys.executable, *TRAIN], project)
    assert f"resuming from {CKPT} at step" in out.stdout
    resumed = (project / RUN / "model.safetensors").read_bytes()
    assert resumed == uninterrupted, f"resumed from step {killed_at}: weights differ"


def test_checkpoint_of_other_config_is_not_resumed(project, uninterrupted):
    if not (project / CKPT / "meta.json").is_file():  # the tests before leave this config's complete checkpoint
        run([sys.executable, *TRAIN], project)
    params = tiny_params(**{"train.steps": 40, "runtime.ckpt_every": 8, "train.lr": 0.002})
    write_params(project, params)
    try:
        out = run([sys.executable, *TRAIN], project)
        assert "ignoring checkpoint" in out.stdout
        assert "resuming" not in out.stdout
    finally:
        write_params(project, tiny_params(**{"train.steps": 40, "runtime.ckpt_every": 8}))


def test_code_fingerprint_covers_exactly_the_train_stages_code_deps(tmp_path):
    """A checkpoint written by other code is not resumed: the fingerprint hashes the files the train
    stages depend on in dvc.yaml (both from dpnrepro.codedeps), and nothing else."""
    import shutil

    from dpnrepro.codedeps import code_files
    from dpnrepro.training.trainer import code_fingerprint
    from helpers import REPO

    root = tmp_path / "repo"
    for part in ("src/dpnrepro", "stages"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_fingerprint(root)
    assert before == code_fingerprint(REPO)
    files = code_files("stages/train.py", root)
    for other in ("src/dpnrepro/reports/tables.py", "src/dpnrepro/evaluation/fewshot.py", "src/dpnrepro/config/lit.py"):
        assert other not in files
    (root / "src/dpnrepro/reports/tables.py").write_text("# not a training dependency\n")
    with open(root / "src/dpnrepro/config/lit.py", "a") as f:  # the LiT schema: validated by name, never read
        f.write("\n# changed\n")
    assert code_fingerprint(root) == before
    for dep in ("src/dpnrepro/models/vision_transformer_dpn.py", "src/dpnrepro/data/fast.py",
                "src/dpnrepro/data/randaugment.py", "src/dpnrepro/training/losses.py",
                "src/dpnrepro/config/sweeps.py", "stages/train.py"):
        assert dep in files
        with open(root / dep, "a") as f:
            f.write("\n# changed\n")
        assert code_fingerprint(root) != before, dep
        before = code_fingerprint(root)


@pytest.mark.parametrize("top, recipe", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_recipe_train_device_override_is_the_device_the_runs_train_on(project, monkeypatch, top, recipe):
    """A run's settings are resolved once and passed down. The `train-<sweep>` stage enters its one
    session with the sweep's resolved ``train.device`` (here a recipe override of the top level), configures
    determinism once, resolves the recipe once per (arch, variant), and its runs train on that device. It fails
    when the stage enters the session with the top-level device, or the run or the trainer enters it again."""
    import shutil

    import torch

    from dpnrepro import runs
    from dpnrepro.config.params import parse_params
    from dpnrepro.determinism import cuda as determinism
    from dpnrepro.training import distributed
    from dpnrepro.training import run as train

    if recipe == "cuda" and not torch.cuda.is_available():
        pytest.skip("a recipe's cuda override needs a CUDA device")
    p = tiny_params(**{"train.steps": 2, "runtime.ckpt_every": 2})
    p["train"]["device"] = top
    p["table1"]["recipe"] = {"train": {"device": recipe}}
    params = parse_params(p)
    sessions, switches, resolved, weights_on = [], [], [], set()
    session, configure, sweep_config, write_run = (distributed.session, determinism.configure, runs.sweep_config,
                                                   train.write_run)

    def recording_session(device_name="auto"):
        sessions.append(device_name)
        return session(device_name)

    def recording_write_run(out, model, *args):
        weights_on.update(w.device.type for w in model.parameters())
        return write_run(out, model, *args)

    monkeypatch.setattr(distributed, "session", recording_session)
    monkeypatch.setattr(determinism, "configure", lambda deterministic: switches.append(deterministic) or
                        configure(deterministic))
    monkeypatch.setattr(runs, "sweep_config", lambda *a: resolved.append(a[1:]) or sweep_config(*a))
    monkeypatch.setattr(train, "write_run", recording_write_run)
    monkeypatch.chdir(project)
    try:
        written = train.train_stage(params, "table1", progress=False)
    finally:
        for d in ("runs/table1", "checkpoints/table1"):
            shutil.rmtree(project / d, ignore_errors=True)
    assert [w.name for w in written] == ["Mu-7_conv_s0", "Mu-7_dpn_s0"]
    assert sessions == [recipe], "one entry into the session, with the run's own device"
    assert switches == [True], "determinism configured once, before the process group"
    assert resolved == [("table1", "Mu-7", "")], "the recipe resolved once, passed down to both runs"
    assert weights_on == {recipe}
