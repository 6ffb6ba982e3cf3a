"""Figures 1-4 and Table 6 reports: the patch flattening order behind Fig. 3, the reading and averaging
of the dvclive gradient-norm logs behind Figs. 2 and 4, and gains paired by seed in Table 6 / Fig. 1."""

import json

import pytest
import torch

from dpnrepro.models import build_vit, first_ln_scale_image
from dpnrepro.reports import ablations, figures


@pytest.mark.parametrize("channels,patch", [(3, 4), (1, 7)])
def test_first_ln_scale_lands_on_the_pixel_it_scales(channels, patch):
    """Give the first LN a known scale (weight[k] = k), light one pixel (row r, column s, channel c) of
    the first patch, and follow it through the model's own patchify: the feature it reaches is the one
    whose scale the Figure 3 image shows at [r, s, c]."""
    model = build_vit(f"Mu/{patch}", stem="dpn", img_size=4 * patch, in_chans=channels, num_classes=3)
    n = patch * patch * channels
    with torch.no_grad():
        model.patch_embed.norm_in.weight.copy_(torch.arange(n, dtype=torch.float32))
    image = first_ln_scale_image(model)
    assert image.shape == (patch, patch, channels)
    seen = {}
    model.patch_embed.norm_in.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    for r, s, c in [(0, 0, 0), (0, patch - 1, channels - 1), (patch - 1, 0, 0), (1, 2, channels // 2),
                    (patch - 1, patch - 1, channels - 1)]:
        x = torch.zeros(1, channels, 4 * patch, 4 * patch)
        x[0, c, r, s] = 1.0
        with torch.no_grad():
            model(x)
        first_patch = seen["x"][0, 0]
        assert first_patch.sum() == 1 and int(first_patch.argmax()) == int(image[r, s, c])
    # channel fastest: neighbouring channels of one pixel are neighbouring scale entries
    assert channels == 1 or image[0, 0, 1] - image[0, 0, 0] == 1


def save_run(run, spec, model):
    """A run directory holding ``model``'s weights and ``spec``, as training writes them."""
    from dataclasses import asdict

    from dpnrepro.artifacts import MODEL_FILE, SPEC_FILE
    from dpnrepro.training.checkpoint import save_weights

    run.mkdir(parents=True)
    save_weights(model, run / MODEL_FILE)
    (run / SPEC_FILE).write_text(json.dumps(asdict(spec)))
    return run


def mu_spec(stem, channels, patch):
    from dpnrepro.artifacts import ModelSpec

    return ModelSpec(arch=f"Mu/{patch}", stem=stem, placement="pre-pre", num_classes=3, img_size=4 * patch,
                     in_chans=channels, pool="tok", rep_size=True, head_bias_init=-2.2, pos_drop_rate=0.0,
                     proj_drop_rate=0.0, drop_path_rate=0.0)


@pytest.mark.parametrize("stem,channels,patch", [("dpn", 1, 7), ("dpn", 3, 4), ("pre", 3, 4), ("rmsnorm", 1, 7),
                                                 ("only_learnable", 3, 4)])
def test_figure3_reads_from_the_weights_file_what_the_rebuilt_model_holds(tmp_path, stem, channels, patch):
    """The figures stage reads the first norm's scale from model.safetensors (no torch, no timm): the array
    the model's own first_ln_scale_image gives once the run is rebuilt, bit for bit."""
    from dpnrepro.artifacts import load_run_model

    spec = mu_spec(stem, channels, patch)
    torch.manual_seed(0)
    model = spec.build()
    with torch.no_grad():
        model.patch_embed.norm_in.weight.normal_()  # every entry its own value
    run = save_run(tmp_path / "run", spec, model)
    got, want = figures.first_ln_scale(run), first_ln_scale_image(load_run_model(run)).numpy()
    assert got.dtype == want.dtype and got.shape == want.shape == (patch, patch, channels)
    assert (got == want).all()


def test_figure3_of_a_run_without_a_first_norm_or_with_damaged_weights_is_one_error(tmp_path):
    from dpnrepro.artifacts import MODEL_FILE
    from dpnrepro.errors import CheckpointError

    spec = mu_spec("conv", 1, 7)
    run = save_run(tmp_path / "conv", spec, spec.build())
    with pytest.raises(CheckpointError, match="holds no patch_embed.norm_in.weight of 49 values .*stem conv"):
        figures.first_ln_scale(run)
    weights = run / MODEL_FILE
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cannot read weights .*model.safetensors"):
        figures.first_ln_scale(run)
    weights.unlink()
    with pytest.raises(CheckpointError, match="does not exist; train it first"):
        figures.first_ln_scale(run)


def fake_run(root, arch, stem, seed, steps, norms):
    path = root / f"{arch}_{stem}_s{seed}"
    grad = path / figures.GRAD_DIR
    grad.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"arch": arch, "stem": stem, "seed": seed, "profile": "smoke",
                                                  "train": {"steps": steps}}))
    for layer, series in norms.items():
        (grad / f"{layer}.tsv").write_text(f"step\t{layer}\n" + "".join(f"{k}\t{v}\n" for k, v in series.items()))
    return path


