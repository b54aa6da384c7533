"""Test functions and assert statements per test file at two commits (issue 39's "nothing dropped").

Usage: python3 count_asserts.py BEFORE AFTER  (run inside the repository; reads the files through
`git show`, so neither commit is checked out).  Counts `def test_*` and `assert` statements (helpers
included: an assert in a helper runs for every test that calls it) in tests/unit and tests/integration,
per file, and prints the files whose counts fell.
"""

import ast
import subprocess
import sys


def files(commit: str) -> list[str]:
    out = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "tests/"], capture_output=True, text=True, check=True)
    return [p for p in out.stdout.split() if p.endswith(".py") and p.split("/")[1] in ("unit", "integration")]


def counts(commit: str, path: str) -> tuple[int, int]:
    text = subprocess.run(["git", "show", f"{commit}:{path}"], capture_output=True, text=True, check=True).stdout
    tree = ast.parse(text)
    tests = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test_") for n in ast.walk(tree))
    asserts = sum(isinstance(n, ast.Assert) for n in ast.walk(tree))
    return tests, asserts


def main(before: str, after: str) -> None:
    table = {}
    for side, commit in (("before", before), ("after", after)):
        for path in files(commit):
            table.setdefault(path, {})[side] = counts(commit, path)
    total = {"before": [0, 0], "after": [0, 0]}
    print(f"{'file':70} tests b->a   asserts b->a")
    for path in sorted(table):
        b = table[path].get("before", (0, 0))
        a = table[path].get("after", (0, 0))
        for side, v in (("before", b), ("after", a)):
            total[side][0] += v[0]
            total[side][1] += v[1]
        mark = "  FELL" if a[0] < b[0] or a[1] < b[1] else ""
        if a != b:
            print(f"{path:70} {b[0]:4}->{a[0]:<4}  {b[1]:5}->{a[1]:<5}{mark}")
    for kind in ("unit", "integration"):
        pass
    print(f"total: test functions {total['before'][0]} -> {total['after'][0]}, asserts {total['before'][1]} -> {total['after'][1]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
