"""params.yaml schema: the repo's file validates; every kind of mistake is one ParamsError line naming it."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from dpnrepro.config.core import arch_name
from dpnrepro.config.sweeps import SWEEPS
from dpnrepro.config.params import Params, load_params, parse_params
from dpnrepro.errors import ParamsError, UserError

PARAMS = REPO / "params.yaml"


def _raw() -> dict:
    return yaml.safe_load(PARAMS.read_text())


def _write(tmp_path, raw: dict):
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _error(tmp_path, raw: dict) -> str:
    with pytest.raises(ParamsError) as info:
        load_params(_write(tmp_path, raw))
    msg = str(info.value)
    assert "\n" not in msg, "a params error must be one line"
    return msg


def test_repo_params_validate():
    params = load_params(PARAMS)
    assert isinstance(params, Params)
    raw = _raw()
    assert params.profile == raw["profile"]
    assert params.train.lr == raw["train"]["lr"]
    assert params.train.batch_size == raw["train"]["batch_size"]
    assert params.data.num_classes == raw["data"]["num_classes"]
    assert all("/" not in a for a in params.table1.archs)
    assert all("/" in arch_name(a) for a in params.table1.archs)
    assert params.train.batch_size % params.runtime.devices == 0
    assert params.train.warmup_steps <= params.train.steps


def test_params_are_immutable():
    params = load_params(PARAMS)
    with pytest.raises(Exception):
        params.train.lr = 1.0  # frozen: a stage cannot silently diverge from the validated file


def test_params_error_is_user_error():
    assert issubclass(ParamsError, UserError)  # the stage decorator turns it into `error: ...`, exit 2


def test_unknown_top_level_key(tmp_path):
    raw = _raw()
    raw["trainn"] = {"lr": 1.0}
    msg = _error(tmp_path, raw)
    assert "trainn" in msg and "unknown key" in msg


def test_unknown_nested_key(tmp_path):
    raw = _raw()
    raw["train"]["lrr"] = 0.1
    msg = _error(tmp_path, raw)
    assert "train.lrr: unknown key" in msg


def test_wrong_type(tmp_path):
    raw = _raw()
    raw["train"]["batch_size"] = "abc"
    msg = _error(tmp_path, raw)
    assert "train.batch_size" in msg
    assert "unknown key" not in msg


def test_input_backend_is_pil_or_fast(tmp_path):
    raw = _raw()
    raw["input"]["backend"] = "gpu"
    msg = _error(tmp_path, raw)
    assert msg.endswith("input.backend: Input should be 'pil' or 'fast'"), msg


def test_negative_lr(tmp_path):
    raw = _raw()
    raw["train"]["lr"] = -0.001
    msg = _error(tmp_path, raw)
    assert "train.lr" in msg and "greater than 0" in msg


def test_warmup_longer_than_training(tmp_path):
    raw = _raw()
    raw["train"]["warmup_steps"] = raw["train"]["steps"] + 1
    msg = _error(tmp_path, raw)
    assert "warmup_steps" in msg and "exceeds steps" in msg


def test_batch_not_divisible_by_devices(tmp_path):
    raw = _raw()
    raw["train"]["batch_size"] = 10
    raw["runtime"]["devices"] = 4
    msg = _error(tmp_path, raw)
    assert "not divisible" in msg and "devices" in msg


def test_execution_settings_live_in_runtime_not_train(tmp_path):
    raw = _raw()
    raw["train"]["eval_batch_size"] = 64
    assert "train.eval_batch_size: unknown key" in _error(tmp_path, raw)
    raw = _raw()
    raw["splus"]["runtime"] = {"log_every": 3}
    from dpnrepro.config.sweeps import sweep_config

    params = parse_params(raw)
    assert sweep_config(params, "splus", "Mu-7").runtime.log_every == 3
    assert sweep_config(params, "deit", "Mu-7").runtime.log_every == params.runtime.log_every


def test_arch_with_slash_is_refused(tmp_path):
    raw = _raw()
    raw["table1"]["archs"] = ["Mu/4"]
    msg = _error(tmp_path, raw)
    assert "table1.archs" in msg and "'Mu-4'" in msg


def test_missing_section(tmp_path):
    raw = _raw()
    del raw["train"]
    msg = _error(tmp_path, raw)
    assert "train" in msg and "Field required" in msg


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "params.yaml"
    text = yaml.safe_dump(_raw(), sort_keys=False).splitlines()  # plain block style, whatever the profile
    text.insert(10, "\tbad: 1")  # becomes line 11 (1-based): a tab cannot start a YAML token
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(ParamsError) as info:
        load_params(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert str(path) in msg and "not valid YAML at line 11:" in msg


def test_malformed_yaml_exact_line(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\ndata:\n  name: x\n   bad_indent: 1\n")
    with pytest.raises(ParamsError, match=r"at line 4\b"):
        load_params(path)


def test_non_utf8_params_is_a_params_error(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"# caf\xe9 (latin-1, as an old editor saves it)\n" + PARAMS.read_bytes())
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_not_a_mapping(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ParamsError, match="must be a mapping"):
        load_params(path)


def test_missing_file(tmp_path):
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")


def test_stage_with_malformed_params_exits_2_and_writes_nothing(tmp_path):
    (tmp_path / "params.yaml").write_text("profile: smoke\ndata: [unclosed\n")
    proc = subprocess.run([sys.executable, str(REPO / "stages" / "prepare.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and "params.yaml" in lines[0] and "line" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # no data/, no temp dirs


def test_sweep_recipes_merge_validate_and_check_init_from():
    from dpnrepro.config.sweeps import sweep_config

    raw = _raw()
    raw["deit"] = {"archs": ["Mu-7"], "stems": ["conv"], "seeds": [0],
                   "recipe": {"train": {"optimizer": "adamw", "lr": 5e-4}, "input": {"cutmix": 1.0}}}
    params = parse_params(raw)
    c = sweep_config(params, "deit", "Mu-7")
    assert (c.train.optimizer, c.train.lr, c.input.cutmix) == ("adamw", 5e-4, 1.0)
    assert c.train.steps == params.train.steps and c.data == params.data  # the rest is inherited
    bad = _raw()
    bad["deit"] = {"archs": ["Mu-7"], "stems": ["conv"], "seeds": [0], "recipe": {"train": {"lrr": 1}}}
    with pytest.raises(ParamsError, match="lrr"):
        parse_params(bad)
    bad["deit"]["recipe"] = {"train": {"lr": -1.0}}
    with pytest.raises(ParamsError, match="greater than 0"):
        parse_params(bad)
    bad["deit"]["recipe"] = {"init_from": "table1"}  # the dataset and init_from are config.sweeps.SWEEPS's
    with pytest.raises(ParamsError, match="deit.recipe.init_from: unknown key"):
        parse_params(bad)
    bad = _raw()
    bad["ft384"]["seeds"] = [99]
    with pytest.raises(ParamsError, match="ft384 has runs its init_from sweep table1 lacks"):
        parse_params(bad)
    bad = _raw()
    bad["data_i21k"] = None
    with pytest.raises(ParamsError, match="i21k_93k trains on data_i21k .* has no data_i21k section"):
        parse_params(bad)
    bad = _raw()
    bad["deit"] = {"archs": ["Mu-7"], "stems": ["conv"], "seeds": [0]}
    with pytest.raises(ParamsError, match="recipe"):
        parse_params(bad)


def test_multi_label_data_is_validated():
    raw = _raw()
    assert raw["data_jft"]["multi_label"] and SWEEPS["jft_220k"].dataset == "data_jft"
    bad = _raw()
    bad["data_jft"]["multi_label"] = False
    with pytest.raises(ParamsError, match="label_parents needs multi_label"):
        parse_params(bad)
    bad = _raw()
    bad["data_jft"]["label_parents"][0] = 3  # a parent must come after the source's classes
    with pytest.raises(ParamsError, match=r"label_parents must be ids in \[10, 14\).*\[3\]"):
        parse_params(bad)
    bad = _raw()
    bad["data"]["multi_label"] = True
    with pytest.raises(ParamsError, match="`data` must be single-label"):
        parse_params(bad)
    bad = _raw()
    bad["jft_220k"]["recipe"]["train"]["loss"] = "softmax_xent"
    with pytest.raises(ParamsError, match="jft_220k trains on multi-label data_jft: it needs train.loss sigmoid_xent"):
        parse_params(bad)


def test_sweep_variants_are_model_deltas_with_safe_names():
    """Figure 1's sweep trains every arch x stem x seed once per named model variant."""
    from dpnrepro.artifacts import run_dir, run_name
    from dpnrepro.config.sweeps import sweep_config
    from dpnrepro.runs import sweep_runs
    from dpnrepro.training.run import model_spec

    params = load_params(PARAMS)
    assert SWEEPS["figure1"].variants and not SWEEPS["table6"].variants
    c = sweep_config(params, "figure1", "Mu-7", "post-prepost")
    assert (c.model.placement, c.model.block_norm) == ("post-prepost", "ln")
    assert sweep_config(params, "figure1", "Mu-7", "dtn").model.block_norm == "dtn"
    assert model_spec(sweep_config(params, "figure1", "Mu-7", "dtn"), "Mu-7", "dpn").block_norm == "dtn"
    runs = sweep_runs(params, "figure1")
    sw = params.figure1
    assert len(runs) == len(sw.archs) * len(sw.stems) * len(sw.seeds) * len(sw.variants)
    assert {v for *_, v in runs} == set(sw.variants) and {v for *_, v in sweep_runs(params, "table1")} == {""}
    assert run_name("Mu-7", "dpn", 0) == "Mu-7_dpn_s0"  # sweeps without variants keep their names
    assert str(run_dir("figure1", "Mu-7", "dpn", 0, "post-pre")) == "runs/figure1/Mu-7_dpn_post-pre_s0"
    with pytest.raises(ParamsError, match="no variant 'nope'"):
        sweep_config(params, "figure1", "Mu-7", "nope")
    for bad_variants, match in [({"x": {"placment": "post-pre"}}, "not model keys"),
                                ({"a/b": {"placement": "post-pre"}}, "names run directories"),
                                ({"x": {"placement": "sideways"}}, "unknown placement"),
                                ({"x": {"block_norm": "bn"}}, "block_norm")]:
        raw = _raw()
        raw["figure1"]["variants"] = bad_variants
        with pytest.raises(ParamsError, match=match):
            parse_params(raw)
    raw = _raw()
    raw["table6"]["variants"] = {"x": {}}
    with pytest.raises(ParamsError, match="takes none"):
        parse_params(raw)
    raw = _raw()
    raw["figures"]["figure2_arch"] = "Ti-16"
    with pytest.raises(ParamsError, match=r"figures: archs \['Ti-16'\]"):
        parse_params(raw)


