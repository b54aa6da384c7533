"""Ad hoc: our monolithic worker's token-only ring under ``perf stat``, to read beside
``dgr-ring-floor --stages 1`` under the same (perf-mono-vs-floor-2af2116.txt).

DGR_BUILD=<a CPU lane build folder> DGR_TINY_MODEL=<tiny-llama's first split file> python perf_mono.py
"""

import os
import subprocess
import time
from pathlib import Path

from core.context import Context
from pipeline import drive, routes
from worker.launcher import WorkerCommand, launch
from worker.stubs import load as load_stubs

N = 64
REPETITIONS = 20

build = Path(os.environ["DGR_BUILD"])
cmd = WorkerCommand(
    program=(str(build / "bin/dgr-shard-worker"),),
    model=Path(os.environ["DGR_TINY_MODEL"]),
    threads=1,
    ctx_size=512,
    lane="cpu",
)
stubs = load_stubs(Context.from_env().workspace)
evidence = Path(os.environ.get("DGR_EVIDENCE", "/tmp/perf-ev"))
with launch(cmd, [(0, 12)], stubs=stubs, env=dict(os.environ), evidence=evidence) as p:
    prompt = p.clients[0].tokenize("", add_special=True) or [1]
    ring = routes.Ring(logits=False)
    drive.measure_speed(p.clients, prompt, N + 1, repetitions=2, warmup=1, route=ring)
    events = "task-clock,context-switches,cpu-migrations"
    perf = subprocess.Popen(
        ["perf", "stat", "-x,", "-e", events, "-p", str(p.stages[0].pid)], stderr=subprocess.PIPE, text=True
    )
    time.sleep(0.5)
    s = drive.measure_speed(p.clients, prompt, N + 1, repetitions=REPETITIONS, warmup=0, route=ring)
    perf.send_signal(2)
    counted = perf.communicate()[1]
print("ours tok/s median", sorted(s.decode_tok_s)[len(s.decode_tok_s) // 2])
for line in counted.strip().splitlines():
    value, _, event = line.split(",")[:3]
    print(f"ours {event}: {float(value) / (REPETITIONS * N):.3f} per token")
