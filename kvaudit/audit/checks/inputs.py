"""Records and inputs: every case recorded once with its arms, and every arm fed the same input."""

from __future__ import annotations

from collections import Counter, defaultdict

from kvaudit.audit.checks.base import check, from_problems, is_reuse_arm, result
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import ARMS, REFERENCE_ARM
from kvaudit.core.records import MANIFEST_FILE, PairRecord, manifest_get


def _expected_arms(run: LoadedRun, p: PairRecord) -> list[str]:
    arms = run.manifest.get("arms")
    arms = [a for a in arms if isinstance(a, str)] if isinstance(arms, list) else []
    return [a for a in arms if not (a in ARMS and ARMS[a].leak_only and not p.canary)]


@check("records", required=True)
def check_records(run: LoadedRun):
    """Each case recorded once, with exactly the arms the manifest names, all of them known."""
    problems: dict[str, list[str]] = defaultdict(list)
    counts = Counter(p.case_id for p in run.pairs)
    for cid, n in counts.items():
        if n > 1:
            problems[cid].append(f"recorded {n} times")
    run_arms = run.manifest.get("arms")
    if not isinstance(run_arms, list) or REFERENCE_ARM not in run_arms:
        return result(False, f"{run.path / MANIFEST_FILE}: field 'arms' must list the arms, "
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
    n_cases = manifest_get(run.manifest, "dataset", "n_cases")
    warnings = []
    if isinstance(n_cases, int) and len(counts) < n_cases:
        warnings.append(f"partial run: {len(counts)} of {n_cases} cases recorded")
    status = run.manifest.get("status")
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
        for name, r in p.arms.items():
            diffs = [f for f in ("ids_hash", "segment_hashes", "truncation", "decoding")
                     if getattr(r, f) != getattr(p, f)]
            if diffs:
                problems[p.case_id].append(f"arm '{name}' {' and '.join(diffs)} differ(s) from the pair's")
            if r.tokens_reused + r.tokens_computed != p.n_prompt_tokens:
                problems[p.case_id].append(
                    f"arm '{name}' reused {r.tokens_reused} + computed {r.tokens_computed} tokens, "
                    f"not the prompt's {p.n_prompt_tokens}")
    ok = (f"token ids, segment boundaries, truncation and decoding identical across the arms of "
          f"all {len(run.pairs)} pairs")
    return from_problems(problems, ok)
