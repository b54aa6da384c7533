"""One coverage-guided run of one target: ``python -m tests.fuzz.atheris_target NAME [libFuzzer flags]``.

The project's modules are instrumented as they are imported; libFuzzer drives the target until its
budget (-max_total_time / -runs) and prints ``Done N runs in S second(s)``.  An exception other than
the project's typed errors is a finding: libFuzzer writes the input to -artifact_prefix and exits 1.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports(include=["core", "manifests", "fetch", "patches", "pipeline", "certify"]):
    from core import canonical  # noqa: F401
    from fetch import archive, gguf_header, hub  # noqa: F401
    from manifests import artifact_sets, recipe_model  # noqa: F401
    from patches import stack  # noqa: F401

from tests.fuzz import targets  # noqa: E402


def main() -> None:
    name = sys.argv[1]
    target = targets.TARGETS[name]

    def one_input(data: bytes) -> None:
        try:
            target(data)
        except targets.DgrError:
            pass

    atheris.Setup([sys.argv[0], *sys.argv[2:]], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
