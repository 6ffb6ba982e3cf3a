#!/bin/bash
# The GPU validation run (one GPU, about 25 minutes on an H100): CUDA tests, the training step on a fixed
# on-device batch ("synthetic": real photos, no input pipeline) and the trainer's own loop on real JPEG
# input for B/16 and Ti/16, eager and compiled, a profile of Ti/16's step, and the mini profile's `table1`
# sweep through `dvc repro`. Each phase writes under RES (default /tmp/gpu_validation) and is skipped when
# its outputs exist, so the run can be split over several runs on a GPU machine:
#
#   bash benchmarks/measured/run_gpu.sh                       # every phase
#   bash benchmarks/measured/run_gpu.sh tests step loop       # some phases
#   DRY_RUN=1 bash benchmarks/measured/run_gpu.sh             # CPU: tiny sizes, checks the plumbing (tests/)
#
# phases: env tests step loop input profile mini collect. `collect` (python -m dpnrepro.benchmarks.gpu_validation
# collect RES) writes benchmarks/measured/gpu_validation.json and reports/gpu_validation.md (plain files, not
# DVC outputs: no CI machine has a GPU). The earlier throughput matrix (every arch x stem, eager/compiled) is
# `python -m dpnrepro.benchmarks.gpu_measured` (reports/benchmarks_gpu.md). Needs the project's packages (pydantic, datasets, dvc, dvclive) importable: on a bare
# GPU image put their wheels in .whl/ and run `bash benchmarks/measured/run_gpu.sh env` first.
set -u -o pipefail
RES=${RES:-/tmp/gpu_validation}
mkdir -p "$RES"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  DVC_NO_ANALYTICS=1 DPNREPRO_CPU_THREADS=${DPNREPRO_CPU_THREADS:-8}
PY=${PYTHON:-python3}
DRY=${DRY_RUN:-0}
DEV=cuda; [ "$DRY" = 1 ] && DEV=cpu
CPUS=$(nproc)

job() {  # job NAME COMMAND...: run once (skipped when RES/NAME.json exists), log, record rc and wall time
  local name=$1; shift
  if [ -s "$RES/$name.json" ]; then echo "== $name: done before"; return 0; fi
  echo "== $name: $*"
  printf '%s\t%s\n' "$name" "$*" >> "$RES/commands.tsv"
  local t=$(date +%s)
  "$@" 2>&1 | tee "$RES/$name.log"; local rc=${PIPESTATUS[0]}
  printf '%s\trc=%s\twall_s=%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" >> "$RES/jobs.tsv"
}

phase_env() {
  if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import pydantic, datasets, dvc, dvclive" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || return 1
  fi
  if [ -d .gpu_data/fashion-mnist ] && [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    mkdir -p /usr/share/datasets && cp -r .gpu_data/fashion-mnist /usr/share/datasets/
  fi
  $PY - "$RES" <<'PY'
import datetime, json, os, subprocess, sys
import torch, timm
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit",
                      "--format=csv,noheader"], capture_output=True, text=True).stdout.strip() if torch.cuda.is_available() else None
rev = os.environ.get("GIT_REV") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
versions = {}
for name in ("pydantic", "datasets", "pyarrow", "dvc", "dvclive", "numpy", "pillow"):
    try:
        from importlib.metadata import version
        versions[name] = version(name)
    except Exception as exc:  # noqa: BLE001
        versions[name] = f"missing ({exc.__class__.__name__})"
json.dump({"nvidia_smi": smi, "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "timm": timm.__version__, "packages": versions, "git_rev": rev, "measured": datetime.date.today().isoformat(),
           "environment": {"DPNREPRO_CPU_THREADS": os.environ.get("DPNREPRO_CPU_THREADS"), "cpus": os.cpu_count()},
           "rerun": "bash benchmarks/measured/run_gpu.sh"}, open(os.path.join(sys.argv[1], "env.json"), "w"), indent=1)
print(json.dumps(versions))
PY
}

