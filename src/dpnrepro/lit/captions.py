"""The smoke profile's image-caption corpus: Fashion-MNIST images with captions built from their real
labels (class name, parent group, the WordNet gloss of the class noun), saved as a ``datasets``
directory with ``image`` and ``text`` columns, the format LiT reads any corpus in (``lit/data.py``).

Captions derived from labels make every smoke LiT result a check of the machinery (tokenizer, towers,
loss, zero-shot classifiers), not of the paper's effect: the text carries nothing but the label.

WordNet: Debian's ``wordnet-base`` (``/usr/share/wordnet``), read offline. The gloss of a class is that
of the first sense (in WordNet's frequency order, ``index.noun``) of the class's head noun that is an
artifact (lexicographer file 06, ``noun.artifact``): "sandal" -> "a shoe consisting of a sole fastened
by straps to the foot". ``data.noun`` is addressed by the byte offsets the index lists.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpnrepro.errors import DatasetError

NOUN_ARTIFACT = "06"  # lexicographer file of man-made objects (clothes, shoes, bags)

# One caption form per image, drawn with the corpus seed.
CAPTION_FORMS = (
    "{name}",
    "a photo of a {name}, a kind of {group}",
    "{name}: {gloss}",
    "{gloss}",
)


def head_noun(class_name: str) -> str:
    """The WordNet lemma of a class: the last word of its first alternative ('Ankle boot' -> 'boot',
    'T-shirt/top' -> 't-shirt')."""
    return class_name.split("/")[0].split()[-1].lower()


def wordnet_glosses(root: str | Path, lemmas: list[str], lexfile: str = NOUN_ARTIFACT) -> dict[str, str]:
    """{lemma: gloss} of the first ``lexfile`` sense of each noun lemma, from WordNet's database files."""
    root = Path(root)
    index, data = root / "index.noun", root / "data.noun"
    if not index.exists() or not data.exists():
        raise DatasetError(f"WordNet noun database not found in {root} (index.noun, data.noun); on Debian "
                           "`apt-get install wordnet-base`, or point lit_captions.wordnet at a WordNet 3 dict/")
    want = {lemma.replace(" ", "_"): lemma for lemma in lemmas}
    offsets: dict[str, list[int]] = {}
    with index.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith(" "):  # licence header
                continue
            fields = line.split()
            if fields[0] in want:
                n_synsets, n_ptrs = int(fields[2]), int(fields[3])
                offsets[want[fields[0]]] = [int(o) for o in fields[6 + n_ptrs:6 + n_ptrs + n_synsets]]
    glosses = {}
    with data.open("rb") as f:
        for lemma in lemmas:
            for off in offsets.get(lemma, []):
                f.seek(off)
                line = f.readline().decode("utf-8")
                if line.split()[1] == lexfile:
                    glosses[lemma] = line.split("|", 1)[1].split(";")[0].strip()
                    break
            else:
                raise DatasetError(f"WordNet in {root} has no noun.artifact sense of {lemma!r}")
    return glosses


def fashion_mnist_captions(source: str, split: str, *, per_class: int, parents: list[int], group_names: list[str],
                           wordnet: str, seed: int):
    """A ``datasets.Dataset`` (``image``, ``text``, ``label``) of the first ``per_class`` images of each
    class of a Fashion-MNIST idx split (0 = all), each with one caption drawn from :data:`CAPTION_FORMS`."""
    import datasets

    from dpnrepro.data.sources import FASHION_MNIST_CLASSES, load_idx

    if len(parents) != len(FASHION_MNIST_CLASSES):
        raise DatasetError(f"lit_captions.parents needs one group per class ({len(FASHION_MNIST_CLASSES)}), "
                           f"got {len(parents)}")
    images, labels = load_idx(source, split, key="lit_captions.source")
    keep = np.concatenate([np.flatnonzero(labels == c)[:per_class or None] for c in range(len(FASHION_MNIST_CLASSES))])
    keep.sort()
    glosses = wordnet_glosses(wordnet, sorted({head_noun(n) for n in FASHION_MNIST_CLASSES}))
    forms = np.random.default_rng(seed).integers(len(CAPTION_FORMS), size=len(keep))
    texts = []
    for i, form in zip(keep, forms):
        name = FASHION_MNIST_CLASSES[labels[i]]
        texts.append(CAPTION_FORMS[form].format(name=name.lower(), group=group_names[parents[labels[i]]],
                                                gloss=glosses[head_noun(name)]))
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=list(FASHION_MNIST_CLASSES))})
    return datasets.Dataset.from_dict({"image": list(images[keep]), "text": texts, "label": labels[keep].tolist()},
                                      features=features)
