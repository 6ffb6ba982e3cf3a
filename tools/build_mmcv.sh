#!/usr/bin/env bash
# Build and install mmcv 2.1.0 (with its compiled ops) into the virtual environment of $PY.
#   PY=.venv/bin/python bash tools/build_mmcv.sh [--wheel-only]
# --wheel-only builds the wheel into the cache and installs nothing (tools/setup_env.sh runs it in the
# background while the other pins install, then this script without it to install the cached wheel).
#
# Why a build: mmsegmentation 1.2.2 accepts only mmcv >=2.0.0rc4,<2.2.0 and imports mmcv.ops, so
# mmcv-lite does not work; mmcv 2.1.0 has no wheel for this Python/torch pair on PyPI. Its sdist
#   * imports pkg_resources in setup.py   -> build with setuptools==80.9.0, without build isolation;
#   * hard-codes -std=c++14/-std=c++17    -> torch >= 2.14 headers need C++20;
#   * compiles each op wrapper alone      -> tools/mmcv_unity.py groups them into a few units.
# The built wheel is kept in $DPNREPRO_WHEEL_CACHE (one per torch version and Python tag), so only a fresh
# machine pays the build (its time: benchmarks/measured/setup_*.json).
set -euo pipefail
PY=${PY:-python}
MMCV_VERSION=2.1.0
CACHE=${DPNREPRO_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dpnrepro/wheels}
wheel_only=0
case "${1:-}" in --wheel-only) wheel_only=1;; "") ;; *) echo "error: unknown option $1 (use --wheel-only)" >&2; exit 2;; esac
mkdir -p "$CACHE"

if "$PY" -c "import mmcv, mmcv.ops; assert mmcv.__version__ == '$MMCV_VERSION'" 2>/dev/null; then
  echo "[build_mmcv] mmcv $MMCV_VERSION with ops already installed"; exit 0
fi
read -r torch_tag py_tag < <("$PY" -c "import sys, torch; print(torch.__version__.split('+')[0], f'cp{sys.version_info[0]}{sys.version_info[1]}')")
wheel_dir="$CACHE/mmcv-$MMCV_VERSION-torch$torch_tag"
mkdir -p "$wheel_dir"
wheels=("$wheel_dir"/mmcv-"$MMCV_VERSION"-"$py_tag"-*.whl)
if [ ! -f "${wheels[0]}" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "[build_mmcv] building mmcv $MMCV_VERSION from source against torch $torch_tag (minutes: a C++ compile)"
  if [ -n "${MMCV_SDIST:-}" ]; then cp "$MMCV_SDIST" "$work/"  # a carried sdist (no network)
  else "$PY" -m pip download --quiet --no-deps --no-build-isolation --no-binary :all: "mmcv==$MMCV_VERSION" -d "$work"; fi
  tar -xzf "$work/mmcv-$MMCV_VERSION.tar.gz" -C "$work"
  sed -i -E 's/-std=c\+\+1[47]/-std=c++20/g' "$work/mmcv-$MMCV_VERSION/setup.py"
  # ~55 one-op wrappers, each parsing all of torch's headers, compiled as 4 units (same code, same flags): the
  # build takes 40% of its time (Intel Xeon, 2 cores: 589 s -> 235 s; benchmarks/measured/setup_*.json).
  "$PY" "$(dirname "$0")/mmcv_unity.py" "$work/mmcv-$MMCV_VERSION"
  # CPU ops by default; set FORCE_CUDA=1 on a machine with nvcc to build the CUDA kernels as well.
  # No debug information: CFLAGS replaces Python's compile flags (-DNDEBUG -g -fwrapv -O3 -Wall), so it is
  # them plus -g0: the same -O3 code, without the debug information that costs most of the compile.
  cflags="${CFLAGS:-$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('CFLAGS') or '')")} -g0"
  # torch's headers parsed once, not once per unit (tools/pch_cxx.sh: a precompiled header, the same code)
  real_cxx=${CXX:-c++}
  CXX="$(cd "$(dirname "$0")" && pwd)/pch_cxx.sh" PCH_REAL_CXX="$real_cxx" PCH_DIR="$work/pch" \
  CFLAGS="$cflags" MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} FORCE_CUDA=${FORCE_CUDA:-0} \
    "$PY" -m pip wheel --quiet --no-build-isolation --no-deps -w "$work/dist" "$work/mmcv-$MMCV_VERSION"
  built=("$work"/dist/mmcv-*.whl)
  # into the cache under a temporary name first: a killed copy never looks like a cached wheel
  cp "${built[0]}" "$wheel_dir/.partial.$$"
  mv "$wheel_dir/.partial.$$" "$wheel_dir/$(basename "${built[0]}")"
  wheels=("$wheel_dir"/mmcv-"$MMCV_VERSION"-"$py_tag"-*.whl)
  echo "[build_mmcv] built $(basename "${wheels[0]}")"
fi
if [ "$wheel_only" = 1 ]; then
  echo "[build_mmcv] cached wheel: ${wheels[0]}"; exit 0
fi
"$PY" -m pip install --quiet --no-deps "${wheels[0]}"
"$PY" -c "import mmcv, mmcv.ops; print('[build_mmcv] mmcv', mmcv.__version__, 'with ops: ok')"