phase_tests() {  # the CUDA tests (determinism included) and the compiled step's numerics
  local sel="cuda or compiled"
  job tests $PY -m pytest -q -p no:cacheprovider tests/test_determinism.py tests/test_step.py -k "$sel" \
    --junitxml "$RES/tests.xml"
  [ -f "$RES/tests.xml" ] && $PY - "$RES" <<'PY'
import json, sys, xml.etree.ElementTree as ET
root = ET.parse(f"{sys.argv[1]}/tests.xml").getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
cases = [{"test": c.get("classname") + "::" + c.get("name"), "seconds": float(c.get("time", 0)),
          "outcome": "failed" if c.find("failure") is not None or c.find("error") is not None
          else "skipped" if c.find("skipped") is not None else "passed"} for c in suite.iter("testcase")]
json.dump({"cases": cases}, open(f"{sys.argv[1]}/tests.json", "w"), indent=1)
PY
}

phase_step() {  # the step on a fixed on-device batch: eager / compiled / compiled + CUDA graphs, and a Ti/16 batch sweep
  local common="--device $DEV --no-progress --seed 0 --warmup-steps 3 --no-timm-reference --img-size 224"
  local r=12 s=5 b=256 bt=256
  [ "$DRY" = 1 ] && { r=6; s=1; b=4; bt=4; common="$common --img-size 32 --archs Mu-4"; }
  bench() { local name=$1; shift; job "$name" $PY stages/benchmark.py $common "$@" --out-json "$RES/$name.json" --out-md "$RES/$name.md"; }
  if [ "$DRY" = 1 ]; then
    bench step_eager --stems conv,dpn --batch-size $b --rounds $r --steps-per-round $s --no-compile
    bench step_compiled --stems dpn --batch-size $b --rounds $r --steps-per-round $s --compile
    return
  fi
  bench step_b16_eager --archs B-16 --stems conv,dpn --batch-size $b --rounds $r --steps-per-round $s --no-compile
  bench step_b16_compiled --archs B-16 --stems dpn --batch-size $b --rounds $r --steps-per-round $s --compile
  bench step_ti16_eager --archs Ti-16 --stems conv,dpn --batch-size $bt --rounds $r --steps-per-round $s --no-compile
  bench step_ti16_compiled --archs Ti-16 --stems dpn --batch-size $bt --rounds $r --steps-per-round $s --compile
  bench step_ti16_cudagraphs --archs Ti-16 --stems dpn --batch-size $bt --rounds $r --steps-per-round $s --compile --cudagraphs
  bench step_ti16_cudagraphs_b1024 --archs Ti-16 --stems dpn --batch-size 1024 --rounds 8 --steps-per-round $s --compile --cudagraphs
}

phase_loop() {  # the trainer's own loop on real JPEGs (full profile's table1 recipe, pil backend, all cores)
  local w=$(( CPUS > 2 ? CPUS - 2 : 1 ))
  if [ "$DRY" = 1 ]; then
    job loop_dry $PY -m dpnrepro.benchmarks.trainer_loop --arch Ti-16 --batch-size 4 --steps 2 --warmup 1 --workers 0 \
      --device cpu --synthetic-rounds 0 --out "$RES/loop_dry.json"
    return
  fi
  lp() { local name=$1; shift; job "$name" $PY -m dpnrepro.benchmarks.trainer_loop --workers $w --synthetic-rounds 0 "$@" --out "$RES/$name.json"; }
  lp loop_b16_eager --arch B-16 --batch-size 256 --steps 20 --warmup 8
  lp loop_b16_compiled --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile
  lp loop_ti16_eager --arch Ti-16 --batch-size 256 --steps 30 --warmup 10
  lp loop_ti16_cudagraphs --arch Ti-16 --batch-size 256 --steps 30 --warmup 10 --compile --cudagraphs
  lp loop_b16_compiled_fast --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend fast
}

