#!/usr/bin/env bash
# Build and install mmcv 2.1.0 (with its compiled ops) into the active virtual environment.
#
# Why a build: mmsegmentation 1.2.2 accepts only mmcv >=2.0.0rc4,<2.2.0 and imports mmcv.ops, so
# mmcv-lite does not work; mmcv 2.1.0 has no wheel for this Python/torch pair on PyPI. Its sdist
#   * imports pkg_resources in setup.py   -> build with setuptools==80.9.0, without build isolation;
#   * hard-codes -std=c++14/-std=c++17    -> torch >= 2.14 headers need C++20.
# The built wheel is kept in $DPNREPRO_WHEEL_CACHE so only a fresh machine pays the ~12 min build.
set -euo pipefail
PY=${PY:-python}
MMCV_VERSION=2.1.0
CACHE=${DPNREPRO_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dpnrepro/wheels}
mkdir -p "$CACHE"

if "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '$MMCV_VERSION'" 2>/dev/null; then
  echo "[build_mmcv] mmcv $MMCV_VERSION with ops already installed"; exit 0
fi
torch_tag=$("$PY" -c "import torch; print(torch.__version__.split('+')[0])")
wheel_dir="$CACHE/mmcv-$MMCV_VERSION-torch$torch_tag"
mkdir -p "$wheel_dir"
if ! ls "$wheel_dir"/mmcv-*.whl >/dev/null 2>&1; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "[build_mmcv] building mmcv $MMCV_VERSION from source against torch $torch_tag (10-15 min on 2 cores)"
  if [ -n "${MMCV_SDIST:-}" ]; then cp "$MMCV_SDIST" "$work/"  # a carried sdist (no network)
  else "$PY" -m pip download --quiet --no-deps --no-binary :all: "mmcv==$MMCV_VERSION" -d "$work"; fi
  tar -xzf "$work/mmcv-$MMCV_VERSION.tar.gz" -C "$work"
  sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g' "$work/mmcv-$MMCV_VERSION/setup.py"
  # CPU ops by default; set FORCE_CUDA=1 on a machine with nvcc to build the CUDA kernels as well.
  MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FORCE_CUDA=${FORCE_CUDA:-0} \
    "$PY" -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/dist" "$work/mmcv-$MMCV_VERSION"
  mv "$work"/dist/mmcv-*.whl "$wheel_dir/"
fi
"$PY" -m pip install --quiet --no-deps "$wheel_dir"/mmcv-*.whl
"$PY" -c "import mmcv, mmcv.ops; print('[build_mmcv] mmcv', mmcv.__version__, 'with ops: ok')"
