"""Batched re-prefill against token-by-token decode at depth, on one worker (issue 41 finding): prefill N
generated tokens, decode 9 one at a time; in a second session prefill the same prompt, then feed the first
8 decoded tokens in one pass, and compare the rows of those 8 positions (one at a time against batched).  Usage (a built .work): DGR_WORK=... python
reprefill_vs_decode.py tiny-v4 "[(0,12)]" 4352"""
import sys, os
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import numpy as np
from core.context import Context
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand, launch
from pipeline import drive, routes
from pipeline.routes import PassOptions, chunked
from certify import depth_prompt
model_name, placement, n = sys.argv[1], eval(sys.argv[2]), int(sys.argv[3])
work = Path(os.environ["DGR_WORK"])
binary = next(work.glob("build/cpu-*/bin/dgr-shard-worker"))
model = next(work.glob(f"store/{model_name}/f32/*00001-of-*.gguf"))
stubs = stubs_mod.load(Context.from_env({**os.environ, "DGR_WORK": str(work)}).workspace)
cmd = WorkerCommand(program=(str(binary),), model=model, threads=1, ctx_size=4608, batch=256)
with launch(cmd, placement, stubs=stubs, evidence=Path("/tmp/exp/ev2"), env=dict(os.environ), start_timeout=300, call_deadline=600) as p:
    infos = drive.describe(p.clients)
    prompt = depth_prompt.long_prompt(20261206, n, p.clients[0].tokenize)
    with routes.RELAYED.open(p.clients, infos) as r:
        o = PassOptions(all_logits=True)
        s1 = drive.new_session("a")
        passes = r.prefill(s1, 1, chunked(prompt, 256), PassOptions())
        toks = [int(np.argmax(passes[-1].logits[-1]))]
        rows = []
        for i in range(9):
            done = r.forward(s1, 1, [n + i], [toks[-1]], o)
            rows.append(done.logits[-1]); toks.append(int(np.argmax(rows[-1])))
        s2 = drive.new_session("b")
        r.prefill(s2, 1, chunked(prompt, 256), PassOptions())
        # the 8 decoded tokens again, in one batch of their own (a re-prefill's last pass)
        last = r.forward(s2, 1, list(range(n, n + 8)), toks[:8], o).logits
        for i in range(8):
            a, b = rows[i], last[i]
            top = np.argsort(a)[::-1][:2]
            print(i, "tok", toks[i+1], int(np.argmax(b)), "margin", float(a[top[0]]-a[top[1]]), "maxdiff", float(np.abs(a-b).max()))
        drive.reset_session(p.clients, s1); drive.reset_session(p.clients, s2)
