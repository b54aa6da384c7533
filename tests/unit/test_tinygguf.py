"""fetch.tinygguf.import_gguf loads the pinned tree's gguf-py without writing into the tree.

The pristine tree is held to its tree id (fetch.source): a __pycache__ folder that Python writes beside
gguf-py's sources when bytecode writing is on (its default) made the next `dgr certify` refuse the tree
with an integrity error."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from core.workspace import PROJECT_ROOT


def _tree(root: Path) -> Path:
    """A stand-in llama.cpp tree whose gguf package imports a submodule, as gguf-py's does."""
    package = root / "gguf-py" / "gguf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .constants import *\n")
    (package / "constants.py").write_text("GGUF_MAGIC = 0x46554747\n")
    return root


def test_importing_the_trees_gguf_writes_no_bytecode_into_the_tree(tmp_path: Path) -> None:
    tree = _tree(tmp_path / "tree")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # Python's default: write
    env["PYTHONPATH"] = os.fspath(PROJECT_ROOT)
    probe = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from fetch.tinygguf import import_gguf
        gguf = import_gguf(Path(sys.argv[1]))
        print(hex(gguf.GGUF_MAGIC), sys.dont_write_bytecode)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, os.fspath(tree)], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == ["0x46554747", "False"]  # loaded, and bytecode writing is back as it was
    assert not list(tree.rglob("__pycache__"))
