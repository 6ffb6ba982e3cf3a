"""Table 5: ADE20K semantic segmentation through mmsegmentation and mmengine.

Importing this package registers :class:`DPNVisionTransformer` (our timm ViT family, any stem, as an
mmseg backbone) and the resumable train loop in mmseg's / mmengine's registries, which is what
mmseg config files ask for with
``custom_imports = dict(imports=['dpnrepro.segmentation'], allow_failed_imports=False)``.

  backbone.py    the registered backbone (timm ``forward_intermediates`` -> NCHW maps)
  convert.py     pretraining run (safetensors) -> backbone state dict, position embeddings resized
  datasets.py    the smoke canvases as an mmseg dataset (data: dpnrepro.data.segmentation)
  resume.py      kill/resume under torch >= 2.6 (allow-listed mmengine globals, RNG state in checkpoints)
  experiment.py  one (stem, fraction, seed) run with mmengine's Runner and mmseg's IoUMetric
  execution.py   how a run executes: DDP over the stage's processes, bf16 AMP on CUDA, per-rank seeds
  chance.py      the constant-prediction mIoU of the validation set (what learning nothing scores)
  sweep.py       every run of params' ``segmentation`` section -> runs/seg, metrics/seg.json

The mmseg config files (appendix G recipe, and the smoke scale-down inheriting it) live in the repository's
configs/segmentation/.
"""

from dpnrepro.segmentation.backbone import DPNVisionTransformer
from dpnrepro.segmentation.datasets import FashionCanvasDataset
from dpnrepro.segmentation.resume import ResumableIterBasedTrainLoop, ResumeStateHook

__all__ = ["DPNVisionTransformer", "FashionCanvasDataset", "ResumableIterBasedTrainLoop", "ResumeStateHook"]
