"""Key-by-key comparison of two certificates' predicates (DSSE envelope -> in-toto statement ->
predicate): the key paths each has, their order, and every parity, agreement and token value."""
import base64, json, sys

def predicate(path):
    env = json.load(open(path))
    return json.loads(base64.b64decode(env["payload"]))["predicate"]

def paths(node, prefix=""):
    out = {}
    if isinstance(node, dict):
        for k, v in node.items():
            out.update(paths(v, f"{prefix}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.update(paths(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = node
    return out

a, b = paths(predicate(sys.argv[1])), paths(predicate(sys.argv[2]))
print(f"key paths: before {len(a)}, after {len(b)}, in both {len(a.keys() & b.keys())}")
print("only before:", sorted(a.keys() - b.keys()))
print("only after:", sorted(b.keys() - a.keys()))
both = [k for k in a if k in b]
print("order of shared key paths identical:", both == [k for k in b if k in a])
WORDS = ("parity", "agreement", "token", "bitwise", "top1", "kl_", "nmse", "greedy", "route_change", "status")
judged = [k for k in both if any(w in k.lower() for w in WORDS) and "seconds" not in k and "tok_s" not in k and not k.endswith("_s")]  # timings differ run to run
diff = [k for k in judged if a[k] != b[k]]
print(f"parity/agreement/token/status values compared: {len(judged)}, different: {len(diff)}")
for k in diff[:40]:
    print(f"  {k}: {a[k]!r} -> {b[k]!r}")
