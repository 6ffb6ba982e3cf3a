"""Run artifacts, in one place: where a run lives, what it holds, and how it is written and read back.

A run directory ``runs/<sweep>/<arch>_<stem>_s<seed>/`` (``<arch>_<stem>_<variant>_s<seed>`` in a sweep
with model variants, Figure 1) holds
  ``model.safetensors``  the weights (safetensors only: no pickles anywhere),
  ``model_spec.json``    the :class:`ModelSpec` that rebuilds the model,
  ``config.json``        the fully resolved recipe it was trained with (data, input, model, train),
  ``run.json``           a summary (arch, stem, seed, profile, hardware, ...),
  ``dvclive/``           the training logs.
Evaluation, fine-tuning and reports read runs through this module, never through the trainer.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dpnrepro.errors import CheckpointError

if TYPE_CHECKING:  # annotations only: reading a run's JSON files does not load torch
    import torch

MODEL_FILE = "model.safetensors"
SPEC_FILE = "model_spec.json"
CONFIG_FILE = "config.json"
SUMMARY_FILE = "run.json"


def run_name(arch: str, stem: str, seed: int, variant: str = "") -> str:
    return f"{arch}_{stem}_{variant}_s{seed}" if variant else f"{arch}_{stem}_s{seed}"


def run_dir(sweep: str, arch: str, stem: str, seed: int, variant: str = "") -> Path:
    return Path("runs") / sweep / run_name(arch, stem, seed, variant)


def checkpoint_dir(sweep: str, arch: str, stem: str, seed: int, variant: str = "") -> Path:
    """The resumable training state of a run (a persistent DVC output, not cached)."""
    return Path("checkpoints") / sweep / run_name(arch, stem, seed, variant)


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a model with :func:`dpnrepro.models.build_vit` (``timm.create_model``).

    Dropout fields use timm's names: big_vision's ``dropout`` is ``pos_drop_rate`` (after the position
    embedding) plus ``proj_drop_rate`` (attention output and MLP); there is no head dropout.
    """

    arch: str
    stem: str
    placement: str
    num_classes: int
    img_size: int
    in_chans: int
    pool: str
    rep_size: int | bool
    head_bias_init: float
    pos_drop_rate: float
    proj_drop_rate: float
    drop_path_rate: float
    posemb: str = "learn"
    block_norm: str = "ln"

    def build(self) -> torch.nn.Module:
        from dpnrepro.models import build_vit

        kw = asdict(self)
        arch = kw.pop("arch")
        return build_vit(arch, **kw)

    @classmethod
    def from_json(cls, path: str | Path) -> "ModelSpec":
        kw = json.loads(Path(path).read_text())
        if "drop_rate" in kw:  # specs written before the timm names: drop_rate was big_vision's dropout
            rate = kw.pop("drop_rate")
            kw.setdefault("pos_drop_rate", rate)
            kw.setdefault("proj_drop_rate", rate)
        return cls(**kw)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


def save_weights(model: torch.nn.Module, path: str | Path) -> None:
    """Save a model's state dict as safetensors, atomically.

    No header metadata: safetensors writes it in hash order, which would make the bytes (and so the DVC
    hash) of identical weights differ between runs. The spec is in ``SPEC_FILE``.
    """
    from safetensors.torch import save_file

    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(state, str(tmp))
    tmp.replace(path)


def read_weights(path: str | Path, keys=None, framework: str = "pt") -> dict:
    """The tensors of a ``.safetensors`` file (only ``keys`` where given, those of them it holds), with a
    one-line error for a missing or unreadable one. ``framework``: safetensors' ``"pt"`` (torch tensors) or
    ``"numpy"`` (arrays, for a reader that does not load torch)."""
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; train it first (`dvc repro`) or `dvc pull` it")
    if path.suffix != ".safetensors":
        raise CheckpointError(f"refusing to load {path}: only .safetensors checkpoints are accepted")
    try:
        with safe_open(str(path), framework=framework) as f:
            if keys is None:
                return f.get_tensors()  # what safetensors.torch.load_file returns
            return {k: f.get_tensor(k) for k in keys if k in f.keys()}
    except Exception as exc:  # truncated / not a safetensors file
        raise CheckpointError(f"cannot read weights {path} ({type(exc).__name__}: {exc})") from exc


