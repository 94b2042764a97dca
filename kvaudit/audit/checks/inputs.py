"""Records and inputs: every case recorded once with its arms, and every arm fed the same input."""

from __future__ import annotations

from collections import Counter, defaultdict

from kvaudit.audit.checks.base import (
    arm_segments,
    arm_spans,
    check,
    from_problems,
    is_reuse_arm,
    result,
)
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import REFERENCE_ARM, get_arm, known_arm
from kvaudit.core.run_format import PairRecord


def _expected_arms(run: LoadedRun, p: PairRecord) -> list[str]:
    arms = run.manifest.arms or []
    out = []
    for a in arms:
        spec = get_arm(a) if known_arm(a) else None
        if spec is not None and spec.leak_only and not p.canary:
            continue
        if spec is not None and spec.prompt == "evidence" and not arm_segments(p, a):
            continue  # the oracle pair runs only where the case names kept evidence
        out.append(a)
    return out


@check("records", required=True)
def check_records(run: LoadedRun):
    """Each case recorded once, with exactly the arms the manifest names, all of them known."""
    problems: dict[str, list[str]] = defaultdict(list)
    counts = Counter(p.case_id for p in run.pairs)
    for cid, n in counts.items():
        if n > 1:
            problems[cid].append(f"recorded {n} times")
    run_arms = run.manifest.arms
    if run_arms is None or REFERENCE_ARM not in run_arms:
        return result(False, f"{run.files.manifest_file}: field 'arms' must list the arms, "
                             f"{REFERENCE_ARM} included")
    unknown = sorted({str(a) for a in run_arms if is_reuse_arm(str(a)) is None})
    if unknown:
        return result(False, f"unknown arm(s) {', '.join(unknown)}: the audit cannot check them")
    for p in run.pairs:
        want, have = set(_expected_arms(run, p)), set(p.arms)
        if want - have:
            problems[p.case_id].append(f"missing arm(s) {', '.join(sorted(want - have))}")
        if have - want:
            problems[p.case_id].append(f"arm(s) not in the manifest: {', '.join(sorted(have - want))}")
        if sorted(p.arm_order) != sorted(have):
            problems[p.case_id].append("arm_order does not list the recorded arms")
        for name, r in p.arms.items():
            if r.arm != name:
                problems[p.case_id].append(f"arm '{name}' holds a record of arm '{r.arm}'")
    n_cases = run.manifest.dataset.n_cases if run.manifest.dataset else None
    warnings = []
    if isinstance(n_cases, int) and len(counts) < n_cases:
        warnings.append(f"partial run: {len(counts)} of {n_cases} cases recorded")
    status = run.manifest.status
    if status not in (None, "complete"):
        warnings.append(f"manifest status is {status!r}, not 'complete'")
    ok = f"{len(counts)} cases, each once, each with its arms ({', '.join(map(str, run_arms))})"
    return from_problems(problems, ok, "; ".join(warnings) or None)


@check("same_inputs", required=True)
def check_same_inputs(run: LoadedRun):
    """Every arm of a pair consumed the pair's token ids, segment boundaries, truncation and decoding."""
    problems: dict[str, list[str]] = defaultdict(list)
    for p in run.pairs:
        n = len(p.segment_ids)
        if len(p.segment_hashes) != n or len(p.segment_spans) != n:
            problems[p.case_id].append(
                f"{n} segment ids but {len(p.segment_hashes)} hashes and {len(p.segment_spans)} spans")
        prev = 0
        for s, e in p.segment_spans:
            if not prev <= s < e <= p.n_prompt_tokens:
                problems[p.case_id].append(f"segment span [{s}, {e}) is out of order or out of the prompt")
                break
            prev = e
        evidence_ids: dict[str, str] = {}
        for name, r in p.arms.items():
            if known_arm(name) and get_arm(name).prompt == "evidence":
                if msgs := _evidence_prompt_problems(p, name):
                    problems[p.case_id].extend(msgs)
                evidence_ids[name] = r.ids_hash
                continue
            diffs = [f for f in ("ids_hash", "segment_hashes", "truncation", "decoding")
                     if getattr(r, f) != getattr(p, f)]
            if diffs:
                problems[p.case_id].append(f"arm '{name}' {' and '.join(diffs)} differ(s) from the pair's")
            if r.tokens_reused + r.tokens_computed != p.n_prompt_tokens:
                problems[p.case_id].append(
                    f"arm '{name}' reused {r.tokens_reused} + computed {r.tokens_computed} tokens, "
                    f"not the prompt's {p.n_prompt_tokens}")
        if len(set(evidence_ids.values())) > 1:
            problems[p.case_id].append(f"the evidence-prompt arms ({', '.join(sorted(evidence_ids))}) "
                                       "consumed different token ids")
    ok = (f"token ids, segment boundaries, truncation and decoding identical across the arms of "
          f"all {len(run.pairs)} pairs")
    if any(known_arm(a) and get_arm(a).prompt == "evidence" for p in run.pairs for a in p.arms):
        ok += "; the oracle pair consumed one evidence-only prompt per case (the pair's evidence segments)"
    return from_problems(problems, ok)


def _evidence_prompt_problems(p: PairRecord, name: str) -> list[str]:
    """An evidence-prompt arm consumed exactly the pair's kept evidence segments, in order, with
    the pair's decoding, and as many tokens as the pair's prompt less its other segments."""
    r, out = p.arms[name], []
    keep = arm_segments(p, name)
    want = [h for sid, h in zip(p.segment_ids, p.segment_hashes) if sid in set(keep)]
    if not keep:
        out.append(f"arm '{name}' ran on a case without kept evidence segments")
    if r.segment_hashes != want:
        out.append(f"arm '{name}' segment_hashes are not the pair's evidence segments")
    if r.decoding != p.decoding:
        out.append(f"arm '{name}' decoding differs from the pair's")
    n = p.n_prompt_tokens - sum(int(e) - int(s) for s, e in p.segment_spans) + sum(e - s for s, e in arm_spans(p, name))
    if r.tokens_reused + r.tokens_computed != n:
        out.append(f"arm '{name}' reused {r.tokens_reused} + computed {r.tokens_computed} tokens, not the "
                   f"evidence prompt's {n}")
    return out
