"""The Vulkan capture crash under valgrind memcheck (issue 42 item 7): one monolithic Vulkan worker on
lavapipe, started under valgrind (--smc-check for the driver's JIT code, a large free list so a freed
block keeps the stack that freed it), one session: a 4-token prefill, then three one-token decodes, each
capturing the inputs of layers 1..11.  Run from the repository root with DGR_WORK pointing at a workspace
that has tiny-llama provisioned:
    DGR_WORK=/tmp/dev-work python docs/measurements/issue-42/vulkan_capture_valgrind.py WORKER OUT
Takes about 10 minutes on the 2-core box; valgrind writes OUT/vg.<pid>.  Outputs:
vulkan_capture_valgrind_before.txt (patches 0001-0006), vulkan_capture_valgrind_after.txt (with 0007)."""
import os, sys
from pathlib import Path
from core.context import Context
from worker import stubs as stubs_mod
from worker.launcher import WorkerCommand, launch
worker, out = sys.argv[1], Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
ctx = Context.from_env()
stubs = stubs_mod.load(ctx.workspace)
model = next(Path(ctx.workspace.store / "tiny-llama").rglob("*00001-of-*.gguf"))
vg = ("valgrind", "--smc-check=all-non-file", "--error-limit=no", f"--log-file={out}/vg.%p", "--num-callers=40",
      "--freelist-vol=2000000000", "--freelist-big-blocks=100000000")
cmd = WorkerCommand(program=(*vg, worker), model=model, threads=2, ctx_size=512, lane="vulkan")
env = dict(os.environ, VK_ICD_FILENAMES="/usr/share/vulkan/icd.d/lvp_icd.x86_64.json", GGML_VK_VISIBLE_DEVICES="0")
n = 4
try:
    with launch(cmd, [(0, 12)], stubs=stubs, evidence=out / "ev", env=env, start_timeout=1200, call_deadline=1800) as p:
        c = p.clients[0]
        c.forward("s", 1, range(n), tokens=[1 + (7 * i) % 97 for i in range(n)], all_logits=True, capture_layers=list(range(1, 12)))
        for k in range(3):
            c.forward("s", 1, [n + k], tokens=[5], all_logits=True, capture_layers=list(range(1, 12)))
    print("ok")
except Exception as e:
    print("FAILED", str(e)[:300])
