#!/bin/bash
# The GPU validation run (one GPU): CUDA tests, the training step on a fixed on-device batch ("synthetic":
# real photos, no input pipeline) and the trainer's own loop on real JPEG input for B/16 and Ti/16, eager and
# compiled, a profile of Ti/16's step, and the mini profile's `table1` sweep. Each phase writes under RES
# (default /tmp/gpu_validation) and is skipped when its outputs exist, so the run can be split over several runs:
#
#   bash benchmarks/measured/run_gpu.sh                       # every phase
#   bash benchmarks/measured/run_gpu.sh env tests table1      # some phases (one part of a split run)
#   DRY_RUN=1 bash benchmarks/measured/run_gpu.sh             # CPU: tiny sizes, checks the plumbing (tests/)
#
# phases: env fingerprint tests step loop input profile mini table1 collect. Budget: the whole command gets
# BUDGET_S seconds (default 570) from its start; every job runs under its own `timeout` (its phase's cap,
# cut to what is left of the budget less PACK_RESERVE_S), so a stopped job never stops the rest
# (TESTS_IN_BACKGROUND=1: the `tests` phase runs beside the later phases, sharing the GPU). On exit,
# even after an error or a signal, RES is packed into ONE file, $OUT/gpu_results.tar.gz (RES.tar.gz without
# OUT), and `table1` packs its DVC outputs as $OUT/gpu_artifacts.tar.gz[.partNN] (tools/dvc_pack.py;
# on a CPU machine: python tools/dvc_pack.py unpack FILE). `collect` (python
# tools/gpu_validation.py collect RES) writes benchmarks/measured/gpu_validation.json and
# reports/gpu_validation.md. Needs the project's packages (pydantic, datasets, dvc, dvclive): on a GPU machine without
# network, copy the folder `make gpu-carry` builds (.gpu_carry: wheels + Fashion-MNIST) there and run `env` first.
set -u -o pipefail
BUDGET_S=${BUDGET_S:-570}
PACK_RESERVE_S=${PACK_RESERVE_S:-25}
MIN_JOB_S=${MIN_JOB_S:-5}
RES=${RES:-/tmp/gpu_validation}
source "$(dirname "$0")/lib.sh"  # T0, PY, DRY, CPUS, the environment; left, job, pack_res
export PATH=/tmp/site/bin:$PATH  # dvc's console script, installed by `env`
export PATH=$(dirname "$(command -v "$PY")"):$PATH  # dvc.yaml's stage commands call `python`
DEV=cuda; [ "$DRY" = 1 ] && DEV=cpu
CARRY=${CARRY:-.gpu_carry}
# the revision the copied checkout was made from (no .git is copied; make gpu-carry writes it)
[ -z "${GIT_REV:-}" ] && [ -s "$CARRY/git_rev" ] && GIT_REV=$(cat "$CARRY/git_rev")
export GIT_REV=${GIT_REV:-}

trap 'pack_res gpu_results.tar.gz' EXIT
trap 'exit 130' INT TERM

