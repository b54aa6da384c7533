"""Both ABBA pairs pooled: per placement and mode, the four before runs' range and the four after runs' mean."""
import re, statistics, sys
from pathlib import Path
def table(path):
    rows = {}
    for line in Path(path).read_text().splitlines():
        m = re.match(r"\s+(monolithic|\d+-stages)\s+(relayed|chained|ring-unary|ring)\s+([\d.]+)", line)
        if m: rows[(m[1], m[2])] = float(m[3])
    return rows
pairs = sys.argv[1:]
before = [table(f"{p}/{n}.log") for p in pairs for n in ("before-1", "before-2")]
after = [table(f"{p}/{n}.log") for p in pairs for n in ("after-1", "after-2")]
inside, ratios = 0, []
print(f"{'placement':11} {'mode':10} {'before min..max':>16} {'before mean':>11} {'after mean':>10} {'ratio':>6} in-range")
for key in before[0]:
    b, a = [t[key] for t in before], [t[key] for t in after]
    ok = min(b) <= statistics.mean(a) <= max(b); inside += ok
    r = statistics.mean(a) / statistics.mean(b); ratios.append(r)
    print(f"{key[0]:11} {key[1]:10} {min(b):7.1f}..{max(b):7.1f} {statistics.mean(b):11.1f} {statistics.mean(a):10.1f} {r:6.3f} {'yes' if ok else 'NO'}")
print(f"{inside}/{len(ratios)} after means inside the before runs' range; ratio after/before: median {statistics.median(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f}")