def test_depth_profile_averages_the_last_steps_then_seeds(tmp_path):
    # steps 10..100 logged every 10; last_steps 30 = the logs at steps > 70: 80, 90, 100
    for seed, scale in ((0, 1.0), (1, 3.0)):
        fake_run(tmp_path, "Mu-7", "conv", seed, 100,
                  {"stem": {s: scale * s for s in range(10, 101, 10)}, "block_00": {s: 1.0 for s in range(10, 101, 10)}})
        fake_run(tmp_path, "Mu-7", "dpn", seed, 100,
                  {"stem": {s: 0.1 * scale for s in range(10, 101, 10)}, "block_00": {s: 2.0 for s in range(10, 101, 10)}})
    fake_run(tmp_path, "Mu-7", "dpn", 2, 100, {"stem": {100: 99.0}})  # no conv partner: left out
    runs = figures.sweep_runs(tmp_path)
    prof = figures.depth_profile(runs, "Mu-7", last_steps=30)
    assert prof["layers"] == ["stem", "block_00"] and prof["seeds"] == [0, 1]
    # seed 0: mean(80, 90, 100) = 90; seed 1: 270 -> mean 180
    assert prof["conv"]["stem"]["mean"] == pytest.approx(180.0)
    assert prof["dpn"]["stem"]["mean"] == pytest.approx(0.2)
    assert prof["dpn"]["block_00"] == {"mean": 2.0, "ci95": 0.0, "seeds": [2.0, 2.0]}
    curve = figures.embedding_curve(runs, "Mu-7")
    assert curve["steps"] == list(range(10, 101, 10))
    assert curve["conv"][0] == pytest.approx((10 + 30) / 2) and curve["dpn"][-1] == pytest.approx(0.2)
    with pytest.raises(Exception, match="last 5 steps"):
        fake_run(tmp_path / "x", "Mu-4", "conv", 0, 100, {"stem": {90: 1.0}})
        fake_run(tmp_path / "x", "Mu-4", "dpn", 0, 100, {"stem": {90: 1.0}})
        figures.depth_profile(figures.sweep_runs(tmp_path / "x"), "Mu-4", last_steps=5)
    assert figures.layer_label("block_11") == "Block: 11"


def _metrics(runs):
    return {"profile": "smoke", "recipe": "r", "data": {"name": "d", "train_examples": 1, "val_examples": 1},
            "runs": {f"r{i}": {**r, "hardware": "cpu"} for i, r in enumerate(runs)}}


def test_missing_logs_name_the_command_that_retrains_the_run(tmp_path):
    """`dvc repro` alone would restore the same run from its checkpoint; the advice deletes the
    run's resume state and forces the sweep's stage."""
    from dpnrepro.errors import UserError

    run = tmp_path / "runs" / "table1" / "Mu-7_conv_s0"
    (run / "dvclive").mkdir(parents=True)
    with pytest.raises(UserError, match=r"`rm -rf checkpoints/table1/Mu-7_conv_s0 && dvc repro -f -s train-table1 "
                                        r"&& dvc repro`"):
        figures.read_grad_norms(run)


def test_table6_gains_are_relative_to_dpn_and_paired_by_seed():
    runs = []
    for seed, offset in ((0, 0.0), (1, 10.0), (2, -10.0)):
        runs += [{"arch": "Mu/7", "stem": "dpn", "seed": seed, "val_top1": 70.0 + offset},
                 {"arch": "Mu/7", "stem": "pre", "seed": seed, "val_top1": 69.0 + offset + 0.01 * seed},
                 {"arch": "Mu/7", "stem": "post", "seed": seed, "val_top1": 70.0 + offset + (1, -1, 0.5)[seed]}]
    summary = ablations.summarize_table6(_metrics(runs))["Mu/7"]
    assert summary["gain_pre"]["mean"] == pytest.approx(-0.99) and summary["gain_pre"]["verdict"] == "worse"
    assert summary["gain_post"]["verdict"] == "not resolved"
    assert "gain_rmsnorm" not in summary
    md = ablations.render_table6_markdown(_metrics(runs), ablations.summarize_table6(_metrics(runs)))
    assert "| Pre | -0.1 | 0.0 | -2.6 | -0.2 | -0.3 |" in md  # the paper's row, from reports/paper/table6.yaml


def test_figure1_gains_are_over_conv_pre_ln():
    runs = [{"arch": "Mu/7", "stem": stem, "variant": v, "seed": 0, "val_top1": acc}
            for stem, v, acc in [("conv", "pre-pre", 50.0), ("conv", "post-post", 45.0), ("dpn", "pre-pre", 53.0),
                                 ("dpn", "dtn", 52.0)]]
    summary = ablations.summarize_figure1(_metrics(runs))["Mu/7"]
    assert "gain" not in summary["conv/pre-pre"]
    assert summary["conv/post-post"]["gain"]["mean"] == -5.0
    assert summary["dpn/pre-pre"]["gain"]["mean"] == 3.0
    assert summary["dpn/dtn"]["gain"]["verdict"] == "not resolved"  # one seed


def test_reports_regenerate_byte_identically(tmp_path):
    runs = [{"arch": "Mu/7", "stem": stem, "variant": v, "seed": seed, "val_top1": 50.0 + seed + 0.3 * len(v + stem)}
            for stem in ("conv", "dpn") for v in ("pre-pre", "post-post", "dtn") for seed in (0, 1)]
    t6 = [{"arch": "Mu/7", "stem": stem, "seed": seed, "val_top1": 60.0 + seed + 0.1 * len(stem)}
          for stem in ["dpn", *ablations.TABLE6_STEMS] for seed in (0, 1)]
    outs = []
    for k in range(2):
        m, r = tmp_path / f"m{k}", tmp_path / f"r{k}"
        m.mkdir()
        (m / "figure1.json").write_text(json.dumps(_metrics(runs)))
        (m / "table6.json").write_text(json.dumps(_metrics(t6)))
        outs.append([p.read_bytes() for rep in ("table6", "figure1") for p in ablations.build_report(rep, m, r)])
    assert outs[0] == outs[1] and all(outs[0])
