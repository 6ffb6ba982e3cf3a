"""A killed `dvc repro` resumes to the same outputs, as a user meets it.

One scratch project reproduces a small Table 1 sweep, LiT on a JFT-style tower and two segmentation runs
(`dvc repro train-table1 lit_train segment`) uninterrupted. A copy runs the same command again and again
until it succeeds; in each of these stages the whole process group (`dvc` and the stage) is SIGKILLed
once, right after the first checkpoint of the stage's second run is complete (PROBE, below). The
rerun restores the first run from its complete checkpoint (DVC deleted its run directory) and resumes
the second mid-run. Every output hash in the two dvc.lock files must agree: weights, configs, run.json
and the whole dvclive history of every run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import yaml

from helpers import FMNIST, copy_project, differing_outputs, git_init, run, stage_env, tiny_params, write_params

pytestmark = pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")

TARGETS = ["train-table1", "lit_train", "segment"]
UPSTREAM = ["prepare", "train-jft_220k", "train-jft_1100k", "lit_captions", "export_seg_canvases"]

# sitecustomize of the killed project's processes (dvc's too: it only installs an import hook). It records
# every step a stage process trains (PROBE_TRACE: [run, step] per line; for train-* and LiT the steps
# whose checkpoint training/checkpoint.py's save_checkpoint wrote, for segment every mmengine iteration)
# and SIGKILLs the whole process group once the process has completed a checkpoint of a second run
# (segment: its iteration-2 checkpoint and last_checkpoint). A rerun trains no run from scratch in the
# same process before its resumed one, so it is never killed.
PROBE = """import importlib.abc, importlib.machinery, json, os, signal, sys

_runs = []


def _trained(run, step, checkpoint):
    with open(os.environ["PROBE_TRACE"], "a") as f:
        f.write(json.dumps([os.path.relpath(run), step]) + "\\n")
    if checkpoint and run not in _runs:
        _runs.append(run)
    if len(_runs) == 2:
        os.killpg(os.getpgid(0), signal.SIGKILL)


def _patch_checkpoint(module):
    save = module.save_checkpoint

    def save_checkpoint(ckpt_dir, **kw):
        save(ckpt_dir, **kw)
        _trained(str(ckpt_dir), kw["step"], True)

    module.save_checkpoint = save_checkpoint


def _patch_resume(module):
    run_iter = module.ResumableIterBasedTrainLoop.run_iter

    def patched(self, data_batch):
        run_iter(self, data_batch)  # with its after_train_iter hooks: the checkpoint of every 2nd iteration
        _trained(self.runner.work_dir, self._iter, self._iter % 2 == 0)

    module.ResumableIterBasedTrainLoop.run_iter = patched


PATCHES = {"dpnrepro.training.checkpoint": _patch_checkpoint, "dpnrepro.segmentation.resume": _patch_resume}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        spec = importlib.machinery.PathFinder.find_spec(name, path) if name in PATCHES else None
        if spec is not None:
            exec_module = spec.loader.exec_module

            def patched(module):
                exec_module(module)
                PATCHES[name](module)

            spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _Finder())
