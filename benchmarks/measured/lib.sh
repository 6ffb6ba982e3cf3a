# Sourced by run_gpu.sh and gpu_speed.sh: the environment of a GPU run, its time budget, one job under
# `timeout`, and RES packed into one file. Set before sourcing: RES (results folder), BUDGET_S (seconds for
# the whole command, counted from here), PACK_RESERVE_S (kept for packing) and MIN_JOB_S (a job that cannot
# get this many seconds is skipped).
T0=$(date +%s)
mkdir -p "$RES"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  DVC_NO_ANALYTICS=1 DPNREPRO_CPU_THREADS=${DPNREPRO_CPU_THREADS:-8}
PY=${PYTHON:-python3}
DRY=${DRY_RUN:-0}
CPUS=$(nproc)

left() { echo $(( BUDGET_S - PACK_RESERVE_S - ($(date +%s) - T0) )); }

job() {  # job NAME CAP_S COMMAND...: once (skipped when RES/NAME.json exists), under `timeout` min(CAP_S, budget left)
  local name=$1 cap=$2; shift 2
  if [ -s "$RES/$name.json" ]; then echo "== $name: done before"; return 0; fi
  local t=$(left); [ "$cap" -lt "$t" ] && t=$cap
  if [ "$t" -lt "$MIN_JOB_S" ]; then
    echo "== $name: skipped, the budget is spent"; printf '%s\trc=skipped\twall_s=0\n' "$name" >> "$RES/jobs.tsv"; return 1
  fi
  echo "== $name (timeout ${t}s): $*"
  printf '%s\t%s\n' "$name" "$*" >> "$RES/commands.tsv"
  local t0=$(date +%s)
  timeout --signal=INT --kill-after=15 "$t" "$@" 2>&1 | tee "$RES/$name.log"; local rc=${PIPESTATUS[0]}
  printf '%s\trc=%s\twall_s=%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" >> "$RES/jobs.tsv"
  return "$rc"
}

pack_res() {  # pack_res FILE: RES as $OUT/FILE (.tar.gz; next to RES without OUT): a GPU run returns few files
  local dest=${OUT:-$(dirname "$RES")}
  mkdir -p "$dest" && tar -czf "$dest/$1" -C "$(dirname "$RES")" "$(basename "$RES")" \
    && echo "######## results packed: $dest/$1 ($(du -h "$dest/$1" | cut -f1))"
}
