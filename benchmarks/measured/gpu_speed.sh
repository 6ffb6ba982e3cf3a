#!/bin/bash
# The GPU speed measurement in one run on an H100 machine (about 9 minutes): side by side on one card,
#   - B/16 DPN trainer loop (full profile, table1 recipe, compiled, batch 256, real JPEGs, pil);
#   - Ti/16 DPN trainer loop (compiled + CUDA graphs, pil) and its step alone (same process);
#   - B/16's step alone under each lever (tools/step_levers.py: baseline with a kernel-time
#     profile by op group, cuDNN / flash attention, compiled clipping + optimizer, channels_last, batch 512,
#     the baseline again, max-autotune), one after another in the time left.
# Jobs run in that order, each under its own `timeout` and the overall budget BUDGET_S (default 540 s);
# a job that cannot get MIN_JOB_S (30 s) is skipped and named in jobs.tsv. Whatever happens, the EXIT trap
# summarises the levers and packs every result and log into $OUT/gpu_speed.tar.gz (one file).
#
#   bash benchmarks/measured/gpu_speed.sh                  # on the GPU (needs the wheels: see README)
#   DRY_RUN=1 OUT=/tmp/x bash benchmarks/measured/gpu_speed.sh   # CPU, tiny sizes: checks the plumbing
#   LEVERS=batch512,max_autotune bash benchmarks/measured/gpu_speed.sh levers   # some jobs / levers only
set -u -o pipefail
BUDGET_S=${BUDGET_S:-540}
PACK_RESERVE_S=${PACK_RESERVE_S:-0}
MIN_JOB_S=${MIN_JOB_S:-30}
OUT=${OUT:-/tmp/gpu_speed_out}
RES=${RES:-/tmp/gpu_speed}
source "$(dirname "$0")/lib.sh"  # T0, PY, DRY, CPUS, the environment; left, job, pack_res
W=$(( CPUS > 2 ? CPUS - 2 : 1 ))
LEVERS=${LEVERS:-baseline,sdpa_cudnn,compiled_optimizer,sdpa_flash,channels_last,batch512,baseline_end,max_autotune}

pack() {
  $PY tools/step_levers.py --summarize "$RES/levers" >"$RES/levers_summary.log" 2>&1
  printf 'total_wall_s\t%s\n' "$(( $(date +%s) - T0 ))" >>"$RES/jobs.tsv"
  pack_res gpu_speed.tar.gz
  echo "---- jobs"; cat "$RES/jobs.tsv"; echo "---- levers"; cat "$RES/levers/levers.md" 2>/dev/null
}
trap pack EXIT

phase_env() {
  if [ -d .whl ] && ! $PY -c "import pydantic, datasets" 2>/dev/null; then
    timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda)"
    git rev-parse HEAD 2>/dev/null; echo "cpus $CPUS"; } >"$RES/env.txt" 2>&1
  cat "$RES/env.txt"
}

loop() {  # loop NAME MAX_S BACKEND ARGS...: the trainer's own loop (tools/trainer_loop.py)
  local name=$1 max=$2 backend=$3; shift 3
  if [ "$DRY" = 1 ]; then
    job "$name" "$max" $PY tools/trainer_loop.py --arch Ti-16 --batch-size 4 --steps 2 --warmup 1 \
      --workers 0 --device cpu --synthetic-rounds 0 --backend "$backend" --out "$RES/$name.json"
  else
    job "$name" "$max" $PY tools/trainer_loop.py --workers "$W" --backend "$backend" "$@" \
      --out "$RES/$name.json"
  fi
}

phase_loops() {
  local b16="--arch B-16 --batch-size 256 --steps 15 --warmup 6 --compile --synthetic-rounds 0"
  loop loop_b16_pil 100 pil $b16
  loop loop_ti16_pil 100 pil --arch Ti-16 --batch-size 256 --steps 30 --warmup 10 --compile --cudagraphs \
    --synthetic-rounds 6
}

phase_levers() {
  local size="--arch B-16" dev=cuda extra=""
  [ "$DRY" = 1 ] && { size="--arch Mu-7 --img-size 28 --batch-size 4 --steps-per-round 1"; dev=cpu; extra=--no-compile; }
  job levers "$BUDGET_S" $PY tools/step_levers.py $size --device $dev $extra --profile --levers "$LEVERS" \
    --out-dir "$RES/levers"
}

phases=("$@"); [ ${#phases[@]} = 0 ] && phases=(env loops levers)
for p in "${phases[@]}"; do
  echo "######## phase $p (+$(( $(date +%s) - T0 ))s)"
  "phase_$p"
done
