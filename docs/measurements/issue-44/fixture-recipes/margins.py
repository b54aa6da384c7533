"""The smallest top-1/top-2 logit margin over the rows a recipe's parity gate compares (the monolithic
worker, the recipe's prompts and decode length): how far an f16 seam's rounding is from flipping a pick."""
import sys
from pathlib import Path

import numpy as np

from certify.inputs import ctx_size
from core.context import Context
from fetch.provision import provision
from lanes.build import ensure_build, fetch_tools
from manifests.recipe_model import load
from pipeline import drive
from worker.launcher import WorkerCommand, launch
from worker.stubs import load as load_stubs

ctx = Context.from_env()
for name in sys.argv[1:]:
    recipe = load(name, ctx.env)
    model = provision(ctx, recipe.artifacts, tools=fetch_tools(ctx)).files[0]
    build = ensure_build(ctx, "cpu")
    cmd = WorkerCommand(program=(str(build.worker),), model=Path(model), threads=1, ctx_size=ctx_size(recipe), lane="cpu")
    with launch(cmd, [(0, recipe.n_layer)], stubs=load_stubs(ctx.workspace), evidence=Path(f"/tmp/s11/margins/{name}"), env=dict(ctx.env)) as run:
        client = run.clients[0]
        prompts = [client.tokenize(t, add_special=True) for t in recipe.prompts.texts]
        trace = drive.run_placement(run.clients, prompts, recipe.n_decode)
    rows = np.concatenate([p.logits for p in trace.prompts])
    top = np.sort(rows, axis=1)[:, -2:]
    margin = top[:, 1] - top[:, 0]
    spread = rows.max(axis=1) - rows.min(axis=1)
    print(f"{name}: {len(rows)} rows, prompt tokens {[len(p) for p in prompts]}, min top-1 margin {margin.min():.3g}, "
          f"median {np.median(margin):.3g}, logit range per row median {np.median(spread):.3g}")
