#!/bin/bash
# The one GPU check of a lend (tools/gpu_check.py; the plan per step: benchmarks/measured/README.md):
#
#   bash benchmarks/measured/gpu_check.sh start && WAIT_S=500 bash benchmarks/measured/gpu_check.sh collect
#   bash benchmarks/measured/gpu_check.sh collect      # the next call, at once: the files left
#
# The project is not installed on a lent machine: its src/ and the carried site folder go on PYTHONPATH here.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SITE=${SITE:-/tmp/site}
export SITE PYTHONPATH=$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
driver() { exec "${PYTHON:-python3}" "$ROOT/tools/gpu_check.py" "$1"; }
phase_start() { driver start; }      # the steps, detached (setsid): they survive between device calls
phase_collect() { driver collect; }  # what is ready, into $OUT: at most 8 files, HANDBACK_MIB (60) MiB
phase_run() { driver run; }          # the steps in the foreground
case ${1:-} in start | collect | run) "phase_$1" ;; *) echo "error: usage: $0 start|collect|run" >&2; exit 2 ;; esac
