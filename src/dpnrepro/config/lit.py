"""The LiT sections (Table 4): the smoke caption corpus and LiT on locked pretraining runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, create_model, model_validator

from dpnrepro.config.core import _Section, train_fields


class LitCaptionsParams(_Section):
    """The smoke profile's image-caption corpus (stage `lit_captions`, lit/captions.py): Fashion-MNIST
    images captioned from their real labels (class name, parent group, WordNet gloss of the class noun)."""

    source: str
    split: str = "train"
    per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")
    parents: list[int] = Field(description="the group index of each class")
    group_names: list[str] = Field(min_length=1)
    wordnet: str = Field("/usr/share/wordnet", description="WordNet 3 dict/ (Debian wordnet-base)")
    seed: int = 0

    @model_validator(mode="after")
    def _groups_exist(self):
        bad = [p for p in self.parents if not 0 <= p < len(self.group_names)]
        if bad:
            raise ValueError(f"parents {bad} name no entry of group_names ({len(self.group_names)})")
        return self


class LitTowersParams(_Section):
    """The locked image towers: the runs (arch x stem, one pretraining seed) of pretraining sweeps."""

    sweeps: list[str] = Field(min_length=1)
    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seed: int = 0


class LitTextParams(_Section):
    """open_clip TextTransformer size (trained from scratch)."""

    width: int = Field(gt=0)
    heads: int = Field(gt=0)
    layers: int = Field(gt=0)

    @model_validator(mode="after")
    def _heads_divide(self):
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not divisible by heads {self.heads}")
        return self


class LitDataParams(_Section):
    """An image-caption corpus: a `datasets` save_to_disk directory with an image and a text column."""

    source: str
    split: str = "train"
    image_column: str = "image"
    text_column: str = "text"
    examples: int = Field(0, ge=0, description="first N rows; 0 = all")


# The train section's keys, defaults and checks (config.core.TrainParams), Adam only and at least two captions
# a batch (the contrastive loss needs negatives); no loss choice, no label smoothing
LitTrainParams = create_model(
    "LitTrainParams", __base__=_Section,
    __doc__="Text-tower optimisation (big_vision LiT: Adam with decoupled weight decay, warm-up + cosine).",
    **train_fields("optimizer", "lr", "weight_decay", "batch_size", "steps", "warmup_steps", "schedule", "grad_clip",
                   "device", "deterministic", optimizer=(Literal["adam"], "adam"), batch_size=(int, Field(gt=1))))


class LitRuntimeParams(_Section):
    """How LiT's text-tower steps are executed (no stage tracks it; processes: the top-level runtime)."""

    chunk_size: int = Field(0, ge=0, description=(
        "captions per text-tower pass (GradCache, lit/train.py): 0 = the process's whole shard of the batch "
        "in one pass; smaller bounds activation memory at one more forward per step, same result to rounding"))


class ZeroshotSetParams(_Section):
    """One labelled image set scored zero-shot (lit/data.py)."""

    format: Literal["imagefolder", "disk", "idx", "foolbox"]
    source: str
    split: str = "test"
    per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")
    class_names: Literal["imagenet", "fashion_mnist"]
    seeds: list[int] | None = Field(None, description=(
        "the LiT seeds scored on this set; null = all of lit.seeds (smoke scores its 20-photo ImageNet "
        "machinery check on one seed per tower: 80 templates x 1000 classes is most of the stage's time)"))


class ZeroshotParams(_Section):
    """Zero-shot classification (evaluation/zeroshot.py)."""

    classifiers: list[Literal["label", "templates"]] = Field(min_length=1, description=(
        "label = each class's text label (the paper); templates = big_vision's discriminative classifier "
        "(canonical names x CLIP's 80 prompts, averaged). The first is the table's headline"))
    headline: str = Field(description="the zero-shot set the table reports (ImageNet at full profile)")
    datasets: dict[str, ZeroshotSetParams] = Field(min_length=1)

    @model_validator(mode="after")
    def _headline_known(self):
        if self.headline not in self.datasets:
            raise ValueError(f"headline {self.headline!r} is not among datasets ({', '.join(self.datasets)})")
        return self


class LitParams(_Section):
    """Table 4 (Sec. 6.2): LiT on locked pretraining runs, zero-shot classification."""

    towers: LitTowersParams
    seeds: list[int] = Field(min_length=1, description="LiT runs per image tower (text-tower init, data order)")
    data: LitDataParams
    context_length: int = Field(16, gt=2, description="text tokens (big_vision LiT: token_len=16)")
    text: dict[str, LitTextParams] = Field(description="text-tower size per image-tower arch")
    temperature_init: float = Field(10.0, gt=0)
    train: LitTrainParams
    zeroshot: ZeroshotParams
    runtime: LitRuntimeParams = Field(default_factory=LitRuntimeParams)

    @model_validator(mode="after")
    def _text_for_every_arch(self):
        missing = [a for a in self.towers.archs if a not in self.text]
        if missing:
            raise ValueError(f"text: no text-tower size for arch(s) {missing}")
        for name, ds in self.zeroshot.datasets.items():
            if ds.seeds is not None and not set(ds.seeds) <= set(self.seeds):
                raise ValueError(f"zeroshot.datasets.{name}.seeds {ds.seeds} are not all among seeds {self.seeds}")
        if self.zeroshot.datasets[self.zeroshot.headline].seeds not in (None, self.seeds):
            raise ValueError("zeroshot: the headline set must be scored on every LiT seed (seeds: null)")
        if self.train.warmup_steps > self.train.steps:
            raise ValueError(f"train.warmup_steps ({self.train.warmup_steps}) exceeds steps ({self.train.steps})")
        return self

    def check(self, params) -> None:
        """Against the rest of params.yaml (:func:`dpnrepro.config.params.parse_params`)."""
        towers = self.towers
        for sweep in towers.sweeps:
            sw = params.sweeps().get(sweep)
            if sw is None:
                raise ValueError(f"lit.towers.sweeps: {sweep!r} is not a sweep of this profile")
            missing = sorted(set(towers.archs) - set(sw.archs)) + sorted(set(towers.stems) - set(sw.stems)) + \
                ([f"seed {towers.seed}"] if towers.seed not in sw.seeds else [])
            if missing:
                raise ValueError(f"lit.towers: sweep {sweep} has no runs for {missing}")

