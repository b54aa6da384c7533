#!/bin/bash
# Line coverage of the product code over both suites at one commit, on a fresh clone with cold caches
# (issue 39's "coverage before and after"): coverage.sh COMMIT OUT_DIR.  About 40-50 minutes each on the
# 2-core box (coverage slows the suites); run nothing else beside it.  Writes OUT_DIR/coverage-COMMIT.txt
# (coverage report) and the run's log.
set -u
commit=$1; out=$2
work=/tmp/cov-$commit
rm -rf "$work" "/tmp/cov-ccache-$commit"; mkdir -p "$out" "/tmp/cov-ccache-$commit"
git clone -q "$(git rev-parse --show-toplevel)" "$work" && git -C "$work" checkout -q "$commit" || exit 2
cd "$work" || exit 2
rm -f .coverage*
started=$(date +%s)
CCACHE_DIR=/tmp/cov-ccache-$commit CI=true nox -s tests -- --cov --cov-append --cov-report= \
  > "$out/coverage-run-$commit.log" 2>&1
rc=$?
echo "rc=$rc wall=$(( $(date +%s) - started )) s" >> "$out/coverage-run-$commit.log"
.nox/tests/bin/coverage report > "$out/coverage-$commit.txt" 2>&1
tail -1 "$out/coverage-$commit.txt"
exit $rc