def state_mismatch(own: dict, state: dict, skip=(), any_shape=()) -> str | None:
    """What keeps ``state`` from loading into a model whose state dict is ``own`` (None if nothing):
    missing or unexpected keys, or a shape difference. ``skip`` keys are ignored; ``any_shape`` keys may
    differ in shape (e.g. position embeddings that get resampled)."""
    missing = sorted(k for k in own if k not in state and k not in skip)
    unexpected = sorted(k for k in state if k not in own and k not in skip)
    wrong = sorted(k for k in set(own) & set(state)
                   if k not in skip and k not in any_shape and own[k].shape != state[k].shape)
    if missing:
        return f"missing {missing[:3]}"
    if unexpected:
        return f"unexpected {unexpected[:3]}"
    if wrong:
        return f"shape of {wrong[0]} is {tuple(state[wrong[0]].shape)}, model has {tuple(own[wrong[0]].shape)}"
    return None


def load_weights(model: torch.nn.Module, path: str | Path) -> torch.nn.Module:
    """Load safetensors weights, refusing a checkpoint of another architecture with a clear message."""
    state = read_weights(path)
    detail = state_mismatch(model.state_dict(), state)
    if detail:
        raise CheckpointError(
            f"checkpoint {path} does not match this architecture ({detail}); "
            "check the arch/stem/placement it was trained with"
        )
    model.load_state_dict(state)
    return model


def read_spec(run_path: str | Path) -> ModelSpec:
    run_path = Path(run_path)
    if not (run_path / SPEC_FILE).exists():
        raise CheckpointError(f"{run_path} has no {SPEC_FILE}; is it a run directory (`runs/<sweep>/<run>`)?")
    return ModelSpec.from_json(run_path / SPEC_FILE)


def load_run_model(run_path: str | Path) -> torch.nn.Module:
    """Rebuild a trained run from its directory: spec + safetensors weights."""
    run_path = Path(run_path)
    return load_weights(read_spec(run_path).build(), run_path / MODEL_FILE)


def read_summary(run_path: str | Path) -> dict:
    return json.loads((Path(run_path) / SUMMARY_FILE).read_text())


def head_bias_text(head_bias_init: float | str, num_classes: int | None = None) -> str:
    """A recipe's initial head bias as the reports print it: the number, or ``prior`` (logit(1/K)), resolved
    for ``num_classes`` where a run's K is known (``config.core.ModelParams.head_bias``)."""
    if head_bias_init != "prior":
        return f"{head_bias_init:g}"
    if num_classes is None:
        return "logit(1/K), K the task's classes"
    return f"logit(1/{num_classes}) = {-math.log(num_classes - 1):.3g}"


def describe_recipe(config: dict) -> str:
    """One line saying how a run was trained, from its resolved ``config.json`` (reports print it)."""
    t, i, m, d = config["train"], config["input"], config["model"], config["data"]
    smoothing = f", smoothing {t['label_smoothing']:g}" if t["label_smoothing"] else ""
    text = (f"{t['optimizer']} lr {t['lr']:g}, wd {t['weight_decay']:g}, batch {t['batch_size']}, {t['steps']} steps "
            f"({t['warmup_steps']} warm-up, {t['schedule']}), clip {t['grad_clip']:g}, {t['loss']}"
            f"{smoothing}, {i['image_size']}px, "
            f"pool {m['pool']}, posemb {m['posemb']}, head bias {head_bias_text(m['head_bias_init'], d['num_classes'])}")
    aug = [f"randaug {i['randaug']}" if i["randaug"] else "", f"mixup {i['mixup']:g}" if i["mixup"] else "",
           f"cutmix {i['cutmix']:g}" if i["cutmix"] else "",
           f"erasing {i['random_erasing']:g}" if i["random_erasing"] else "",
           f"repeats {i['repeated_aug']}" if i["repeated_aug"] > 1 else "",
           f"stoch. depth {m['stoch_depth']:g}" if m["stoch_depth"] else "",
           f"dropout {m['dropout']:g}" if m["dropout"] else ""]
    aug = [a for a in aug if a]
    text += f"; {', '.join(aug)}" if aug else "; no augmentation beyond crop/flip"
    if config["dataset"] != "data":
        text += (f"; trained on `{config['dataset']}`: {d['name']} ({'multi-label, ' if d.get('multi_label') else ''}"
                 f"{d['num_classes']} classes)")
    return text


def read_config(run_path: str | Path) -> dict:
    return json.loads((Path(run_path) / CONFIG_FILE).read_text())


def write_run(out: Path, model: torch.nn.Module, spec: ModelSpec, config: dict, summary: dict) -> None:
    """Write the files of a run directory ``out`` (already a temporary directory of ``atomic_dir``)."""
    from dpnrepro.io import write_json_atomic

    save_weights(model, out / MODEL_FILE)
    (out / SPEC_FILE).write_text(spec.to_json())
    write_json_atomic(out / CONFIG_FILE, config)
    write_json_atomic(out / SUMMARY_FILE, summary)
