"""A repair arm's own account of one case: ``ArmResult.repair`` in ``pairs.jsonl``.

A repair arm (``blend@R``, ``epic@K``; :mod:`kvaudit.core.arms`) recomputes some segment tokens.
Its :class:`~kvaudit.core.run_format.ArmResult` says how many (``tokens_reused`` is the segment
tokens left reused, ``tokens_computed`` the rest of the prompt, and its TTFT includes selection
and recomputation); its ``repair`` field holds the rest:

``repair`` (family), ``param``, ``recomputed`` (prompt positions, ascending), ``n_recomputed``,
``segment_tokens``, ``share``, ``select_s`` (the selection step's seconds, inside TTFT),
``recompute_s`` (the recomputation's seconds, inside TTFT) and ``logit_diff_vs_reuse`` (max
|first-token logit difference| against the arm under test, when it ran in the case).

It lives in the pair record, so the audit's hash of ``pairs.jsonl`` covers it (the audit's repair
checks recount the recomputed tokens from the segment spans).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from kvaudit.core.run_format import PairRecord, read_pairs


def repair_accounts(pairs: Iterable[PairRecord]) -> dict[tuple[str, str], dict[str, Any]]:
    """``(case_id, arm) -> account`` of every repair arm in ``pairs``."""
    return {(p.case_id, name): r.repair for p in pairs for name, r in p.arms.items() if r.repair is not None}


def read_repairs(run_dir: str | os.PathLike) -> dict[tuple[str, str], dict[str, Any]]:
    """:func:`repair_accounts` of a run directory's ``pairs.jsonl`` (the one validated reader)."""
    return repair_accounts(read_pairs(run_dir))