"""
# The steps each run trains uninterrupted: (first run, second run) of each stage, in training order.
RUNS = {"train-table1": (("checkpoints/table1/Mu-7_conv_s0", "checkpoints/table1/Mu-7_dpn_s0"), [4, 8, 12]),
        "lit_train": (("checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s0", "checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s1"),
                      [4, 8]),
        "segment": (("checkpoints/seg/Mu-7_dpn_f1_s0", "checkpoints/seg/Mu-7_dpn_f1_s1"), [1, 2, 3, 4])}


# The run directory the killed second run of a stage would write when complete: absent after the kill.
RUN_DIR_OF_SECOND = {"train-table1": "runs/table1/Mu-7_dpn_s0"}


def _params() -> dict:
    p = tiny_params(**{"train.steps": 12, "runtime.ckpt_every": 4})
    p["export_imagefolder"] = None  # the idx files directly (tiny_params)
    for body in p.values():  # one run per other sweep (the JFT-style towers LiT locks)
        if isinstance(body, dict) and "stems" in body and "archs" in body:
            body["stems"] = ["dpn"]
    p["table1"]["stems"] = ["conv", "dpn"]
    p["lit_captions"]["per_class"] = 8
    p["lit"]["towers"] = {"sweeps": ["jft_220k"], "archs": ["Mu-7"], "stems": ["dpn"], "seed": 0}
    p["lit"]["seeds"] = [0, 1]
    p["lit"]["train"].update(batch_size=16, steps=8, warmup_steps=1)
    p["export_seg_canvases"].update(train_images=12, val_images=3)
    p["segmentation"].update(stems=["dpn"], fractions=["1"], seeds=[0, 1], pretrained_seed=0, options={
        "train_cfg.max_iters": 4, "param_scheduler.0.end": 4, "default_hooks.checkpoint.interval": 2,
        "train_dataloader.batch_size": 4})
    return p


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    """The project with every stage upstream of TARGETS reproduced (data, the JFT-style towers)."""
    root = copy_project(tmp_path_factory.mktemp("resume") / "upstream")
    write_params(root, _params())
    (root / "dvc.lock").unlink()  # the lock records only what this project reproduces
    git_init(root)
    run(["dvc", "repro", *UPSTREAM], root)
    return root


def _repro_until_done(root, probe, attempts: int = 6) -> tuple[list[str], list[str], dict[str, list]]:
    """`dvc repro TARGETS` again and again until it succeeds, with PROBE: every attempt's output, the stage
    each killed attempt was running, and {run: [(attempt, step), ...]} of every step trained."""
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    trace = probe / "trace.jsonl"
    env = dict(stage_env(), PROBE_TRACE=str(trace))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), env.get("PYTHONPATH")]))
    logs, killed, trained = [], [], {}
    for attempt in range(attempts):
        trace.write_text("")
        times = probe / f"stages_{attempt}.json"  # each stage started, its seconds once done
        proc = subprocess.run([sys.executable, "-m", "dpnrepro.dvc_graph", "repro", "--times", str(times), *TARGETS],
                              cwd=root, env=env, capture_output=True, text=True,
                              start_new_session=True, timeout=600)  # its own process group, as a shell job
        logs.append(f"{proc.stdout}{proc.stderr}\n[attempt {attempt}: exit {proc.returncode}]\n")
        for line in trace.read_text().splitlines():
            run_path, step = json.loads(line)
            trained.setdefault(run_path, []).append((attempt, step))
        if proc.returncode == 0:
            return logs, killed, trained
        assert proc.returncode == -signal.SIGKILL, logs[-1][-3000:]
        started = json.loads(times.read_text())
        killed.append(next(name for name, seconds in started.items() if seconds is None))
        if killed[-1] in RUN_DIR_OF_SECOND:  # killed mid-run: its checkpoint kept (persist), no run directory
            left = root / RUN_DIR_OF_SECOND[killed[-1]]
            assert not left.exists(), f"the killed run left {left.relative_to(root)} behind"
    raise AssertionError(f"no success in {attempts} attempts:\n" + "\n".join(logs)[-4000:])


@pytest.mark.slow
def test_killed_repro_resumes_to_the_uninterrupted_outputs(upstream, tmp_path):
    reference = tmp_path / "reference"
    shutil.copytree(upstream, reference, symlinks=True)
    run(["dvc", "repro", *TARGETS], reference)

    killed = tmp_path / "killed"
    shutil.copytree(upstream, killed, symlinks=True)
    logs, stages, trained = _repro_until_done(killed, tmp_path / "probe")
    print("\n".join(logs)[-3000:])
    assert sorted(stages) == sorted(TARGETS), "one kill per stage, then a complete run"
    for (first, second), steps in RUNS.values():
        # every step trained once: the first run in one attempt (its rerun restores it from its complete
        # checkpoint), the second in two (killed after its first checkpoint, then resumed from it)
        assert [s for _, s in trained[first]] == steps and len({a for a, _ in trained[first]}) == 1, trained
        assert [s for _, s in trained[second]] == steps and len({a for a, _ in trained[second]}) == 2, trained
    log = "\n".join(logs)
    for expected in ("resuming from checkpoints/table1/Mu-7_conv_s0 at step 12/12",
                     "resuming from checkpoints/table1/Mu-7_dpn_s0 at step 4/12",
                     "from checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s0 at step 8/8",
                     "from checkpoints/lit/jft_220k/Mu-7_dpn_s0/lit_s1 at step 4/8"):
        assert expected in log, expected

    ours = yaml.safe_load((killed / "dvc.lock").read_text())
    theirs = yaml.safe_load((reference / "dvc.lock").read_text())
    assert set(ours["stages"]) == set(theirs["stages"]) == {*UPSTREAM, *TARGETS, "export_imagefolder"}
    assert differing_outputs(ours, theirs) == []
