"""Compare the ring bench's tok/s tables: before (2 runs) vs after (2 runs), per placement and mode."""
import re, sys, statistics
from pathlib import Path
d = Path(sys.argv[1])
def table(name):
    rows = {}
    for line in (d / f"{name}.log").read_text().splitlines():
        m = re.match(r"\s+(monolithic|\d+-stages)\s+(relayed|chained|ring-unary|ring)\s+([\d.]+)\s+([\d.]+)", line)
        if m: rows[(m[1], m[2])] = (float(m[3]), float(m[4]))
    return rows
runs = {n: table(n) for n in ("before-1", "before-2", "after-1", "after-2")}
print(f"{'placement':11} {'mode':10} {'before-1':>14} {'before-2':>14} {'after-1':>14} {'after-2':>14} {'after/before':>12} {'b-b spread':>10} in?")
inside = 0
for key in runs["before-1"]:
    b = [runs[n][key][0] for n in ("before-1", "before-2")]
    a = [runs[n][key][0] for n in ("after-1", "after-2")]
    lo = min(b[0] - runs["before-1"][key][1], b[1] - runs["before-2"][key][1])
    hi = max(b[0] + runs["before-1"][key][1], b[1] + runs["before-2"][key][1])
    ok = all(lo <= x <= hi for x in a) or (min(b) <= statistics.mean(a) <= max(b))
    inside += ok
    cells = " ".join(f"{runs[n][key][0]:7.1f}±{runs[n][key][1]:5.1f}" for n in runs)
    print(f"{key[0]:11} {key[1]:10} {cells} {statistics.mean(a)/statistics.mean(b):12.3f} {abs(b[0]-b[1])/statistics.mean(b):10.3f} {'yes' if ok else 'NO'}")
print(f"{inside}/{len(runs['before-1'])} within before's spread (each after figure inside [min(before - IQR), max(before + IQR)], or the after mean between the two befores)")
