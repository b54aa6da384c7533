"""The Vulkan capture crash, narrowed (issue 42 item 7): one monolithic Vulkan worker on lavapipe and the
tiny model, one session: a first Forward, then three one-token Forwards; each case says whether the first
and the later passes capture the layer inputs (1..11) and whether the first asks for every row's logits.
Run from the repository root with DGR_WORK pointing at a workspace that has the Vulkan lane built (the
build folder below) and tiny-llama provisioned:
    DGR_WORK=/tmp/dev-work python docs/measurements/issue-42/vulkan_capture_repro.py [WORKER [CASE ...]]
WORKER: the worker binary (default: the Vulkan lane's build below); CASE: run only these cases.
Output at f9f7f48: vulkan_capture_repro.txt."""
import os, sys
from pathlib import Path
from core.context import Context
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand, launch
ctx = Context.from_env()
stubs = stubs_mod.load(ctx.workspace)
model = next(Path("/tmp/dev-work/store/tiny-llama").rglob("*00001-of-*.gguf"))
worker = sys.argv[1] if len(sys.argv) > 1 else "/tmp/dev-work/build/vulkan-d33e63d5a665b12c/bin/dgr-shard-worker"
cmd = WorkerCommand(program=(worker,), model=model, threads=2, ctx_size=512, lane="vulkan")
env = dict(os.environ, VK_ICD_FILENAMES="/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", GGML_VK_VISIBLE_DEVICES="0")
# name: (prompt tokens, every row's logits, the first pass captures, the later passes capture)
cases = {"prefill13-all-cap+decode-cap": (13, True, True, True), "prefill13-cap+decode-cap": (13, False, True, True),
         "prefill13-all-cap+decode-nocap": (13, True, True, False), "prefill4-all-cap+decode-cap": (4, True, True, True),
         "prefill13-all-nocap+decode-cap": (13, True, False, True), "prefill13-all-nocap+decode-nocap": (13, True, False, False)}
only = set(sys.argv[2:])
for name, (n, all_logits, cap1, cap2) in cases.items():
    if only and name not in only:
        continue
    try:
        with launch(cmd, [(0, 12)], stubs=stubs, evidence=Path(f"/tmp/vkcap/{name}"), env=env) as p:
            c = p.clients[0]
            toks = [1 + (7 * i) % 97 for i in range(n)]
            c.forward("s", 1, range(n), tokens=toks, all_logits=all_logits, capture_layers=list(range(1, 12)) if cap1 else [])
            for k in range(3):
                c.forward("s", 1, [n + k], tokens=[5], all_logits=all_logits, capture_layers=list(range(1, 12)) if cap2 else [])
            print(name, "ok", flush=True)
    except Exception as e:
        print(name, "FAILED", str(e)[:120], flush=True)
