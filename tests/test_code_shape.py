"""The code's shape holds: no function in kvaudit/ over 80 lines (a longer one hides its steps:
split it into functions that name them), and no backend capability probed with ``hasattr``
(optional capabilities are declared on ``Backend`` with their defaults)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "kvaudit"
MAX_LINES = 80


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PACKAGE.parent), node


def test_no_function_is_over_80_lines():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node in _functions() if node.end_lineno - node.lineno + 1 > MAX_LINES]
    assert not long, "split these into functions that name their steps:\n" + "\n".join(long)


def test_no_backend_capability_is_probed_with_hasattr():
    found = [f"{p.relative_to(PACKAGE.parent)}:{n}" for p in sorted(PACKAGE.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"hasattr\(\s*(self\.)?backend\b", line)]
    assert not found, "declare the capability on Backend instead:\n" + "\n".join(found)