phase_input() {  # input.backend gpu (data/gpu.py) against pil / fast: img/s and CPU cores for B/16's 3,300 img/s
  local w=$(( CPUS > 2 ? CPUS - 2 : 1 ))
  if [ "$DRY" = 1 ]; then
    job input_dry $PY -m dpnrepro.benchmarks.gpu_input --device cpu --rounds 2 --skip-end-to-end --out "$RES/input_dry.json"
    return
  fi
  # the pipeline alone (worker half per core, device half, the trainer's batches end to end, CUDA vs CPU pixels)
  job input_gpu $PY -m dpnrepro.benchmarks.gpu_input --device cuda --workers $w --out "$RES/input_gpu.json" \
    --out-md "$RES/input_gpu.md"
  # the trainer's loop with B/16 on top, full profile recipe (big_vision crop, RandAugment m15, mixup), per backend
  lp() { local name=$1; shift; job "$name" $PY -m dpnrepro.benchmarks.trainer_loop --workers $w --synthetic-rounds 0 "$@" --out "$RES/$name.json"; }
  lp loop_b16_compiled_gpuinput --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend gpu
  lp loop_b16_compiled_pil --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend pil
  lp loop_b16_compiled_fast --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend fast
  # the same from a real-photo JPEG folder on disk (needs foolbox's wheel in .whl/, see photo_folder.py)
  if $PY -c "import foolbox" 2>/dev/null || ls .whl/foolbox-*.whl >/dev/null 2>&1; then
    job input_folder $PY scripts/bench_folder.py --train 20000 --val 0 --workers "$CPUS" --rounds 6 --gpu-decode \
      --skip-prepare --tmp /tmp --out-json "$RES/input_folder.json" --out-md "$RES/input_folder.md"
  fi
}

phase_profile() {  # where Ti/16's eager step spends its time (torch.profiler, CPU and CUDA)
  [ "$DRY" = 1 ] && return
  job profile_ti16 $PY -m dpnrepro.benchmarks.step_profile --arch Ti-16 --batch-size 256 --out "$RES/profile_ti16.json"
}

phase_mini() {  # the mini profile's table1 sweep through dvc repro (resumable: a rerun continues the sweep)
  [ "$DRY" = 1 ] && return
  if [ -s "$RES/mini_table1.json" ]; then echo "== mini: done before"; return; fi
  [ -d .git ] || { git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm "gpu run" ; }
  # the mini profile, with this machine's loader workers and the Mu step compiled and replayed as CUDA graphs
  # (host-bound eager: reports/gpu_validation.md); runtime.* is tracked by no stage
  sed -e "s/^  workers: 4\$/  workers: $(( CPUS > 2 ? CPUS - 2 : 1 ))\n  compile: true\n  cudagraphs: true/" \
    profiles/mini.yaml > params.yaml
  rm -f .dvc/tmp/rwlock .dvc/tmp/lock  # a previous call's repro stopped at its time budget
  local t=$(date +%s)
  PATH=$(dirname "$(command -v $PY)"):$PATH timeout --signal=INT "${MINI_BUDGET_S:-100000}" $PY -m dvc repro table1 2>&1 \
    | tee -a "$RES/mini.log"; local rc=${PIPESTATUS[0]}
  printf 'mini\trc=%s\twall_s=%s\n' "$rc" "$(( $(date +%s) - t ))" >> "$RES/jobs.tsv"
  if [ "$rc" = 0 ]; then
    cp metrics/table1.json "$RES/mini_table1_metrics.json" 2>/dev/null
    cp metrics/table1_summary.json "$RES/mini_table1_summary.json" 2>/dev/null
    cp reports/table1.md "$RES/mini_table1.md" 2>/dev/null
    $PY - "$RES" <<'PY'
import json, sys
walls = [l.split("\t") for l in open(f"{sys.argv[1]}/jobs.tsv") if l.startswith("mini\t")]
json.dump({"wall_s_per_call": [int(w[2].split("=")[1]) for w in walls]}, open(f"{sys.argv[1]}/mini_table1.json", "w"))
PY
  fi
}

phase_collect() { $PY -m dpnrepro.benchmarks.gpu_validation collect "$RES"; }

phases=("$@"); [ ${#phases[@]} = 0 ] && phases=(env tests step loop input profile mini collect)
for p in "${phases[@]}"; do
  echo "######## phase $p ($(date +%T))"
  "phase_$p"
done
