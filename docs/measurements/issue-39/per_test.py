"""Per-test seconds of two slow-suite JUnit files (serial vs two xdist workers): sums, and the tests whose
time changed most."""
import sys
import xml.etree.ElementTree as ET

def times(path):
    return {f"{tc.get('classname')}::{tc.get('name')}": float(tc.get("time")) for tc in ET.parse(path).iter("testcase")}

a, b = times(sys.argv[1]), times(sys.argv[2])
shared = a.keys() & b.keys()
print(f"tests: {len(a)} / {len(b)}, in both {len(shared)}; summed test time {sum(a.values()):.0f} s / {sum(b.values()):.0f} s")
rows = sorted(shared, key=lambda k: b[k] - a[k], reverse=True)
print("slower most:")
for k in rows[:12]:
    print(f"  {a[k]:7.1f} -> {b[k]:7.1f} s  {k.split('.')[-1]}")
print("faster most:")
for k in rows[-6:]:
    print(f"  {a[k]:7.1f} -> {b[k]:7.1f} s  {k.split('.')[-1]}")
