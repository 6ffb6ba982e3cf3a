#!/bin/bash
# The smoke pipeline's whole `dvc repro` with every stage on one device, twice, and its outputs packed:
#
#   bash benchmarks/measured/run_gpu.sh env && bash benchmarks/measured/gpu_smoke.sh     # on the GPU machine
#   DRY_RUN=1 PARAMS=tiny.yaml bash benchmarks/measured/gpu_smoke.sh                  # the same phases on the CPU
#
# 1. COPIES (2) copies of this checkout side by side under WORK, each with params.yaml = PARAMS (default
#    profiles/smoke.yaml) and every stage's device set to cuda (DRY_RUN=1: cpu): train.device,
#    segmentation.device, lit.train.device; dvc.yaml regenerated (`python -m dpnrepro.pipeline`).
# 2. `dvc repro TARGETS` (default: the whole pipeline) in every copy at once, each from its own empty DVC and
#    datasets cache, on its share of the cores (taskset), the one GPU shared; each output line timestamped, so
#    RES/stage_times_<copy>.json has the wall time of every stage.
# 3. tools/lock_diff.py: the outputs whose dvc.lock hashes differ between the copies (RES/lock_diff.*).
# 4. Copy a's model stages (train-*, evaluate-*, segment, vtab, sun397_scratch, lit_train, lit_evaluate) packed as
#    a local DVC remote: $OUT/smoke_artifacts.tar.gz[.partNN] (python tools/dvc_pack.py pack), with its
#    tables, figures and metrics as the files a CPU checkout of the same revision must regenerate byte for byte:
#    python tools/dvc_pack.py unpack smoke_artifacts.tar.gz --repro <report stages> (RES/unpack_command.txt).
# SETUP_ONLY=1: the environment only (a first run on the machine); KEEP=1: the copies (and RES) of an earlier
# run go on where they stopped (DVC keeps finished stages, a training stage resumes from its checkpoint).
# On exit RES (logs, jobs.tsv, dvc.lock of each copy, a's reports/ and metrics/) is packed as
# $OUT/gpu_smoke_results.tar.gz. mmcv (segmentation) is built once from the sdist in .gpu_carry with the GPU hidden
# (CPU ops only: what the Segmenter-linear model needs) when `import mmcv.ops` fails (not in a dry run).
set -u -o pipefail
T0=$(date +%s)
BUDGET_S=${BUDGET_S:-570}
DRY=${DRY_RUN:-0}
DEV=cuda; [ "$DRY" = 1 ] && DEV=cpu
WORK=${WORK:-/tmp/gpu_smoke}
RES=${RES:-$WORK/res}
COPIES=${COPIES:-2}
CARRY=${CARRY:-.gpu_carry}
SRC=$PWD
PY=${PYTHON:-python3}
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  DVC_NO_ANALYTICS=1
export PATH=$(dirname "$(command -v "$PY")"):/tmp/site/bin:$PATH  # dvc.yaml's stage commands call `python`
[ -z "${GIT_REV:-}" ] && [ -s "$CARRY/git_rev" ] && GIT_REV=$(cat "$CARRY/git_rev")
[ -z "${GIT_REV:-}" ] && GIT_REV=$(git rev-parse HEAD 2>/dev/null)
export GIT_REV  # the revision the pack records (dvc_pack): the checkout's, not the copies' own commits
CPUS=$(nproc)
SHARE=$(( CPUS / COPIES > 0 ? CPUS / COPIES : 1 ))
[ "${KEEP:-0}" = 1 ] || rm -rf "$RES"; mkdir -p "$RES"

left() { echo $(( BUDGET_S - 30 - ($(date +%s) - T0) )); }
log_job() { printf '%s\trc=%s\twall_s=%s\n' "$1" "$2" "$3" >> "$RES/jobs.tsv"; }

pack_results() {
  local dest=${OUT:-$WORK}
  for c in $(seq 0 $(( COPIES - 1 ))); do
    local d="$WORK/copy$c"; [ -d "$d" ] || continue
    mkdir -p "$RES/copy$c" && cp -f "$d/dvc.lock" "$d/params.yaml" "$RES/copy$c/" 2>/dev/null
  done
  [ -d "$WORK/copy0/reports" ] && cp -r "$WORK/copy0/reports" "$WORK/copy0/metrics" "$RES/copy0/" 2>/dev/null
  mkdir -p "$dest" && tar -czf "$dest/gpu_smoke_results.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")" \
    && echo "######## results packed: $dest/gpu_smoke_results.tar.gz"
}
trap pack_results EXIT
trap 'exit 130' INT TERM

