"""One line per placement of a certification: decode/prefill medians, staged/mono decode, the f16 seam's
parity figures (the limits of the fixture recipes are set from these; docs/measurements/issue-44)."""
import base64, json, sys

for path in sys.argv[1:]:
    cert = json.load(open(path))
    pred = json.loads(base64.b64decode(cert["payload"]))["predicate"]
    figs = pred["figures"]
    mono = next(p for p in figs["placements"] if p["name"] == "mono")
    md = mono["speed"]["decode_tok_s"]["median"]
    threads = mono["threads"][0]
    print(f'{pred["recipe"]["name"]} {pred["verdict"]["status"]} threads {threads} run {path.split("/")[-2]}')
    for p in figs["placements"]:
        s = p["speed"]
        d, pf = s["decode_tok_s"]["median"], s["prefill_tok_s"]["median"]
        par = p.get("parity", {})
        extra = ""
        if p["boundary_dtype"] == "f16":
            extra = " ".join(f"{k}={par[k]:.3g}" for k in par if k != "bitwise_logits" and isinstance(par[k], float))
        elif par:
            extra = f'bitwise={par.get("bitwise_logits")} maxdiff={par.get("max_abs_logit_diff")}'
        print(f'  {p["name"]:22} decode {d:7.1f} prefill {pf:7.1f} ratio {d / md:5.2f} {extra}')