def test_every_profile_defines_the_ablation_sweeps():
    for path in sorted((REPO / "profiles").glob("*.yaml")):
        params = load_params(path)
        assert set(params.table6.stems) == {"dpn", "pre", "post", "post_posemb", "only_learnable", "rmsnorm",
                                            "no_learnable"}, path
        placements = {d.get("placement", "pre-pre") for d in params.figure1.variants.values()}
        from dpnrepro.models import PLACEMENTS

        assert placements == set(PLACEMENTS), path
        assert {d.get("block_norm", "ln") for d in params.figure1.variants.values()} == {"ln", "dtn"}, path
        assert set(params.figure1.stems) == {"conv", "dpn"}, path
    full = load_params(REPO / "profiles/full.yaml")
    assert full.table6.archs == ["B-16", "S-16", "B-32", "S-32", "Ti-16"]  # Table 6's columns
    assert full.figure1.archs == ["S-16", "B-16", "B-32", "Ti-16", "S-32"]  # Figure 1's x axis
    assert (full.figures.figure2_arch, full.figures.figure4_archs, full.figures.figure3_arch) == \
        ("B-16", ["B-32", "S-32", "S-16"], "Ti-16")  # Sec. 8.1, appendix H, Sec. 8.2
    assert full.table6.recipe.overrides == full.table1.recipe.overrides  # the AugReg block's recipe


