"""The built-in example dataset copied for a test, with one case edited or its card replaced."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "example"


def edited_example(dest: Path, edit: Callable[[dict], Any] | None = None, card: Any = None) -> Path:
    """``dest`` holding the example's segments and cases, the third case edited in place by
    ``edit(case_dict)``; ``card`` (a dict, or raw text) becomes ``dataset.json``, else there is none,
    so an edit does not trip the content hash."""
    dest.mkdir()
    (dest / "segments.jsonl").write_bytes((EXAMPLE / "segments.jsonl").read_bytes())
    lines = (EXAMPLE / "cases.jsonl").read_text().splitlines()
    if edit is not None:
        obj = json.loads(lines[2])
        edit(obj)
        lines[2] = json.dumps(obj)
    (dest / "cases.jsonl").write_text("\n".join(lines) + "\n")
    if card is not None:
        (dest / "dataset.json").write_text(card if isinstance(card, str) else json.dumps(card))
    return dest
