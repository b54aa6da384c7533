"""Python cost of one relayed decode pass over 12 stages whose Forward answers at once (no gRPC, no
compute): the driver's own overhead per pass, for the tree on sys.path (before: drive._forward_all,
after: routes.RelayedRoute.forward)."""
import sys, time, types
import numpy as np
from worker.client import Forwarded

N, WIDTH, VOCAB = 12, 64, 32000

class Info(types.SimpleNamespace):
    pass

def info(k):
    return Info(layer_begin=k, layer_end=k + 1, last_stage=k == N - 1, first_stage=k == 0,
                needs_token_sideband=False, mtp=False, n_embd=WIDTH, boundary_width=WIDTH, n_vocab=VOCAB)

class Stage:
    def __init__(self, last):
        b = np.zeros((1, WIDTH), np.float32)
        self.reply = Forwarded(boundary=None if last else b, boundary_wire=None if last else object(),
                               boundary_bytes=0 if last else WIDTH * 4,
                               logits=np.zeros((1, VOCAB), np.float32) if last else None,
                               wall_seconds=0.0, compute_seconds=0.0)
    def forward(self, *a, **k):
        return self.reply
    def failure(self, *a):
        return RuntimeError(a)

stages = [Stage(k == N - 1) for k in range(N)]
infos = [info(k) for k in range(N)]
if sys.argv[1] == "before":
    from pipeline import drive
    one = lambda p: drive._forward_all(stages, infos, "s", 1, [p], [5], boundary_dtype="f32", all_logits=False, capture=(), keep_boundaries=False)
else:
    from pipeline import routes
    r = routes.RelayedRoute(routes.Relayed(), stages, infos)
    opts = routes.PassOptions(boundary_dtype="f32", keep_boundaries=False)
    one = lambda p: r.forward("s", 1, [p], [5], opts)
best = []
for rep in range(7):
    t = time.perf_counter()
    for p in range(2000):
        one(p)
    best.append((time.perf_counter() - t) / 2000)
print(f"{sys.argv[1]}: {min(best)*1e6:.1f} us per 12-stage relayed pass (min of 7 x 2000), median {sorted(best)[3]*1e6:.1f}")
