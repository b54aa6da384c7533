"""Every test's seconds in two JUnit files (before, after), one row each, longest after first, with the
sums: the before/after table issue 39 asks for.  A pytest-xdist group suffix ("@live-certification") is
not part of a test's name.  Usage: per_test_table.py BEFORE.xml AFTER.xml [SUITE]"""
import re
import sys
import xml.etree.ElementTree as ET


def times(path):
    out = {}
    for tc in ET.parse(path).iter("testcase"):
        name = re.sub(r"@[\w-]+$", "", tc.get("name"))
        out[f"{tc.get('classname').split('.')[-1]}::{name}"] = float(tc.get("time"))
    return out


before, after = times(sys.argv[1]), times(sys.argv[2])
suite = sys.argv[3] if len(sys.argv) > 3 else ""
names = sorted(before.keys() | after.keys(), key=lambda k: -after.get(k, 0.0))
print(f"{suite} tests: {len(before)} before, {len(after)} after, {len(before.keys() & after.keys())} in both")
print(f"summed test time: {sum(before.values()):.0f} s before, {sum(after.values()):.0f} s after")
print(f"{'before s':>9} {'after s':>9}  test")
for k in names:
    b = f"{before[k]:9.1f}" if k in before else f"{'-':>9}"
    a = f"{after[k]:9.1f}" if k in after else f"{'-':>9}"
    print(f"{b} {a}  {k}")
