#!/usr/bin/env bash
# Paired ring bench: before (a6ed318, /tmp/before) and after (/work/main HEAD), order A B B A.
set -uo pipefail
out=${1:-/work/shared/notes/logs/issue-40/bench-pair}
mkdir -p "$out"
run() {  # $1 label, $2 tree, $3 workdir
  ( cd "$2" && DGR_WORK="$3" PYTHONPATH="$2" PYTHONDONTWRITEBYTECODE=1 /tmp/venv/bin/python -m pytest tests/bench/test_bench_ring.py -m slow -s -p no:cacheprovider --benchmark-only -n0 \
      --benchmark-json="$out/$1.json" ) > "$out/$1.log" 2>&1
  echo "$1 rc=$? $(date +%T)"
}
echo "start $(date +%T) head=$(git -C /work/main rev-parse --short HEAD)"
run before-1 /tmp/before /tmp/before-work
run after-1 /work/main /tmp/after-work
run after-2 /work/main /tmp/after-work
run before-2 /tmp/before /tmp/before-work
