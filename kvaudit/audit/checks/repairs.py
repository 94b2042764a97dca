"""Repairs: the controls of the repair arms' code (``blend@R``, ``epic@K``), as the identity
arm is the control of reuse's.

A repair recomputes a set of segment tokens on top of reuse's KV (:mod:`kvaudit.core.arms`,
:meth:`kvaudit.runners.engines.transformers.backend.TransformersBackend.recompute_tokens`). Two ends of
that set are known exactly, whatever the arm's parameter, on every case where they occur:

- it recomputes **no** token (``blend@0``, ``epic@0``, or a share that rounds to nothing): the
  arm must equal the arm under test (``reuse``) exactly: the same answer ids, first-token top
  logits, margin and first-token difference from the reference, bit for bit
  (:func:`check_repair_equals_reuse`);
- it recomputes **every** segment token (``blend@1``, ``epic@K`` with K at least every segment's
  length): the arm must equal the reference under the identity rule, relative to the noise
  floor (:func:`kvaudit.audit.checks.identity_reuse.equals_reference`;
  :func:`check_repair_equals_recompute`).

Whether the counts themselves are right (tokens reused = segment tokens less the recomputed
share, exactly) is ``reuse_happened``'s check. Both checks pass, saying so, when no repair arm
reached either end.
"""

from __future__ import annotations

from collections import defaultdict

from kvaudit.audit.checks.base import (
    MAX_LISTED,
    CheckResult,
    arm_spans,
    check,
    from_problems,
    recomputed_expected,
    result,
)
from kvaudit.audit.checks.identity_reuse import equals_reference
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import UNDER_TEST_ARM, is_repair
from kvaudit.core.run_format import PairRecord

# What "equals reuse exactly" compares: everything an ArmResult records of the model's output.
EXACT_FIELDS = ("answer", "answer_ids", "top_k", "margin", "logit_diff_vs_recompute")


def _segment_tokens(p: PairRecord, arm: str) -> int:
    return sum(e - s for s, e in arm_spans(p, arm))


def control_cases(run: LoadedRun, end: str) -> dict[str, set[str]]:
    """Per repair arm, the cases where it recomputes nothing (``end="none"``) or every segment
    token (``end="all"``)."""
    out: dict[str, set[str]] = defaultdict(set)
    for p in run.pairs:
        for name in p.arms:
            if not is_repair(name):
                continue
            k, n = recomputed_expected(p, name), _segment_tokens(p, name)
            if n and ((end == "none" and k == 0) or (end == "all" and k == n)):
                out[name].add(p.case_id)
    return dict(out)


@check("repair_equals_reuse", required=True, scope="reuse")
def check_repair_equals_reuse(run: LoadedRun) -> CheckResult:
    """A repair arm that recomputes no token equals the arm under test bit for bit."""
    cases = control_cases(run, "none")
    if not cases:
        return result(True, "no repair arm ran where it recomputes nothing (blend@0, epic@0)")
    if not any(UNDER_TEST_ARM in p.arms for p in run.pairs):
        return result(False, f"cannot judge: repair arms {', '.join(sorted(cases))} recompute nothing on "
                             f"some cases, but {UNDER_TEST_ARM} did not run to be compared with "
                             f"(rerun with --arms including {UNDER_TEST_ARM})", cannot_judge=True)
    problems: dict[str, list[str]] = defaultdict(list)
    for p in run.pairs:
        for name in sorted(cases):
            if p.case_id not in cases[name]:
                continue
            r, ref = p.arms[name], p.arms.get(UNDER_TEST_ARM)
            if ref is None:
                problems[p.case_id].append(f"{UNDER_TEST_ARM} arm missing")
                continue
            diffs = [f for f in EXACT_FIELDS if getattr(r, f) != getattr(ref, f)]
            if diffs:
                problems[p.case_id].append(f"arm '{name}' recomputes nothing but its "
                                           f"{', '.join(diffs)} differ(s) from {UNDER_TEST_ARM}'s")
    summary = ", ".join(f"{a} on {len(c)}" for a, c in sorted(cases.items()))
    return from_problems(problems, f"identical to {UNDER_TEST_ARM} ({', '.join(EXACT_FIELDS)}) where "
                                   f"nothing is recomputed: {summary} cases")


@check("repair_equals_recompute", required=True, options=("identity_tol",), scope="reuse")
def check_repair_equals_recompute(run: LoadedRun, identity_tol: float | None = None) -> CheckResult:
    """A repair arm that recomputes every segment token equals the reference under the identity
    rule (the dtype's tolerance where the reference is exact, else relative to the noise floor)."""
    cases = control_cases(run, "all")
    if not cases:
        return result(True, "no repair arm ran where it recomputes every segment token (blend@1, "
                            "epic@K over whole segments)")
    parts, failing, warnings = [], [], []
    unjudged = None
    for name in sorted(cases):
        r = equals_reference(run, name, identity_tol, cases=cases[name])
        if r.cannot_judge:
            unjudged = r
        parts.append(f"{name} on {len(cases[name])} cases: {r.detail}")
        failing += [c for c in r.failing_cases if c not in failing]
        if r.warning:
            warnings.append(f"{name}: {r.warning}")
    if unjudged is not None:
        return result(False, unjudged.detail, cannot_judge=True)
    detail = "; ".join(parts)
    if failing:
        more = f" (and {len(failing) - MAX_LISTED} more)" if len(failing) > MAX_LISTED else ""
        return result(False, detail + more, failing, "; ".join(warnings) or None)
    return result(True, detail, [], "; ".join(warnings) or None)
