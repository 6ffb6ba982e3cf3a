"""Zero-shot classification with a two-tower model (big_vision's image-text evaluators, one file).

Two ways to turn class names into class embeddings, selected by ``classifier``:

* ``label`` (the paper's protocol, Sec. 6.2, and big_vision's ``contrastive`` evaluator with
  ``clip_i1k_label_names``): each class is its text label, embedded by the text tower.
* ``templates`` (big_vision's ``discriminative_classifier``): class names canonicalised (``_`` to
  space, punctuation removed except the ``,`` that separates aliases, lower case, whitespace squeezed)
  and cut to their first alias; each of CLIP's 80 prompt templates (open_clip's
  ``OPENAI_IMAGENET_TEMPLATES``, canonicalised the same way but keeping ``{}``) filled with the name;
  every prompt embedded and L2-normalised, the prompts of a class averaged, the mean renormalised
  (``/ (||m|| + 1e-8)``).

The prediction for an image is the class whose embedding has the largest dot product with the image's
normalised embedding (the nearest class embedding on the sphere); accuracy is top-1 in %.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Sequence

import torch

CLASSIFIERS = ("label", "templates")
NORM_EPS = 1e-8


def canonicalize(text: str, keep: str | None = None) -> str:
    """big_vision's ``prompt_engineering._canonicalize``: '_' -> ' ', punctuation removed (except the
    exact string ``keep``), lower case, runs of whitespace to one space, stripped."""
    text = text.replace("_", " ")
    strip = str.maketrans("", "", string.punctuation)
    parts = text.split(keep) if keep else [text]
    text = (keep or "").join(part.translate(strip) for part in parts)
    return re.sub(r"\s+", " ", text.lower()).strip()


def clip_templates() -> list[str]:
    """CLIP's 80 ImageNet prompt templates (as shipped by open_clip), canonicalised with ``{}`` kept."""
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES

    return [canonicalize(t("{}"), keep="{}") for t in OPENAI_IMAGENET_TEMPLATES]


def class_prompts(class_names: Sequence[str], classifier: str,
                  templates: Sequence[str] | None = None) -> tuple[list[str], list[int]]:
    """The texts embedded for each class and the class index of each text."""
    if classifier == "label":
        return list(class_names), list(range(len(class_names)))
    if classifier != "templates":
        raise ValueError(f"unknown zero-shot classifier {classifier!r}; choose one of {CLASSIFIERS}")
    templates = clip_templates() if templates is None else list(templates)
    names = [canonicalize(n, keep=",").split(",")[0].strip() for n in class_names]
    texts, labels = [], []
    for c, name in enumerate(names):
        for t in templates:
            texts.append(t.replace("{}", name))
            labels.append(c)
    return texts, labels


@torch.no_grad()
def class_embeddings(embed_texts: Callable[[list[str]], torch.Tensor], class_names: Sequence[str],
                     classifier: str, templates: Sequence[str] | None = None) -> torch.Tensor:
    """(C, D) class embeddings. ``embed_texts`` maps texts to L2-normalised (N, D) embeddings."""
    texts, labels = class_prompts(class_names, classifier, templates)
    z = embed_texts(texts).double()
    if classifier == "label":
        return z.float()
    labels = torch.tensor(labels)
    sums = torch.zeros(len(class_names), z.shape[1], dtype=torch.float64).index_add_(0, labels, z)
    mean = sums / torch.bincount(labels, minlength=len(class_names)).unsqueeze(1)
    return (mean / (torch.linalg.vector_norm(mean, dim=1, keepdim=True) + NORM_EPS)).float()


def zeroshot_top1(image_embeddings: torch.Tensor, labels: torch.Tensor, class_emb: torch.Tensor) -> float:
    """Top-1 accuracy (%) of predicting the class with the largest ``zimg @ zclass``."""
    pred = (image_embeddings.float() @ class_emb.float().T).argmax(dim=1)
    return 100.0 * float((pred == labels).double().mean())
