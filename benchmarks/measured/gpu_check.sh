#!/bin/bash
# The one GPU check of a lend (tools/gpu_check.py; the plan per step: benchmarks/measured/README.md):
#
#   bash benchmarks/measured/gpu_check.sh start && WAIT_S=500 bash benchmarks/measured/gpu_check.sh collect
#   bash benchmarks/measured/gpu_check.sh collect      # next call, at once: the files left
#
# The project is not installed on a lent machine: its src/ and the carried site folder go on PYTHONPATH here.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SITE=${SITE:-/tmp/site}
export SITE PYTHONPATH=$ROOT/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
exec "${PYTHON:-python3}" "$ROOT/tools/gpu_check.py" "$@"