# --- the environment: WordNet (LiT captions) and mmcv's CPU ops (segmentation), from .gpu_carry ------------
if [ -d "$CARRY/wordnet" ] && [ ! -f /usr/share/wordnet/data.noun ]; then
  mkdir -p /usr/share/wordnet && for f in "$CARRY"/wordnet/*; do
    case $f in *.gz) gunzip -c "$f" > "/usr/share/wordnet/$(basename "${f%.gz}")" ;; *) cp "$f" /usr/share/wordnet/ ;; esac
  done
fi
if [ "$DRY" != 1 ] && ! "$PY" -c "import mmcv.ops" 2>/dev/null && ls "$CARRY"/mmcv-src/mmcv-*.tar.gz >/dev/null 2>&1; then
  t=$(date +%s)
  CUDA_VISIBLE_DEVICES= MMCV_SDIST=$(ls "$CARRY"/mmcv-src/mmcv-*.tar.gz | head -1) PIP_TARGET=/tmp/site PY=$PY \
    MAX_JOBS=$CPUS bash tools/build_mmcv.sh > "$RES/build_mmcv.log" 2>&1
  log_job build_mmcv $? $(( $(date +%s) - t ))
fi
"$PY" - "$RES/env.json" "$DEV" <<'PY'
import json, os, subprocess, sys
import torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip() if torch.cuda.is_available() else None
json.dump({"device": sys.argv[2], "nvidia_smi": smi, "cuda": torch.version.cuda, "torch": torch.__version__,
           "git_rev": os.environ.get("GIT_REV"), "cpus": os.cpu_count()}, open(sys.argv[1], "w"), indent=1)
PY
[ "${SETUP_ONLY:-0}" = 1 ] && exit 0

# --- 1. the copies ---------------------------------------------------------------------------------------------
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"/copy*
for c in $(seq 0 $(( COPIES - 1 ))); do
  d="$WORK/copy$c"; [ -d "$d/.git" ] && continue  # KEEP=1: a copy of an earlier run goes on where it stopped
  mkdir -p "$d"
  tar -C "$SRC" --exclude=./.git --exclude=./.venv --exclude=./.gpu_carry --exclude=./.whl --exclude=./data \
    --exclude=./runs --exclude=./dvclive --exclude=./checkpoints --exclude=./.dvc/cache --exclude=./.dvc/tmp \
    --exclude=./.dvc/config.local -cf - . | tar -C "$d" -xf - || exit 1
  rm -f "$d/dvc.lock"  # the committed lock is the CPU run's: this run's lock holds only what it ran
  cp "${PARAMS:-profiles/smoke.yaml}" "$d/params.yaml" || exit 1
  (cd "$d" && "$PY" tools/set_params.py train.device=$DEV segmentation.device=$DEV lit.train.device=$DEV \
     && "$PY" -m dpnrepro.pipeline > /dev/null \
     && git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm "$GIT_REV") || exit 1
done

# --- 2. dvc repro in every copy at once ------------------------------------------------------------------------
pids=()
for c in $(seq 0 $(( COPIES - 1 ))); do  # dvc repro through DVC's API: each stage's seconds in stage_times_copy<c>.json
  d="$WORK/copy$c" cores="$(( c * SHARE ))-$(( c * SHARE + SHARE - 1 ))"
  (cd "$d" && t=$(date +%s) && HF_HOME="$d/.hf" DPNREPRO_CPU_THREADS=$SHARE \
     timeout --signal=INT --kill-after=15 "$(left)" taskset -c "$cores" "$PY" -m dpnrepro.dvc_graph repro \
       --times "$RES/stage_times_copy$c.json" ${TARGETS:-} > "$RES/repro_copy$c.log" 2>&1
   rc=$?; log_job "repro_copy$c" "$rc" $(( $(date +%s) - t )); exit "$rc") &
  pids+=($!)
done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ "$failed" = 0 ] || { echo "######## dvc repro failed in a copy: $RES/repro_copy*.log"; exit 1; }

# --- 3. every output hash of the copies compared ---------------------------------------------------------------
for c in $(seq 1 $(( COPIES - 1 ))); do
  "$PY" tools/lock_diff.py "$WORK/copy0/dvc.lock" "$WORK/copy$c/dvc.lock" --json "$RES/lock_diff_copy$c.json" \
    | tee "$RES/lock_diff_copy$c.txt"
done

# --- 4. copy0's model stages packed, its reports as what a CPU checkout must regenerate ------------------------
{ read -r -a model; read -r -a reports; read -r -a compare; } < <(cd "$WORK/copy0" && "$PY" -c '
import re, yaml
MODEL = re.compile(r"^(train-|evaluate-)|^(segment|vtab|sun397_scratch|lit_train|lit_evaluate)$")
REPORT = re.compile(r"^(table\d|figure\d|figures|reports_index)$")
lock = yaml.safe_load(open("dvc.lock"))["stages"]
print(" ".join(s for s in lock if MODEL.match(s)))
print(" ".join(s for s in lock if REPORT.match(s)))
print(" ".join(o["path"] for s, b in lock.items() if REPORT.match(s) for o in b["outs"]))')
t=$(date +%s)
(cd "$WORK/copy0" && "$PY" tools/dvc_pack.py pack "${OUT:-$WORK}/smoke_artifacts.tar.gz" --stages "${model[@]}" \
   --compare "${compare[@]}") 2>&1 | tee "$RES/pack.log"; rc=${PIPESTATUS[0]}
log_job pack "$rc" $(( $(date +%s) - t ))
echo "python tools/dvc_pack.py unpack smoke_artifacts.tar.gz --repro ${reports[*]}" | tee "$RES/unpack_command.txt"
exit "$rc"
