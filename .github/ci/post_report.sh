#!/usr/bin/env bash
# CI: post the report of `make pr-report` as the job summary and, on a pull request whose token may
# write (not a fork's pull request to its upstream), as the pull request's comment, edited on each push.
#   bash .github/ci/post_report.sh REPORT.md
# Reads GITHUB_STEP_SUMMARY, PR_NUMBER, GH_TOKEN and GH_REPO (set by the workflow); a missing `gh` or a
# refused comment is a note, not a failure. The comment carries MARKER: a later push edits the last comment
# that has it, never another bot's or person's comment.
set -euo pipefail
MARKER='<!-- dpnrepro-pr-report -->'
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
body=$(mktemp)
trap 'rm -f "$body"' EXIT
{ echo "$MARKER"; cat "$report"; } > "$body"
ours=$(gh api --paginate "repos/{owner}/{repo}/issues/$PR_NUMBER/comments" \
         --jq ".[] | select(.body | startswith(\"$MARKER\")) | .id" 2>/dev/null | tail -n 1 || true)
if [ -n "$ours" ]; then
  if gh api -X PATCH "repos/{owner}/{repo}/issues/comments/$ours" -F "body=@$body" >/dev/null; then
    echo "[ci] report updated in comment $ours of pull request #$PR_NUMBER"; exit 0
  fi
elif gh pr comment "$PR_NUMBER" --body-file "$body"; then
  echo "[ci] report posted on pull request #$PR_NUMBER"; exit 0
fi
echo "[ci] note: the token may not comment (a fork's pull request gets a read-only one); the job summary has the report"
