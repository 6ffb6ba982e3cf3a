#!/usr/bin/env bash
# CI: use the fork's DVC remote when the repository secret DVC_REMOTE_URL names one (docs/ci.md).
# With a remote, `dvc pull` brings the outputs the base already made, so `dvc repro` reruns only what the
# change reaches; without one, or when the pull fails, `dvc repro` runs the whole smoke pipeline.
set -euo pipefail
cd "$(dirname "$0")/../.."
DVC=${VENV:-.venv}/bin/dvc
if [ -z "${DVC_REMOTE_URL:-}" ]; then
  echo "[ci] no DVC remote (secret DVC_REMOTE_URL unset): dvc repro runs the whole smoke pipeline"
  exit 0
fi
"$DVC" remote add --local --force --default ci "$DVC_REMOTE_URL"
if "$DVC" pull; then
  echo "[ci] pulled the cache from the DVC remote: dvc repro reruns only what the change reaches"
else
  echo "[ci] warning: dvc pull did not bring every output (a new one, or credentials: docs/ci.md): dvc repro reruns what is missing" >&2
fi