def test_the_schema_has_one_field_per_sweep_definition():
    """Adding a sweep is one SWEEPS entry plus its params section: Params follows the mapping."""
    from dpnrepro.config.params import SECTIONS

    fields = list(Params.model_fields)
    assert [f for f in fields if f in SWEEPS] == list(SWEEPS)
    assert not set(SWEEPS) & set(SECTIONS)


def test_the_evaluators_are_one_registry_that_the_schema_and_checks_follow():
    """Adding an evaluator is its module, one EVALUATORS line and its params: the sweep schema gains its
    section, the checks require it exactly on the sweeps it evaluates, and its module has the shared interface."""
    import importlib

    from dpnrepro.config.sweeps import EVALUATORS, SweepParams
    from dpnrepro.evaluation.base import RunEvaluator

    assert {d.evaluate for d in SWEEPS.values()} <= set(EVALUATORS)
    assert [f for f in SweepParams.model_fields if f in EVALUATORS] == \
        [name for name, ev in EVALUATORS.items() if ev.params is not None] == ["fewshot"]
    for ev in EVALUATORS.values():
        assert issubclass(importlib.import_module(ev.module).Evaluator, RunEvaluator), ev.module
    bad = _raw()
    bad["table1"]["fewshot"] = bad["i21k_93k"]["fewshot"]
    with pytest.raises(ParamsError, match=r"table1\.fewshot: only few-shot sweeps take it$"):
        parse_params(bad)
    bad = _raw()
    del bad["i21k_93k"]["fewshot"]
    with pytest.raises(ParamsError, match=r"i21k_93k\.fewshot: required: the sweep is evaluated few-shot "
                                          r"\(config\.sweeps\.SWEEPS\)$"):
        parse_params(bad)


