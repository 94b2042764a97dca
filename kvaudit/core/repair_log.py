"""``RUN/repairs.jsonl``: each repair arm's own account of one case, beside ``pairs.jsonl``.

A repair arm (``blend@R``, ``epic@K``; :mod:`kvaudit.core.arms`) recomputes some segment tokens.
Its :class:`~kvaudit.core.records.ArmResult` already says how many (``tokens_reused`` is the
segment tokens left reused, ``tokens_computed`` the rest of the prompt, and its TTFT includes
selection and recomputation); what ``ArmResult`` has no field for is written here, one JSON
object per (case, repair arm), appended and flushed right after the case's pair record:

``case_id``, ``arm``, ``repair`` (family), ``param``, ``recomputed`` (prompt positions, ascending),
``n_recomputed``, ``segment_tokens``, ``share``, ``select_s`` (the selection step's seconds, inside
TTFT), ``recompute_s`` (the recomputation's seconds, inside TTFT) and ``logit_diff_vs_reuse``
(max |first-token logit difference| against the arm under test, when it ran in the case).

The file is informational: the audit judges ``pairs.jsonl`` alone (its repair checks recount
the recomputed tokens from the segment spans). A line written twice (a case rerun after a kill)
is read as its last copy; a torn last line is skipped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from kvaudit.core.records import DatasetError, iter_jsonl

REPAIRS_FILE = "repairs.jsonl"


def write_repair_line(f: IO[str], case_id: str, arm: str, detail: dict[str, Any]) -> None:
    """Append one arm's account of one case to an open ``repairs.jsonl``."""
    row = {"case_id": case_id, "arm": arm, **detail}
    f.write(json.dumps(row, sort_keys=True) + "\n")


def read_repairs(run_dir: str | os.PathLike) -> dict[tuple[str, str], dict[str, Any]]:
    """``(case_id, arm) -> account`` from ``RUN/repairs.jsonl`` (empty when the file is absent);
    a line without a string ``case_id`` and ``arm`` is a DatasetError naming the line."""
    path = Path(run_dir) / REPAIRS_FILE
    if not path.exists():
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for n, obj in iter_jsonl(path, tolerate_torn_tail=True):
        if not isinstance(obj.get("case_id"), str) or not isinstance(obj.get("arm"), str):
            raise DatasetError(f"{path}, line {n}: fields 'case_id' and 'arm' must be strings")
        out[(obj["case_id"], obj["arm"])] = obj
    return out
