#!/usr/bin/env bash
# The default `dgr certify` before (a6ed318) and after (HEAD), each in its own workspace.
out=/work/shared/notes/logs/issue-40/predicate; mkdir -p $out
for side in before after; do
  tree=$([ $side = before ] && echo /tmp/before || echo /work/main)
  ( cd $tree && DGR_WORK=/tmp/$side-work PYTHONPATH=$tree PYTHONDONTWRITEBYTECODE=1 timeout 1200 /tmp/venv/bin/python -m certify certify ) > $out/$side.log 2>&1
  echo "$side rc=$? $(date +%T)"
done