def test_lit_train_is_the_train_sections_fields_adam_only_and_two_captions_a_batch(tmp_path):
    """LiT's text-tower optimisation shares the train section's keys, defaults and checks (one definition,
    config.core.train_fields), in its own key order; TrainParams keeps its order (dvclive logs it as is)."""
    from dpnrepro.config.core import TrainParams
    from dpnrepro.config.lit import LitTrainParams

    assert list(TrainParams.model_fields) == [
        "loss", "optimizer", "lr", "weight_decay", "batch_size", "steps", "warmup_steps", "schedule", "grad_clip",
        "label_smoothing", "device", "deterministic"]
    assert list(LitTrainParams.model_fields) == [
        "optimizer", "lr", "weight_decay", "batch_size", "steps", "warmup_steps", "schedule", "grad_clip", "device",
        "deterministic"]
    for key in set(LitTrainParams.model_fields) - {"optimizer", "batch_size"}:
        assert repr(LitTrainParams.model_fields[key]) == repr(TrainParams.model_fields[key]), key
    for key, value, message in (("lr", 0, "lit.train.lr: Input should be greater than 0"),
                                ("batch_size", 1, "lit.train.batch_size: Input should be greater than 1"),
                                ("optimizer", "adamw", "lit.train.optimizer: Input should be 'adam'"),
                                ("schedule", "step", "lit.train.schedule: Input should be 'cosine', 'linear' or 'constant'"),
                                ("loss", "softmax_xent", "lit.train.loss: unknown key"),
                                ("label_smoothing", 0.1, "lit.train.label_smoothing: unknown key")):
        raw = _raw()
        raw["lit"]["train"][key] = value
        assert _error(tmp_path, raw).endswith(message), key


@pytest.mark.parametrize("where", ["top", "sweep"])
def test_image_size_not_a_multiple_of_the_patch_is_refused(tmp_path, where):
    """Caught by the schema, naming the key, before a stage reaches timm's patch embedding."""
    raw = _raw()
    if where == "top":
        raw["input"].update(image_size=27, eval_resize=27)
        raw.pop("vtab")  # its own squash resize (eval_resize 28) would refuse 27 for another reason
    else:
        raw["ft384"]["recipe"]["input"].update(image_size=50, eval_resize=53)
    msg = _error(tmp_path, raw)
    size, sweep = (27, "table1") if where == "top" else (50, "ft384")
    assert f"{sweep} (arch Mu-7): input.image_size {size} is not a multiple of the patch size 7 of Mu-7" in msg, msg


def test_a_study_image_size_off_the_patch_grid_is_refused(tmp_path):
    """The study's cells build ViTs too: study/params.yaml is held to the same grid."""
    from dpnrepro.study.config import PARAMS_FILE, load_study_params

    raw = yaml.safe_load((PARAMS.parent / PARAMS_FILE).read_text())
    raw["study"]["recipe"]["input"].update(image_size=30, eval_resize=30)  # 30 = 6 x 5: a grid for neither 7 nor 4
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match=r"cell \S+-Mu-7-short: input\.image_size 30 is not a multiple of the patch "
                                          r"size 7 of Mu-7"):
        load_study_params(path)
