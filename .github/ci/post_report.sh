#!/usr/bin/env bash
# CI: post the report of `make pr-report` as the job summary and, on a pull request whose token may
# write (not a fork's pull request to its upstream), as the pull request's comment, edited on each push.
#   bash .github/ci/post_report.sh REPORT.md
# Reads GITHUB_STEP_SUMMARY, PR_NUMBER and GH_TOKEN (set by the workflow); a missing `gh` or a refused
# comment is a note, not a failure.
set -euo pipefail
report=${1:?usage: post_report.sh REPORT.md}
[ -f "$report" ] || { echo "error: no report at $report" >&2; exit 2; }
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
  cat "$report" >> "$GITHUB_STEP_SUMMARY"
  echo "[ci] report added to the job summary"
fi
if [ -z "${PR_NUMBER:-}" ] || [ -z "${GH_TOKEN:-}" ]; then
  echo "[ci] not a pull request, or no token: no comment"
  exit 0
fi
if ! command -v gh >/dev/null; then
  { apt-get update -qq && apt-get install -y -qq gh; } >/dev/null 2>&1 || { echo "[ci] note: no gh CLI, no comment"; exit 0; }
fi
if gh pr comment "$PR_NUMBER" --body-file "$report" --edit-last 2>/dev/null \
   || gh pr comment "$PR_NUMBER" --body-file "$report"; then
  echo "[ci] report posted on pull request #$PR_NUMBER"
else
  echo "[ci] note: the token may not comment (a fork's pull request gets a read-only one); the job summary has the report"
fi
