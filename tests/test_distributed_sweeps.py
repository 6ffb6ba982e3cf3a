"""The stages that train many runs in one process (a fine-tune sweep, Table 3's VTAB fine-tunes, Table 7's
from-scratch search) spread over ``runtime.devices: 2`` by themselves (`python stages/<stage>.py`, as
`dvc repro` runs it) and compute bit for bit what one process computes with the same split of the global
batch (``runtime.accum_steps: 2``): the same weights, the same metrics, one writer. So does the evaluate
stage: its metrics file is byte for byte the one process's."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from helpers import FMNIST, copy_project, run, tiny_params, write_params

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not FMNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make env)")]

STEPS = 4


def _params(layout: dict) -> dict:
    """tiny_params with one pretraining run (table1 Mu-7 dpn s0), its ft384 fine-tune, one VTAB task and
    Table 7's search at one cell per step, each a few steps; ``layout``: runtime settings."""
    p = tiny_params(**{f"runtime.{k}": v for k, v in layout.items()})
    p["ft384"].update(stems=["dpn"], archs=["Mu-7"], seeds=[0])
    td = p["transfer_data"]
    td["sources"] = {"mnist_digits": {"kind": "mnist_digits", "counts": {"train": 2000, "test": 128}, "seed": 0},
                     "mnist_digits_scratch": {"kind": "mnist_digits",
                                              "counts": {"train": 256, "validation": 64, "test": 64}, "seed": 1}}
    v = p["vtab"]
    v.update(stems=["dpn"], seeds=[0], lrs=[0.01], tasks={"SVHN": v["tasks"]["SVHN"]})
    v["recipe"]["train"].update(steps=STEPS, warmup_steps=1)
    s = p["sun397_scratch"]
    s.update(stems=["dpn"], grid={"lr": [0.003], "weight_decay": [0.03], "dropout": [0.0]},
             aug_grid={"mixup": [0.0], "randaug_magnitude": [0]}, longer_steps=2 * STEPS)
    s["recipe"]["train"].update(steps=STEPS, warmup_steps=1)
    for key in ("lit", "lit_captions", "segmentation", "export_seg_canvases"):
        p.pop(key, None)
    return p


# what each stage writes that must be identical: (stage command, outputs: weights files or JSON metrics)
STAGES = {
    "ft384": (["stages/train.py", "--sweep", "ft384"], ["runs/ft384"]),
    "vtab": (["stages/vtab.py"], ["checkpoints/vtab", "metrics/vtab.json"]),
    "sun397_scratch": (["stages/sun397_scratch.py"], ["checkpoints/sun397_scratch", "metrics/sun397_scratch.json"]),
}
LAYOUTS = {"two_processes": {"devices": 2}, "one_process_two_micro_batches": {"devices": 1, "accum_steps": 2}}


def _weights(root: Path, out: str) -> dict[str, bytes]:
    """The weights and optimizer state under ``out`` (relative path -> bytes). A checkpoint's
    ``rng.safetensors`` is left out: it is rank 0's generator, which draws only its own share of the
    batch (dropout, augmentation), so it is not the 1-process generator's state; what the draws
    decided is in the weights."""
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted((root / out).rglob("*.safetensors"))
            if f.name != "rng.safetensors"}


def _metrics(root: Path, out: str) -> dict:
    m = json.loads((root / out).read_text())
    m.pop("hardware")  # names the process count: the one field that may differ
    return m


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A prepared scratch project with table1 Mu-7 dpn s0 trained (1 process) and the transfer stand-ins."""
    root = copy_project(tmp_path_factory.mktemp("sweeps") / "proj")
    write_params(root, _params({"devices": 1}))
    for cmd in (["stages/prepare.py"], ["stages/train.py", "--sweep", "table1", "--arch", "Mu-7", "--stem", "dpn", "--seed", "0"], ["stages/transfer_data.py"]):
        run([sys.executable, *cmd], root)
    return root


@pytest.fixture(scope="module")
def results(pretrained):
    """Each stage run under each layout from the same pretrained state: {layout: {stage: outputs}}."""
    found = {}
    for name, layout in LAYOUTS.items():
        write_params(pretrained, _params(layout))
        found[name] = {}
        for stage, (cmd, outs) in STAGES.items():
            for out in outs:  # start each layout from nothing: no checkpoint to resume
                target = pretrained / out
                shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
            proc = run([sys.executable, *cmd], pretrained)
            found[name][stage] = {
                "stdout": proc.stdout,
                **{out: _metrics(pretrained, out) if out.endswith(".json") else _weights(pretrained, out)
                   for out in outs}}
    return found


@pytest.mark.parametrize("stage", list(STAGES))
def test_two_processes_match_one_process_bit_for_bit(results, stage):
    two, one = results["two_processes"][stage], results["one_process_two_micro_batches"][stage]
    for out in STAGES[stage][1]:
        assert two[out], f"{stage} wrote nothing under {out}"
        if isinstance(two[out], dict) and out.endswith(".json"):
            assert two[out] == one[out], f"{stage}: {out} differs between 2 processes and 1 process"
        else:
            assert two[out].keys() == one[out].keys(), f"{stage}: different files under {out}"
            differ = [k for k in two[out] if two[out][k] != one[out][k]]
            assert not differ, f"{stage}: weights differ between 2 processes and 1 process: {differ}"


def test_rank_zero_alone_reports(results):
    """Every rank trains; one line of each stage's result reaches stdout, from rank 0."""
    two = results["two_processes"]
    assert two["ft384"]["stdout"].count("trained ft384/Mu-7_dpn_s0") == 1
    assert two["vtab"]["stdout"].count("wrote metrics/vtab.json") == 1
    assert two["sun397_scratch"]["stdout"].count("wrote metrics/sun397_scratch.json") == 1


@pytest.fixture(scope="module")
def evaluated(pretrained):
    """metrics/table1.json (bytes) and stdout of `stages/evaluate.py --sweep table1` (Mu-7, conv and dpn, s0)
    under 1 and 2 processes; batches of 16, so each rank scores several batches of minival (64) and val (128)."""
    write_params(pretrained, _params({"devices": 1}))
    run([sys.executable, "stages/train.py", "--sweep", "table1", "--arch", "Mu-7", "--stem", "conv", "--seed", "0"],
        pretrained)
    found = {}
    for devices in (1, 2):
        write_params(pretrained, _params({"devices": devices, "eval_batch_size": 16}))
        (pretrained / "metrics/table1.json").unlink(missing_ok=True)
        proc = run([sys.executable, "stages/evaluate.py", "--sweep", "table1"], pretrained)
        found[devices] = (proc.stdout, (pretrained / "metrics/table1.json").read_bytes())
    return found


def test_the_evaluate_stage_spreads_over_two_processes_and_writes_the_same_bytes(evaluated):
    (one_out, one), (two_out, two) = evaluated[1], evaluated[2]
    assert [r["val_examples"] for r in json.loads(one)["runs"].values()] == [128, 128]
    assert two == one, "metrics/table1.json differs between 2 processes and 1 process"
    assert two_out.count("wrote metrics/table1.json") == 1 == one_out.count("wrote metrics/table1.json")
