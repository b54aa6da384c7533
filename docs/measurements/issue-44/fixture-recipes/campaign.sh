#!/bin/bash
# Certify both fixture recipes repeatedly: quiet, under two busy-loop processes (the loaded 2-core box),
# and with 2 threads per worker; every log and certificate path kept under /tmp/s11/measure.
cd /tmp/s11-recipes
export DGR_WORK=/tmp/dev-work CCACHE_DIR=/tmp/dev-ccache PYTHONPATH=/tmp/s11-recipes
run() {  # label recipe [env...]
  local label=$1 recipe=$2; shift 2
  local log=/tmp/s11/measure/$label-$recipe.log
  echo "== $label $recipe load $(cut -d' ' -f1-3 /proc/loadavg)" >> /tmp/s11/measure/index.txt
  ( env "$@" /usr/bin/time -f "wall %e s" /tmp/dev-venv/bin/python -m certify certify --recipe $recipe --lane cpu ) > $log 2>&1
  grep -h "^verdict\|^certificate\|^wall" $log >> /tmp/s11/measure/index.txt
}
for i in 1 2; do for r in roster-qwen3next roster-qwen2vl; do run quiet$i $r; done; done
for r in roster-qwen3next roster-qwen2vl; do run threads2 $r DGR_WORKER_THREADS=2; done
python3 -c 'while True: pass' & B1=$!
python3 -c 'while True: pass' & B2=$!
sleep 5
for i in 1 2; do for r in roster-qwen3next roster-qwen2vl; do run loaded$i $r; done; done
kill $B1 $B2
