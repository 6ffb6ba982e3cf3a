#!/usr/bin/env bash
# CI: the report of `make pr-report` against the change's base, written to OUT.
#   bash .github/ci/pr_report.sh OUT
# Reads PR_BASE (a pull request's base commit), PUSH_BEFORE (the commit before a push), BASE_BRANCH and
# ARTIFACT_URL (set by the workflow). The base is the first of PR_BASE, PUSH_BEFORE that this clone holds,
# else the merge base of HEAD and origin/BASE_BRANCH; a force-push leaves `before` unfetched. Where none is
# a commit other than HEAD (a force-push to the base branch itself), the report says "no base" and the
# step passes. The tables and figures were regenerated in CI: the report points at ARTIFACT_URL for them.
set -euo pipefail
out=${1:?usage: pr_report.sh OUT}
head=$(git rev-parse HEAD)
is_base() { [ -n "$1" ] && git cat-file -e "$1^{commit}" 2>/dev/null && [ "$(git rev-parse "$1^{commit}")" != "$head" ]; }
base=""
for candidate in "${PR_BASE:-}" "${PUSH_BEFORE:-}"; do
  if is_base "$candidate"; then base=$candidate; break; fi
  [ -z "$candidate" ] || echo "[ci] note: $candidate is not a base this clone holds (a force-push, or a new branch)"
done
if [ -z "$base" ] && [ -n "${BASE_BRANCH:-}" ]; then
  merge_base=$(git merge-base HEAD "origin/$BASE_BRANCH" 2>/dev/null || true)
  if is_base "$merge_base"; then
    base=$merge_base
    echo "[ci] comparing with the merge base of HEAD and origin/$BASE_BRANCH"
  fi
fi
if [ -z "$base" ]; then
  printf '%s\n\n%s\n' "## What this change does to the paper's tables" \
    "No base: no commit before this one to compare with (a force-push to \`${BASE_BRANCH:-the base branch}\`?). The tables and figures this run made are in its artifact \`reports\`." > "$out"
  echo "[ci] no base revision: the report says so"
  exit 0
fi
args=""; [ -z "${ARTIFACT_URL:-}" ] || args="--artifact-url $ARTIFACT_URL"
make pr-report BASE="$base" OUT="$out" PR_REPORT_ARGS="$args"