make_params() {  # make_params PROFILE KEY=VALUE...: params.yaml as `make profile` makes it, then a YAML-aware edit
  local profile=$1; shift
  cp "profiles/$profile.yaml" params.yaml || return 1
  [ $# -gt 0 ] && { $PY tools/set_params.py "$@" || return 1; }
  $PY -m dpnrepro.pipeline || return 1
}

phase_env() {  # the wheels of .gpu_carry (make gpu-carry) into /tmp/site, Fashion-MNIST where the profiles read it
  local whl=$CARRY/whl; [ -d "$whl" ] || whl=.whl
  if ls "$whl"/*.whl >/dev/null 2>&1 && ! $PY -c "import pydantic, datasets, dvc, dvclive" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$whl"/*.whl \
      || return 1
  fi
  local data=$CARRY/fashion-mnist; [ -d "$data" ] || data=.gpu_data/fashion-mnist
  if [ -d "$data" ] && [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    mkdir -p /usr/share/datasets/fashion-mnist && cp "$data"/*.gz /usr/share/datasets/fashion-mnist/
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

phase_fingerprint() {  # the CPU kernel fingerprint on this host's CPU (another model/vendor than the committed results' CPU), as a
  # stage pins it and with the switches of before (MKL_CBWR=AVX2,STRICT, oneDNN convolutions), 2 threads each
  lscpu > "$RES/lscpu.txt" 2>&1
  DPNREPRO_CPU_THREADS=2 job fingerprint_pinned 150 $PY -m dpnrepro.determinism.fingerprint --json "$RES/fingerprint_pinned.json"
  DPNREPRO_CPU_THREADS=2 DPNREPRO_CPU_KERNELS=native ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2,STRICT ONEDNN_MAX_CPU_ISA=AVX2 \
    job fingerprint_before 150 $PY -m dpnrepro.determinism.fingerprint --json "$RES/fingerprint_before.json"
}

phase_tests() {  # the CUDA tests (determinism included) and the compiled step's numerics
  local sel="cuda"  # the CUDA tests (determinism, compiled = eager, CUDA graphs with 2 micro-batches)
  [ "$DRY" = 1 ] && sel="kept_loss or begin_step"
  job tests "${TESTS_CAP_S:-300}" $PY -m pytest -q -p no:cacheprovider tests/test_determinism.py tests/test_step.py -k "$sel" \
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
  bench() { local name=$1; shift; job "$name" 300 $PY stages/benchmark.py $common "$@" --out-json "$RES/$name.json" --out-md "$RES/$name.md"; }
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
    job loop_dry 120 $PY tools/trainer_loop.py --arch Ti-16 --batch-size 4 --steps 2 --warmup 1 --workers 0 \
      --device cpu --synthetic-rounds 0 --out "$RES/loop_dry.json"
    return
  fi
  lp() { local name=$1; shift; job "$name" 300 $PY tools/trainer_loop.py --workers $w --synthetic-rounds 0 "$@" --out "$RES/$name.json"; }
  lp loop_b16_eager --arch B-16 --batch-size 256 --steps 20 --warmup 8
  lp loop_b16_compiled --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile
  lp loop_ti16_eager --arch Ti-16 --batch-size 256 --steps 30 --warmup 10
  lp loop_ti16_cudagraphs --arch Ti-16 --batch-size 256 --steps 30 --warmup 10 --compile --cudagraphs
  lp loop_b16_compiled_fast --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend fast
}

phase_input() {  # input.backend pil against fast under B/16 (full profile recipe), and a real-photo JPEG folder on disk
  [ "$DRY" = 1 ] && return
  local w=$(( CPUS > 2 ? CPUS - 2 : 1 ))
  lp() { local name=$1; shift; job "$name" 300 $PY tools/trainer_loop.py --workers $w --synthetic-rounds 0 "$@" --out "$RES/$name.json"; }
  lp loop_b16_compiled_pil --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend pil
  lp loop_b16_compiled_fast --arch B-16 --batch-size 256 --steps 20 --warmup 8 --compile --backend fast
  # the CPU input paths from a real-photo JPEG folder on disk (needs foolbox's wheel in .whl/, see photo_folder.py)
  if $PY -c "import foolbox" 2>/dev/null || ls .whl/foolbox-*.whl >/dev/null 2>&1; then
    job input_folder 300 $PY tools/bench_folder.py --train 20000 --val 0 --workers "$CPUS" --rounds 6 \
      --skip-prepare --tmp /tmp --out-json "$RES/input_folder.json" --out-md "$RES/input_folder.md"
  fi
}

phase_profile() {  # where Ti/16's eager step spends its time (torch.profiler, CPU and CUDA)
  [ "$DRY" = 1 ] && return
  job profile_ti16 300 $PY tools/step_profile.py --arch Ti-16 --batch-size 256 --out "$RES/profile_ti16.json"
}

phase_mini() {  # the mini profile's table1 sweep through `dvc repro train-table1`, one run after the other (resumable)
  [ "$DRY" = 1 ] && return
  if [ -s "$RES/mini_table1.json" ]; then echo "== mini: done before"; return; fi
  [ -d .git ] || { git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm "gpu run" ; }
  # runtime.* is tracked by no stage: this machine's loader workers (the profile already compiles + CUDA graphs)
  make_params mini "runtime.workers=$(( CPUS > 2 ? CPUS - 2 : 1 ))" || return 1
  rm -f .dvc/tmp/rwlock .dvc/tmp/lock  # a previous run's repro stopped at its time budget
  PATH=$(dirname "$(command -v $PY)"):$PATH job mini "${MINI_CAP_S:-100000}" $PY -m dpnrepro.dvc_graph repro \
    --times "$RES/mini_stage_times.json" train-table1 \
    && echo '{}' > "$RES/mini_table1.json"
}

table1_runs() {  # the runs of a sweep, one "arch stem seed run_dir" line each, in the stage's order
  $PY - "$1" <<'PY'
import sys
from dpnrepro.config.params import load_params
from dpnrepro.runs import resolve_runs
for r in resolve_runs(load_params(), sys.argv[1]):
    print(r.run.arch, r.run.stem, r.run.seed, r.dir)
PY
}

phase_table1() {  # the mini profile's table1 sweep (20 runs), TABLE1_JOBS runs at a time on the one GPU, in DVC
  # `dvc repro prepare` (through DVC); then the stage's own one-run command (stages/train.py --sweep table1 --arch
  # A --stem S --seed N: the same run as inside the whole-sweep command, seeded per run) TABLE1_JOBS at a time,
  # a finished run dir kept; when all are done `dvc commit train-table1` records them in dvc.lock (the stage was
  # not run by `dvc repro`: 20 runs x 25-35 s one after the other do not fit a 10-minute budget), `evaluate.py
  # --sweep table1` scores them (metrics/table1.json) and their CI + verdict go to RES/table1_summary.json.
  # DRY_RUN=1: the smoke profile's sweep shrunk to seconds, on the CPU.
  local jobs=${TABLE1_JOBS:-4} profile=mini
  local workers=$(( CPUS / jobs > 2 ? CPUS / jobs - 1 : 1 ))
  [ -d .git ] || { git init -q && git add -A && git -c user.name=gpu -c user.email=gpu@localhost commit -qm "gpu run" ; }
  if [ "$DRY" = 1 ]; then
    profile=smoke
    make_params $profile "runtime.workers=0" "table1.archs=[Mu-7]" "table1.recipe={}" "train.steps=4" \
      "train.warmup_steps=1" "data.train_examples=256" "data.val_examples=128" "data.minival_examples=64" \
      "data.format=idx" "data.source=/usr/share/datasets/fashion-mnist" "export_imagefolder=null" \
      "data_i21k.train_examples=256" "data_jft.train_examples=256" || return 1
  else
    make_params $profile "runtime.workers=$workers" || return 1
  fi
  rm -f .dvc/tmp/rwlock .dvc/tmp/lock
  local dvc="$PY -m dvc"
  job table1_prepare "${PREPARE_CAP_S:-150}" $dvc repro prepare || return 1
  table1_runs table1 > "$RES/table1_runs.txt" || return 1
  echo "== table1: $(wc -l < "$RES/table1_runs.txt") runs, $jobs at a time, $workers loader workers each"
  export DPNREPRO_CPU_THREADS=$(( CPUS / jobs > 1 ? CPUS / jobs : 1 )) TORCHINDUCTOR_COMPILE_THREADS=$(( CPUS / jobs > 1 ? CPUS / jobs : 1 ))
  # shellcheck disable=SC2016
  job table1_train "${TRAIN_CAP_S:-480}" xargs -P "$jobs" -L 1 bash -c '
    if [ -f "$3/model.safetensors" ]; then echo "kept $3"; exit 0; fi  # finished by an earlier run
    t=$(date +%s); '"$PY"' stages/train.py --sweep table1 --arch "$0" --stem "$1" --seed "$2" \
      > "$RES_DIR/table1_run_$0_$1_s$2.log" 2>&1; rc=$?
    echo "run $3: rc=$rc $(( $(date +%s) - t )) s"; exit $rc' < "$RES/table1_runs.txt"
  local rc=$?
  [ "$rc" = 0 ] || { echo "== table1: not every run finished (rc=$rc); rerun the phase on the warm machine to go on"; return 1; }
  $dvc commit -f train-table1 || return 1
  job table1_evaluate "${EVAL_CAP_S:-90}" $PY stages/evaluate.py --sweep table1 || return 1
  cp metrics/table1.json "$RES/table1_metrics.json"
  $PY - "$RES" <<'PY'
import json, sys
from dpnrepro.reports.tables import summarize_sweep
metrics = json.load(open("metrics/table1.json"))
json.dump(summarize_sweep(metrics), open(f"{sys.argv[1]}/table1_summary.json", "w"), indent=1, default=str)
PY
  $PY tools/dvc_pack.py pack "${OUT:-$RES}/gpu_artifacts.tar.gz" --stages train-table1 --extra metrics/table1.json \
    2>&1 | tee "$RES/table1_pack.log"
}

phase_collect() { $PY tools/gpu_validation.py collect "$RES"; }

phases=("$@"); [ ${#phases[@]} = 0 ] && phases=(env tests step loop input profile mini collect)
export RES_DIR=$RES
failed=() bg=
for p in "${phases[@]}"; do
  echo "######## phase $p ($(date +%T), $(( $(date +%s) - T0 )) s of ${BUDGET_S} s)"
  if [ "$p" = tests ] && [ "${TESTS_IN_BACKGROUND:-0}" = 1 ]; then  # beside the next phases (they share the GPU)
    phase_tests > "$RES/tests_phase.out" 2>&1 & bg=$!
    echo "######## phase tests runs in the background (pid $bg, output in RES/tests_phase.out)"; continue
  fi
  "phase_$p"; rc=$?
  [ "$rc" = 0 ] || { echo "######## phase $p failed (rc=$rc)"; failed+=("$p"); }
  printf 'phase\t%s\trc=%s\t%s\n' "$p" "$rc" "$(( $(date +%s) - T0 ))" >> "$RES/phases.tsv"
done
if [ -n "$bg" ]; then
  wait "$bg"; rc=$?; cat "$RES/tests_phase.out"
  [ "$rc" = 0 ] || { echo "######## phase tests failed (rc=$rc)"; failed+=(tests); }
  printf 'phase\ttests\trc=%s\t%s\n' "$rc" "$(( $(date +%s) - T0 ))" >> "$RES/phases.tsv"
fi
[ ${#failed[@]} = 0 ] || { echo "######## failed phases: ${failed[*]}"; exit 1; }
