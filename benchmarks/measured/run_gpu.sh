#!/bin/bash
# Measure training throughput on one CUDA GPU and commit-ready outputs (reports/benchmarks_gpu.md).
# usage, from the repository root:  bash benchmarks/measured/run_gpu.sh [RUN_DIR]   (default /tmp/gpu_bench)
# ~17 min on an H100 (most of it torch.compile's compilation). CI cannot run it: it needs a GPU.
# Then: python -m dpnrepro.benchmarks.gpu_measured collect RUN_DIR (run at the end of this script) writes
# benchmarks/measured/h100_train_throughput.json, benchmarks/measured/gpu_throughput_summary.json and
# reports/benchmarks_gpu.md. The results go to RUN_DIR and never to the `benchmark` stage's DVC outputs.
set -u
RES=${1:-/tmp/gpu_bench}
mkdir -p "$RES"; : > "$RES/commands.tsv"; : > "$RES/jobs.tsv"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src PYTHONUNBUFFERED=1 DPNREPRO_CPU_THREADS=${DPNREPRO_CPU_THREADS:-8}
PY=${PYTHON:-python3}
job() {  # job NAME ARGS...
  local name=$1; shift
  local cmd="$PY stages/benchmark.py --device cuda --no-progress --seed 0 $* --out-json $RES/$name.json --out-md $RES/$name.md"
  echo "== $name: $cmd"
  printf '%s\t%s\n' "$name" "$cmd" >> "$RES/commands.tsv"
  local t=$(date +%s)
  $cmd 2>&1 | tee "$RES/$name.log"; local rc=${PIPESTATUS[0]}
  printf '%s\trc=%s\twall_s=%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$RES/jobs.tsv"
}
M="--stems conv,linear,dpn --timm-reference --warmup-steps 3"
TWO="--stems conv,dpn --warmup-steps 3"
job c224_ti  --archs Ti-16 --batch-size 256 --img-size 224 --rounds 20 --steps-per-round 10 --compile $M
job e224_tsb --archs Ti-16,S-16,B-32,B-16 --batch-size 256 --img-size 224 --rounds 20 --steps-per-round 10 --no-compile $M
job e224_l   --archs L-16 --batch-size 128 --img-size 224 --rounds 20 --steps-per-round 5 --no-compile $M
job e384_b   --archs B-16 $TWO --timm-reference --batch-size 64 --img-size 384 --rounds 20 --steps-per-round 10 --no-compile
job e512_b   --archs B-16 $TWO --timm-reference --batch-size 32 --img-size 512 --rounds 20 --steps-per-round 10 --no-compile
job c224_b   --archs B-16 --batch-size 256 --img-size 224 --rounds 20 --steps-per-round 10 --compile $M
job c384_b   --archs B-16 $TWO --no-timm-reference --batch-size 64 --img-size 384 --rounds 20 --steps-per-round 10 --compile
job c224_s   --archs S-16 $TWO --no-timm-reference --batch-size 256 --img-size 224 --rounds 20 --steps-per-round 10 --compile
$PY - "$RES" <<'PY'
import datetime, json, os, subprocess, sys
import torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit",
                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
json.dump({"nvidia_smi": smi, "python": sys.version.split()[0], "cuda": torch.version.cuda, "git_rev": rev,
           "measured": datetime.date.today().isoformat(),
           "environment": {"DPNREPRO_CPU_THREADS": os.environ.get("DPNREPRO_CPU_THREADS"), "cpus": os.cpu_count()},
           "rerun": "bash benchmarks/measured/run_gpu.sh /tmp/gpu_bench"},
          open(os.path.join(sys.argv[1], "env.json"), "w"), indent=1)
PY
$PY -m dpnrepro.benchmarks.gpu_measured collect "$RES"
