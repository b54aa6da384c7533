#!/bin/bash
# One spinning test beside one busy loop, libgomp's default spin count against 1000.
cd /tmp/ci-q
( while :; do :; done ) & busy=$!
for spin in 300000 1000; do
  start=$(date +%s.%N)
  GOMP_SPINCOUNT=$spin .nox/tests/bin/pytest -q -p no:cacheprovider -m slow "tests/integration/test_mtp_workers.py::test_mtp_on_chooses_the_tokens_mtp_off_chooses" 2>&1 | tail -1
  echo "GOMP_SPINCOUNT=$spin: $(echo "$(date +%s.%N) - $start" | bc) s wall beside one busy loop"
done
kill $busy
