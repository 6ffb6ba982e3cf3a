"""The typed schema of ``params.yaml``: unknown keys, wrong types and bad values are rejected up front.

Every stage calls :func:`load_params` before doing any work, so a malformed ``params.yaml`` fails in
seconds with one line naming the key, instead of hours into a run.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Literal, NamedTuple

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpnrepro.errors import ParamsError

PROFILES = ("smoke", "mini", "full")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DataParams(_Section):
    """Which dataset, where it lives, and the train[:99%] / train[99%:] / validation protocol."""

    name: str
    format: Literal["idx", "imagefolder", "disk", "hub"]
    source: str
    train_split: str = "train"
    eval_split: str | None = Field("validation", description=(
        "the official held-out split (`val`); null = none (pretraining data, evaluated few-shot on `data`)"))
    minival_fraction: float = Field(0.01, gt=0, lt=1)
    train_examples: int = Field(0, ge=0, description="0 = all")
    minival_examples: int = Field(0, ge=0, description="0 = all")
    val_examples: int = Field(0, ge=0, description="0 = all")
    num_classes: int = Field(gt=1)
    multi_label: bool = Field(False, description=(
        "train on label sets (JFT-style, sigmoid loss): the source's `labels` column (lists of class ids), "
        "or its `label` plus `label_parents`"))
    label_parents: list[int] | None = Field(None, description=(
        "a class hierarchy: the parent class id of each source class, added as a second label "
        "(parents count in num_classes); needs multi_label"))
    skip_corrupt: bool = False
    pixel_store_side: int = Field(0, ge=0, description=(
        "0 = off; N > 0: prepare also decodes the train images once into a uint8 store, shorter side "
        "at most N px, which `input.backend: fast` trains from (data/pixel_store.py)"))
    storage: Literal["copy", "source"] = Field("copy", description=(
        "copy: the prepared splits hold the images (Arrow); source (imagefolder only, for ImageNet-scale "
        "folders): an index of relative path, label and sha256 per file, images read from data.source at "
        "training time (data/source_index.py)"))
    seed: int = 0

    @model_validator(mode="after")
    def _storage_fits(self):
        if self.storage == "source" and self.format != "imagefolder":
            raise ValueError(f"storage: source indexes an image folder; format is {self.format!r} (use copy)")
        if self.storage == "source" and self.pixel_store_side:
            raise ValueError("storage: source keeps no decoded copy; set pixel_store_side: 0 or storage: copy")
        return self

    @model_validator(mode="after")
    def _labels_consistent(self):
        if self.label_parents is not None:
            if not self.multi_label:
                raise ValueError("label_parents needs multi_label: true")
            bad = [p for p in self.label_parents if not len(self.label_parents) <= p < self.num_classes]
            if bad:
                raise ValueError(f"label_parents must be ids in [{len(self.label_parents)}, {self.num_classes}) "
                                 f"(after the {len(self.label_parents)} source classes), got {bad}")
        return self


class ExportParams(_Section):
    """The smoke profile's image folder: an idx dataset (Debian's Fashion-MNIST) written out as
    ``data/raw/imagefolder/{train,test}/<NN_class>/*.png`` by the `export_imagefolder` stage."""

    source: str
    train_per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")
    test_per_class: int = Field(0, ge=0, description="first N images of each class; 0 = all")


class InputParams(_Section):
    """Preprocessing (appendix C): inception crop + flip + RandAugment for train, resize + crop for eval."""

    image_size: int = Field(gt=0)
    channels: Literal[1, 3] = 3
    eval_resize: int = Field(gt=0)
    inception_crop: bool = True
    crop_min_area: float = Field(0.05, gt=0, le=1, description="inception crop's smallest area fraction (big_vision 0.05; DeiT 0.08)")
    crop_sampler: Literal["torchvision", "big_vision"] = Field("torchvision", description=(
        "inception crop box + resize: 'big_vision' = TF's sample_distorted_bounding_box (aspect 0.75-1.33 "
        "uniform, 100 attempts, else the whole image) + bilinear without antialias (data/crop.py); "
        "'torchvision' = RandomResizedCrop (log-uniform aspect 3/4-4/3, 10 attempts) + antialiased bilinear"))
    squash: bool = Field(False, description=(
        "without inception crop (train) and at evaluation, resize the whole frame to image_size x image_size, "
        "aspect not kept: task_adaptation's and big_vision's transfer `resize(S)` (VTAB); false: "
        "resize_small | central_crop (big_vision's ImageNet evaluation: eval_resize, then image_size)"))
    flip: bool = True
    randaug: str = Field("", description=(
        "'rand-n2-m15-tbigvision' = big_vision randaug(2, 15) (AugReg); any other timm RandAugment spec "
        "(e.g. DeiT's 'rand-m9-mstd0.5-inc1'); '' = off"))
    mixup: float = Field(0.0, ge=0, description="mixup Beta(p, p) parameter; 0 = off")
    cutmix: float = Field(0.0, ge=0, description="CutMix Beta(a, a) parameter (DeiT); 0 = off")
    mix_switch_prob: float = Field(0.5, ge=0, le=1, description="with mixup and cutmix both on: P(cutmix) per batch")
    random_erasing: float = Field(0.0, ge=0, le=1, description="random-erasing probability (DeiT); 0 = off")
    repeated_aug: int = Field(1, ge=1, description="repeated augmentation: copies of each image per batch (DeiT: 3)")
    backend: Literal["pil", "fast"] = Field("pil", description="train-time augmentation pipeline (data/loader.py)")

    @model_validator(mode="after")
    def _crop_fits(self):
        if self.eval_resize < self.image_size:
            raise ValueError(f"eval_resize ({self.eval_resize}) must be >= image_size ({self.image_size})")
        if self.squash and self.eval_resize != self.image_size:
            raise ValueError(f"squash resizes the whole frame to image_size ({self.image_size}); set eval_resize to "
                             f"it too (got {self.eval_resize}: there is no crop for a larger resize to feed)")
        return self


class ModelParams(_Section):
    """Architecture choices shared by every run (arch and stem come from the sweep)."""

    pool: Literal["tok", "gap"] = "tok"
    posemb: Literal["learn", "sincos2d"] = "learn"
    rep_size: bool | int = True
    placement: str = "pre-pre"
    block_norm: Literal["ln", "dtn"] = Field("ln", description=(
        "the blocks' residual-stream normalizer: ln (LayerNorm) or dtn (Dynamic Token Normalization)"))

    @field_validator("placement")
    @classmethod
    def _known_placement(cls, placement):
        from dpnrepro.models import PLACEMENTS

        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {placement!r}; choose one of {', '.join(PLACEMENTS)}")
        return placement
    head_bias_init: float | Literal["prior"] = Field(0.0, description=(
        "the head's initial bias; `prior` = logit(1/K) for the model's K classes (AugReg's -6.9 for 1000), "
        "so a recipe shared by tasks of different K starts every head at its class prior"))
    dropout: float = Field(0.0, ge=0, lt=1)
    stoch_depth: float = Field(0.0, ge=0, lt=1)

    def head_bias(self, num_classes: int) -> float:
        """The initial head bias of a ``num_classes``-way head (``head_bias_init`` resolved)."""
        if self.head_bias_init != "prior":
            return self.head_bias_init
        return -math.log(num_classes - 1)  # logit(1/K) = log(1/K / (1 - 1/K))


class TrainParams(_Section):
    """Optimisation (appendix C for the AugReg values)."""

    loss: Literal["sigmoid_xent", "softmax_xent"] = "sigmoid_xent"
    optimizer: Literal["adam", "adamw", "sgd_momentum"] = "adam"
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(gt=0)
    steps: int = Field(gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    grad_clip: float = Field(0.0, ge=0, description="global-norm clip; 0 = off")
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="cpu and cuda give different bits")
    deterministic: bool = Field(True, description="deterministic kernels (training/determinism.py)")

    @model_validator(mode="after")
    def _consistent(self):
        if self.warmup_steps > self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) exceeds steps ({self.steps})")
        return self


class RuntimeParams(_Section):
    """How the work is executed, not what is computed: no train stage tracks this section, and a
    checkpoint resumes across any change of it (a run started on 8 GPUs can finish on 4).

    Changing ``devices``, ``accum_steps`` or ``parallel`` regroups the sums of a step, so a run is
    equal to rounding (1e-5 relative), not bit-identical, across layouts (tests/test_distributed.py).
    """

    workers: int = Field(0, ge=0, description="data-loader worker processes")
    prepare_workers: int = Field(0, ge=0, description=(
        "processes that check and index a `data.storage: source` dataset in `prepare` (0 = one per CPU)"))
    eval_batch_size: int = Field(256, gt=0)
    log_every: int = Field(10, gt=0, description="dvclive logging cadence (steps)")
    ckpt_every: int = Field(100, gt=0, description="resumable-checkpoint cadence (steps)")
    devices: int = Field(1, gt=0, description=(
        "training processes in all (torchrun's WORLD_SIZE = nodes x nproc_per_node): a training stage "
        "started outside torchrun launches them itself (training/launch.py); checked when training starts. "
        "train.batch_size and train.steps stay the global batch and the optimizer steps"))
    nodes: int = Field(1, gt=0, description=(
        "nodes the devices are spread over (devices / nodes processes per node; rendezvous through torchrun's "
        "c10d at PET_RDZV_ENDPOINT, or srun inside a SLURM allocation)"))
    accum_steps: int = Field(1, gt=0, description=(
        "gradient-accumulation micro-steps per optimizer step; each process computes "
        "batch_size / (devices x accum_steps) examples per micro-step"))
    parallel: Literal["ddp", "fsdp"] = Field("ddp", description=(
        "with more than one process: ddp (DistributedDataParallel) or fsdp (FSDP2 fully_shard per "
        "transformer block + root, for L/16 and up)"))
    compile: bool = Field(False, description=(
        "torch.compile forward + loss as one graph (and so its backward); checkpoints keep the plain state dict"))
    cudagraphs: bool = Field(False, description=(
        "with compile, on CUDA: replay forward and backward as CUDA graphs (mode reduce-overhead), for "
        "models whose step is bound by kernel launches (Ti/16, S/16)"))

    def check_batch(self, batch_size: int) -> None:
        if batch_size % (self.devices * self.accum_steps):
            raise ValueError(f"batch_size ({batch_size}) is not divisible by devices x accum_steps "
                             f"({self.devices} x {self.accum_steps} = {self.devices * self.accum_steps})")


class ArchOverride(_Section):
    """Per-architecture recipe differences (appendix C: RandAugment/mixup per model, dropout and
    stochastic depth for B models only, no representation layer for S/32)."""

    dropout: float | None = Field(None, ge=0, lt=1)
    stoch_depth: float | None = Field(None, ge=0, lt=1)
    rep_size: bool | int | None = None
    randaug: str | None = None
    mixup: float | None = Field(None, ge=0)


class FewshotParams(_Section):
    """big_vision's fewshot_lsr evaluator: closed-form ridge on pre-logits, shots per class × draws."""

    shots: int = Field(25, gt=0)
    draws: int = Field(3, gt=0, description="independent random draws of the shots (the paper's 3 seeds)")
    l2_reg: float = Field(2.0**10, gt=0)
    train_split: str = "train"
    test_split: str = "val"
    resize: int = Field(256, gt=0, description="resize to resize x resize (aspect not kept), then central crop "
                                               "to input.image_size (big_vision: 256 -> 224)")
    pool_size: int = Field(0, ge=0, description="train examples (a fixed seeded subset) the shots are drawn "
                                                "from; 0 = all (big_vision's ImageNet pool: 65000)")


class RecipeParams(_Section):
    """How a sweep's runs are trained: the top-level ``input``/``model``/``train`` sections with these
    deltas, then the per-arch ``overrides``. The dataset and the sweep a fine-tune starts from (same
    arch/stem/seed; position embeddings resized, head re-initialised) are the sweep's :data:`SWEEPS` entry.
    """

    input: dict = Field(default_factory=dict, description="deltas to the top-level input section")
    model: dict = Field(default_factory=dict, description="deltas to the top-level model section")
    train: dict = Field(default_factory=dict, description="deltas to the top-level train section")
    overrides: dict[str, ArchOverride] = Field(default_factory=dict, description="per-arch deltas")


class SweepParams(_Section):
    """One block of a table: arch × stem × seed, trained with one recipe, evaluated one way."""

    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    recipe: RecipeParams
    variants: dict[str, dict] = Field(default_factory=dict, description=(
        "named model variants, each a delta to the model section (e.g. {post-pre: {placement: post-pre}}): "
        "every arch x stem x seed is trained once per variant (Figure 1); empty = one unnamed variant"))
    runtime: dict = Field(default_factory=dict, description=(
        "deltas to the top-level runtime section for this sweep (execution only; not tracked by DVC)"))
    fewshot: FewshotParams | None = Field(None, description="the few-shot evaluator (sweeps evaluated 25-shot)")

    @model_validator(mode="after")
    def _overrides_name_archs(self):
        unknown = sorted(set(self.recipe.overrides) - set(self.archs))
        if unknown:
            raise ValueError(f"recipe.overrides for archs not in the sweep: {unknown}")
        return self

    @field_validator("variants")
    @classmethod
    def _variants_are_model_deltas(cls, variants):
        for name, delta in variants.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.+-]*", name):
                raise ValueError(f"variant name {name!r}: letters, digits, '.', '+', '-' only (it names run directories)")
            unknown = sorted(set(delta) - set(ModelParams.model_fields))
            if unknown:
                raise ValueError(f"variant {name!r} sets {unknown}, which are not model keys")
        return variants

    @field_validator("archs")
    @classmethod
    def _dvc_safe(cls, archs):
        from dpnrepro.models import parse_arch

        for a in archs:
            if "/" in a:
                raise ValueError(f"write arch {a!r} as {a.replace('/', '-')!r} (DVC stage names cannot hold '/')")
            parse_arch(arch_name(a))  # ValueError listing the valid sizes
        return archs

    @field_validator("stems")
    @classmethod
    def _known_stems(cls, stems):
        from dpnrepro.models import STEMS

        unknown = [s for s in stems if s not in STEMS]
        if unknown:
            raise ValueError(f"unknown stem(s) {unknown}; choose from {', '.join(STEMS)}")
        return stems


class BenchmarkParams(_Section):
    """Training-throughput benchmark (stages/benchmark.py): synthetic input, no data needed."""

    archs: list[str] = Field(default_factory=lambda: ["Ti-16", "S-16", "B-16", "L-16"], min_length=1)
    stems: list[str] = Field(default_factory=lambda: ["conv", "linear", "dpn"], min_length=1)
    timm_reference: bool = True
    batch_size: int = Field(8, gt=0)
    img_size: int = Field(224, gt=0)
    warmup_steps: int = Field(2, ge=1)
    rounds: int = Field(10, ge=6)  # interleaved rounds; a 95 % CI for the median needs >= 6
    steps_per_round: int = Field(2, gt=0)  # timed steps per model per round
    seed: int = 0  # weights, synthetic batch and the per-round model order
    compile: bool = False
    cudagraphs: bool = Field(False, description="with compile, on CUDA: CUDA graphs (runtime.cudagraphs)")
    device: Literal["auto", "cpu", "cuda"] = "auto"


class FiguresParams(_Section):
    """Figures 2-4 (gradient norms from the trainer's dvclive logs) and Figure 3 (the first LN's scale),
    all from the runs of one sweep (the paper: its ImageNet-1k AugReg models)."""

    sweep: str = "table1"
    figure2_arch: str = Field("B-16", description="Fig. 2 (depth profile + embedding norm over steps): B/16 in the paper")
    figure4_archs: list[str] = Field(default_factory=lambda: ["B-32", "S-32", "S-16"],
                                     description="Fig. 4 (appendix H): the depth profile of the other archs")
    figure3_arch: str = Field("Ti-16", description="Fig. 3: the first LN's scale of this arch's dpn run (seed 0 or the first)")
    last_steps: int = Field(1000, gt=0, description="Fig. 2/4 left: mean over the logged steps in the last N steps")


class SegCanvasParams(_Section):
    """The smoke segmentation data (Table 5): canvases of real Fashion-MNIST items in the ADE20K layout,
    written to ``data/raw/seg_canvases`` by the `export_seg_canvases` stage (data/segmentation.py)."""

    source: str = Field(description="an idx dataset directory (Debian's Fashion-MNIST)")
    train_images: int = Field(gt=0)
    val_images: int = Field(gt=0)
    size: int = Field(gt=28, description="canvas side in pixels (items are 28 px)")
    items: tuple[int, int] = Field(description="fewest and most items per canvas")
    seed: int = 0

    @model_validator(mode="after")
    def _items(self):
        if not 1 <= self.items[0] <= self.items[1]:
            raise ValueError(f"items must be [min, max] with 1 <= min <= max, got {list(self.items)}")
        return self


class SegmentationParams(_Section):
    """Table 5: fine-tune a pretrained ViT per (stem, training fraction, seed) with an mmseg config file.

    The recipe is the config file's (``config``: an mmseg config inheriting mmseg's bundled ones;
    ``options`` overrides it as mmseg's ``--cfg-options`` do); the sweep and the data are params."""

    config: str = Field(description="mmseg config file (configs/segmentation/)")
    data_root: str = Field(description="ADE20K layout: images/{training,validation}, annotations/{...}")
    arch: str
    stems: list[str] = Field(min_length=1)
    fractions: list[str] = Field(min_length=1, description="of the train set, as the paper prints them: '1/16', '1'")
    seeds: list[int] = Field(min_length=1)
    pretrained_seed: int | None = Field(0, description=(
        "initialise from runs/table1/<arch>_<stem>_s<this seed> (the ImageNet-style pretraining); null = random init"))
    options: dict = Field(default_factory=dict, description="dotted-key overrides of the config file")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "cpu: fp32 on every machine (the GPUs hidden); cuda: bf16 AMP (AmpOptimWrapper); auto: cuda when visible"))

    @field_validator("stems")
    @classmethod
    def _known_stems(cls, stems):
        return SweepParams._known_stems(stems)

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, fractions):
        from dpnrepro.data.segmentation import parse_fraction

        for f in fractions:
            parse_fraction(f)
        return fractions

    @field_validator("arch")
    @classmethod
    def _arch(cls, arch):
        return SweepParams._dvc_safe([arch])[0]


class TaskSourceParams(_Section):
    """Where a VTAB task's local copy lives (transfer/sources.py) and, for the smoke profile's
    stand-ins, which real data it is (printed in the report)."""

    format: Literal["disk", "imagefolder", "hub"]
    source: str
    stand_in: str = Field("", description="'' = the task's own data; else what real data stands in for it")
    num_classes: int | None = Field(None, gt=1, description=(
        "a stand-in's class count when it has fewer classes than the task (MNIST's 10 for Sun397's 397): the "
        "head's size and the range its labels are checked against; None = the task's"))


class TransferDataParams(_Section):
    """Smoke only: the offline stand-ins the `transfer_data` stage builds (transfer/smoke_data.py), one
    DatasetDict per entry under ``out``/<name>; empty at mini/full (point the tasks at real copies)."""

    out: str = "data/transfer"
    fashion_mnist: str = "/usr/share/datasets/fashion-mnist"
    sources: dict[str, "SmokeSource"] = Field(default_factory=dict)


class SmokeSource(_Section):
    kind: str = Field(description="a builder of transfer/smoke_data.py (checked when the stage starts)")
    counts: dict[str, int] = Field(description="source split -> number of examples")
    seed: int = 0


TransferDataParams.model_rebuild()


class VtabParams(_Section):
    """Table 3: fine-tune the `table1` runs (VTAB_INIT_SWEEP) on each task with the VTAB-1k protocol:
    every lr × seed on train800, the lr chosen by mean val200 accuracy, test accuracy of that lr per seed."""

    init_seed: int = Field(0, description="which pretraining run (seed) of each arch/stem is fine-tuned")
    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seeds: list[int] = Field(min_length=1)
    lrs: list[float] = Field(min_length=1)
    retrain_on_train800val200: bool = Field(False, description=(
        "after choosing the lr, retrain on train800val200 (standard VTAB-1k) instead of reporting the "
        "train800 runs; the paper does not say which it did"))
    tasks: dict[str, TaskSourceParams] = Field(min_length=1, description=(
        "VTAB task name (transfer/tasks.py, checked when the stage starts) -> its local copy"))
    recipe: RecipeParams

    @field_validator("lrs")
    @classmethod
    def _positive(cls, lrs):
        if any(lr <= 0 for lr in lrs) or len(set(lrs)) != len(lrs):
            raise ValueError(f"lrs must be distinct and positive, got {lrs}")
        return lrs


class ScratchGrid(_Section):
    lr: list[float] = Field(min_length=1)
    weight_decay: list[float] = Field(min_length=1)
    dropout: list[float] = Field(min_length=1)


class AugGrid(_Section):
    mixup: list[float] = Field(min_length=1)
    randaug_magnitude: list[int] = Field(min_length=1, description="big_vision randaug(2, m); 0 = no RandAugment")


class ScratchParams(_Section):
    """Table 7 (appendix F): train from scratch on Sun397's train split; (1) lr × weight decay × dropout,
    (2) mixup × RandAugment magnitude, (3) the chosen setting for ``longer_steps``; each chosen on val,
    reported on test."""

    data: TaskSourceParams
    archs: list[str] = Field(min_length=1)
    stems: list[str] = Field(min_length=1)
    seed: int = 0
    grid: ScratchGrid
    aug_grid: AugGrid
    longer_steps: int = Field(gt=0)
    recipe: RecipeParams

    @model_validator(mode="after")
    def _search_sets_the_augmentation(self):
        set_here = sorted({"mixup", "randaug"} & set(self.recipe.input))
        if set_here:
            raise ValueError(f"recipe.input sets {set_here}, but the search does (appendix F: none in step 1, "
                             "aug_grid's in step 2); remove them")
        return self


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


class LitTrainParams(_Section):
    """Text-tower optimisation (big_vision LiT: Adam with decoupled weight decay, warm-up + cosine)."""

    optimizer: Literal["adam"] = "adam"
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    batch_size: int = Field(gt=1)
    steps: int = Field(gt=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    grad_clip: float = Field(0.0, ge=0, description="global-norm clip; 0 = off")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    deterministic: bool = True


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


class SweepDef(NamedTuple):
    """What a sweep is, whatever the profile: the table (or figure, e.g. ``"figure1"``) it fills, the dataset section it trains on, the
    sweep whose runs initialise it (fine-tuning) and how it is evaluated (top-1 on minival/val, or
    few-shot on `data`, whose settings are then the sweep's required ``fewshot`` params). dvc.yaml is
    generated from this table (``python -m dpnrepro.pipeline``), so adding a table block is one entry
    here plus its params."""

    table: int | str
    dataset: Literal["data", "data_i21k", "data_jft"] = "data"
    init_from: str | None = None
    evaluate: Literal["top1", "fewshot"] = "top1"
    variants: bool = False  # runs per named model variant (the sweep's `variants` params; Figure 1)

    @property
    def report(self) -> str:
        """The report the sweep feeds: ``table<N>`` or the figure's name; its stages are
        ``evaluate-<report>`` and ``<report>``."""
        return f"table{self.table}" if isinstance(self.table, int) else self.table


# The sweeps behind the tables, in dvc.yaml order. table1 is Table 1's "ViT AugReg" block. Few-shot
# sweeps (i21k_*, jft_*) are evaluated on `data` whatever they train on.
SWEEPS: dict[str, SweepDef] = {
    "table1": SweepDef(1),                                            # Table 1 left: ViT AugReg
    "splus": SweepDef(1),                                             # S/16+
    "deit": SweepDef(1),                                              # DeiT
    "ft384": SweepDef(1, init_from="table1"),                         # AugReg + 384 fine-tune
    "i21k_93k": SweepDef(1, dataset="data_i21k", evaluate="fewshot"),  # Table 1 right: 21k, 25-shot
    "i21k_930k": SweepDef(1, dataset="data_i21k", evaluate="fewshot"),
    "jft_220k": SweepDef(2, dataset="data_jft", evaluate="fewshot"),   # Table 2 left: JFT-style, 25-shot
    "jft_1100k": SweepDef(2, dataset="data_jft", evaluate="fewshot"),
    "jft_220k_ft224": SweepDef(2, init_from="jft_220k"),              # Table 2 right: fine-tunes
    "jft_220k_ft384": SweepDef(2, init_from="jft_220k"),
    "jft_1100k_ft224": SweepDef(2, init_from="jft_1100k"),
    "jft_1100k_ft384": SweepDef(2, init_from="jft_1100k"),
    "table6": SweepDef(6),                                            # Table 6: stem ablations vs DPN
    "figure1": SweepDef("figure1", variants=True),                                  # Fig. 1: in-block LN placements (+ DTN)
}


def reports() -> list[str]:
    """The reports the sweeps feed, in SWEEPS order (one evaluate stage each)."""
    return list(dict.fromkeys(d.report for d in SWEEPS.values()))


class Params(_Section):
    profile: Literal["smoke", "mini", "full"]
    export_imagefolder: ExportParams | None = None
    data: DataParams
    data_i21k: DataParams | None = Field(None, description="ImageNet-21k: the pretraining data of Table 1 right")
    data_jft: DataParams | None = Field(None, description="a large JFT-style dataset of your own: Table 2")
    input: InputParams
    model: ModelParams
    train: TrainParams
    runtime: RuntimeParams = Field(default_factory=RuntimeParams)
    table1: SweepParams
    splus: SweepParams | None = None
    deit: SweepParams | None = None
    ft384: SweepParams | None = None
    i21k_93k: SweepParams | None = None
    i21k_930k: SweepParams | None = None
    jft_220k: SweepParams | None = None
    jft_1100k: SweepParams | None = None
    jft_220k_ft224: SweepParams | None = None
    jft_220k_ft384: SweepParams | None = None
    jft_1100k_ft224: SweepParams | None = None
    jft_1100k_ft384: SweepParams | None = None
    table6: SweepParams | None = Field(None, description="Table 6: the stem ablations (gains relative to dpn)")
    figure1: SweepParams | None = Field(None, description=(
        "Figure 1: in-block norm placements (and DTN) as `variants`, gains over conv + pre-LN"))
    figures: FiguresParams = Field(default_factory=lambda: FiguresParams())
    export_seg_canvases: SegCanvasParams | None = None
    segmentation: SegmentationParams | None = Field(None, description="Table 5 (ADE20K, mmsegmentation)")
    benchmark: BenchmarkParams = Field(default_factory=BenchmarkParams)
    transfer_data: TransferDataParams = Field(default_factory=TransferDataParams)
    vtab: VtabParams | None = Field(None, description="Table 3 (transfer/vtab.py)")
    sun397_scratch: ScratchParams | None = Field(None, description="Table 7 (transfer/scratch.py)")
    lit_captions: LitCaptionsParams | None = Field(None, description="smoke: Fashion-MNIST captions from labels")
    lit: LitParams | None = Field(None, description="Table 4: LiT on locked pretraining runs")

    @model_validator(mode="after")
    def _lit_towers_exist(self):
        if self.lit is None:
            return self
        towers = self.lit.towers
        for sweep in towers.sweeps:
            sw = self.sweeps().get(sweep)
            if sw is None:
                raise ValueError(f"lit.towers.sweeps: {sweep!r} is not a sweep of this profile")
            missing = sorted(set(towers.archs) - set(sw.archs)) + sorted(set(towers.stems) - set(sw.stems)) + \
                ([f"seed {towers.seed}"] if towers.seed not in sw.seeds else [])
            if missing:
                raise ValueError(f"lit.towers: sweep {sweep} has no runs for {missing}")
        return self

    @model_validator(mode="after")
    def _sweeps_resolve(self):
        if self.data.multi_label:
            raise ValueError("data.multi_label: the evaluation dataset `data` must be single-label; "
                             "put multi-label pretraining data in data_jft or data_i21k")
        for name, sw in self.sweeps().items():
            definition = SWEEPS[name]
            if (sw.fewshot is not None) != (definition.evaluate == "fewshot"):
                raise ValueError(f"{name}.fewshot: " + ("required: the sweep is evaluated few-shot (config.SWEEPS)"
                                                        if sw.fewshot is None else "only few-shot sweeps take it"))
            if bool(sw.variants) != definition.variants:
                raise ValueError(f"{name}.variants: " + ("required (config.SWEEPS)" if definition.variants
                                                         else "this sweep takes none (config.SWEEPS)"))
            if getattr(self, definition.dataset) is None:
                raise ValueError(f"{name} trains on {definition.dataset} (config.SWEEPS) but params.yaml has no "
                                 f"{definition.dataset} section")
            if definition.init_from is not None:
                src = self.sweeps().get(definition.init_from)
                if src is None:
                    raise ValueError(f"{name} fine-tunes the runs of {definition.init_from}, which this profile "
                                     "does not define")
                missing = sorted(set(sw.archs) - set(src.archs)) + sorted(set(sw.stems) - set(src.stems)) + \
                    sorted(str(s) for s in set(sw.seeds) - set(src.seeds))
                if missing:
                    raise ValueError(f"{name} has runs its init_from sweep {definition.init_from} lacks: {missing}")
            for arch, variant in ((a, v) for a in sw.archs for v in (list(sw.variants) or [""])):
                try:
                    cfg = sweep_config(self, name, arch, variant)
                    cfg.runtime.check_batch(cfg.train.batch_size)
                except ValidationError as exc:
                    raise ValueError(f"{name} (arch {arch}): {_describe(exc)}") from None
                except ValueError as exc:
                    raise ValueError(f"{name} (arch {arch}): {exc}") from None
            if getattr(self, definition.dataset).multi_label and \
                    sweep_config(self, name, sw.archs[0]).train.loss != "sigmoid_xent":
                raise ValueError(f"{name} trains on multi-label {definition.dataset}: it needs train.loss sigmoid_xent")
        return self

    @model_validator(mode="after")
    def _figures_resolve(self):
        fig = self.figures
        src = self.sweeps().get(fig.sweep)
        if src is None:
            raise ValueError(f"figures.sweep: {fig.sweep!r} is not a sweep of this profile")
        missing = [a for a in dict.fromkeys([fig.figure2_arch, *fig.figure4_archs, fig.figure3_arch])
                   if a not in src.archs]
        if missing:
            raise ValueError(f"figures: archs {missing} are not in sweep {fig.sweep} ({', '.join(src.archs)})")
        if not {"conv", "dpn"} <= set(src.stems):
            raise ValueError(f"figures: sweep {fig.sweep} needs the conv and dpn stems (base vs DPN)")
        return self

    @model_validator(mode="after")
    def _segmentation_pretrained(self):
        seg = self.segmentation
        if seg is not None and seg.pretrained_seed is not None:
            src = self.table1
            missing = ([seg.arch] if seg.arch not in src.archs else []) + sorted(set(seg.stems) - set(src.stems)) + \
                ([f"seed {seg.pretrained_seed}"] if seg.pretrained_seed not in src.seeds else [])
            if missing:
                raise ValueError(f"segmentation starts from table1 runs that table1 does not train: {missing} "
                                 "(or set segmentation.pretrained_seed: null for a random init)")
        return self

    @model_validator(mode="after")
    def _transfer_resolves(self):
        if self.vtab is not None:
            missing = [f"{a}/{st}" for a in self.vtab.archs for st in self.vtab.stems
                       if a not in self.table1.archs or st not in self.table1.stems]
            if missing or self.vtab.init_seed not in self.table1.seeds:
                raise ValueError(f"vtab fine-tunes {VTAB_INIT_SWEEP} runs it lacks: {missing or ''} "
                                 f"seed {self.vtab.init_seed} (table1 seeds {self.table1.seeds})")
            for lr in self.vtab.lrs:
                vtab_config(self, lr)
        if self.sun397_scratch is not None:
            for arch in self.sun397_scratch.archs:
                parse_arch_checked(arch)
        return self

    def sweeps(self) -> dict[str, SweepParams]:
        """The sweeps this profile defines, in dvc.yaml order."""
        return {name: getattr(self, name) for name in SWEEPS if getattr(self, name) is not None}


def _describe(exc: ValidationError) -> str:
    """Every error of ``exc`` as ``key.path: message``, joined on one line."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def _one_line(exc: ValidationError, path: Path) -> str:
    return f"invalid {path}: {_describe(exc)}"


def parse_params(raw: dict, path: Path | str = "params.yaml") -> Params:
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(_one_line(exc, Path(path))) from None


def load_params(path: str | os.PathLike = "params.yaml") -> Params:
    """Read and validate ``params.yaml``; ParamsError (one line) on any problem."""
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path} not found; run from the repository root or copy a profile from profiles/")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{path} is not UTF-8 text (invalid byte at offset {exc.start}); re-save it as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ParamsError(f"{path} is not valid YAML{where}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path} must be a mapping of sections, got {type(raw).__name__}")
    return parse_params(raw, path)


class SweepConfig(NamedTuple):
    """The resolved recipe of one arch of a sweep."""

    data: DataParams
    input: InputParams
    model: ModelParams
    train: TrainParams
    runtime: RuntimeParams

    def recipe(self) -> dict:
        """The fully resolved recipe: everything that decides what a run computes (not runtime)."""
        return {"data": self.data.model_dump(), "input": self.input.model_dump(),
                "model": self.model.model_dump(), "train": self.train.model_dump()}


def _merge(section: _Section, delta: dict, cls: type[_Section]) -> _Section:
    return cls.model_validate({**section.model_dump(), **delta}) if delta else section


def get_sweep(params: Params, sweep: str) -> SweepParams:
    sw = params.sweeps().get(sweep)
    if sw is None:
        defined = ", ".join(params.sweeps())
        raise ParamsError(f"sweep {sweep!r} is not defined in params.yaml (defined: {defined})")
    return sw


def sweep_config(params: Params, sweep: str, arch: str, variant: str = "") -> SweepConfig:
    """Top-level sections + the sweep's deltas + the arch's overrides + the variant's model delta (validated)."""
    sw = get_sweep(params, sweep)
    if variant and variant not in sw.variants:
        raise ParamsError(f"sweep {sweep!r} has no variant {variant!r} (defined: {', '.join(sw.variants) or 'none'})")
    rc = sw.recipe
    inp = _merge(params.input, rc.input, InputParams)
    model = _merge(params.model, rc.model, ModelParams)
    train = _merge(params.train, rc.train, TrainParams)
    ov = rc.overrides.get(arch)
    if ov is not None:
        set_keys = {k: v for k, v in ov.model_dump().items() if v is not None}
        model = _merge(model, {k: v for k, v in set_keys.items() if k in ModelParams.model_fields}, ModelParams)
        inp = _merge(inp, {k: v for k, v in set_keys.items() if k in InputParams.model_fields}, InputParams)
    if variant:
        model = _merge(model, sw.variants[variant], ModelParams)
    data = getattr(params, SWEEPS[sweep].dataset)
    runtime = _merge(params.runtime, get_sweep(params, sweep).runtime, RuntimeParams)
    return SweepConfig(data, inp, model, train, runtime)


def arch_name(arch: str) -> str:
    """Params spell archs DVC-safe ('B-16'); the paper and the model registry use 'B/16'."""
    return arch.replace("-", "/")


# ---------------------------------------------------------------------------------------------------
# Transfer (Tables 3 and 7): recipes are the top-level sections plus the section's recipe deltas.

VTAB_INIT_SWEEP = "table1"  # Table 3 fine-tunes the ImageNet (AugReg) runs of Table 1


def parse_arch_checked(arch: str) -> str:
    from dpnrepro.models import parse_arch

    if "/" in arch:
        raise ValueError(f"write arch {arch!r} as {arch.replace('/', '-')!r}")
    parse_arch(arch_name(arch))
    return arch


def transfer_config(params: Params, recipe: RecipeParams, **train_delta) -> tuple[InputParams, ModelParams, TrainParams]:
    """Top-level input/model/train + ``recipe``'s deltas (+ ``train_delta``), validated."""
    try:
        return (_merge(params.input, recipe.input, InputParams), _merge(params.model, recipe.model, ModelParams),
                _merge(params.train, {**recipe.train, **train_delta}, TrainParams))
    except ValidationError as exc:
        raise ValueError(_describe(exc)) from None


def vtab_config(params: Params, lr: float) -> tuple[InputParams, ModelParams, TrainParams]:
    return transfer_config(params, params.vtab.recipe, lr=lr)
