#!/bin/bash
# one line per 10 s: epoch, user+nice+sys jiffies, idle+iowait jiffies (all CPUs)
while :; do
  read -r _ u n s i w q sq st _ < /proc/stat
  echo "$(date +%s) $((u+n+s+q+sq+st)) $((i+w))"
  sleep 10
done
