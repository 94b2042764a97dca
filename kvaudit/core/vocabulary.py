"""The fixed words of kvaudit's records and decisions, as types.

A role, an arm's KV source, a gate row's status or kind, a replay's policy and schedule are each one
of a few words that several modules compare as string literals; a misspelling there is a silent
wrong branch. Each vocabulary is a ``Literal`` here, annotated where it is stored (``ArmSpec``,
``Check``, ``ThresholdResult``, ``ReplayConfig``) and listed at run time with :func:`words`, so the
tables that describe them (``kvaudit.core.arms.ROLES``) and the parsers that accept them are
checked against one list (tests/test_vocabulary.py).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

ArmRole = Literal[
    "reference", "under_test", "identity_control", "position_control", "noise_floor", "leak_capture",
    "engine_prefix", "engine_prefix_warm", "engine_prefix_flushed", "tenant_probe", "segment_tenant_probe",
    "repair", "oracle_reference", "oracle", "candidate", "candidate_noise_floor", "candidate_control",
]
# Where an arm's segment KV comes from (None: it computes every token itself).
ArmSource = Literal["neutral", "in_context", "first_user", "engine_prefix"]
# A gate row's outcome: error is "cannot judge".
GateStatus = Literal["pass", "fail", "error", "skip"]
# What a policy row becomes when the run lacks its data (its ``missing``): one of the statuses.
MissingMode = Literal["error", "fail", "skip"]
CheckKind = Literal[
    "delta", "speed", "flips", "audit", "hit_rate", "leak_text", "leak_exposure", "tenant_isolation", "timing",
    "provenance", "noise_control", "coverage", "completeness",
]
# The confounder audit's verdict (audit.json's "verdict").
AuditVerdict = Literal["passed", "failed", "cannot_judge"]
# The gate's verdict on a run: error is "cannot judge" (exit 0, 1 and 2).
Verdict = Literal["pass", "fail", "error"]
# A statistical decision before the gate maps it to a status: "undecided" becomes "cannot judge".
Decision = Literal["pass", "fail", "undecided"]
ReplayPolicy = Literal["recompute", "prefix", "segment"]
Schedule = Literal["arrivals", "waves"]
# The engines of a serving change (an engines file's tables).
EngineRole = Literal["baseline", "candidate"]


def words(vocabulary: Any) -> tuple[str, ...]:
    """The words of a vocabulary above, in their order."""
    return tuple(get_args(vocabulary))
