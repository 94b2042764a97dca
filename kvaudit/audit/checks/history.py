"""History: a neutral-source arm loads the same KV for a segment whatever ran before it."""

from __future__ import annotations

from collections import Counter, defaultdict

from kvaudit.audit.checks.base import (
    arm_segments,
    check,
    from_problems,
    result,
    server_decides_reuse,
    source,
)
from kvaudit.audit.checks.loading import LoadedRun


@check("history_independence", required=True, scope="reuse")
def check_history_independence(run: LoadedRun):
    """A neutral-source arm loads bit-identical KV for a segment in every case, whatever ran before."""
    arms = sorted({a for p in run.pairs for a in p.arms if source(a) == "neutral"})
    if not arms:
        return result(True, "no neutral-source arm ran")
    if server_decides_reuse(run):
        return result(False, "the neutral-source arms ran on the server's own reuse path, which reports no KV "
                             "fingerprints: whether a segment's KV depends on what ran before cannot be shown",
                      cannot_judge=True)
    problems: dict[str, list[str]] = defaultdict(list)
    n_segments = 0
    for arm in arms:
        seen: dict[str, Counter[str]] = defaultdict(Counter)
        for p in run.pairs:
            r = p.arms.get(arm)
            if r is None:
                continue
            fps = r.segment_kv_fingerprints or {}
            for sid in arm_segments(p, arm):
                fp = fps.get(sid)
                if not fp:
                    problems[p.case_id].append(f"arm '{arm}' recorded no KV fingerprint for segment {sid}")
                else:
                    seen[sid][fp] += 1
        n_segments = max(n_segments, len(seen))
        for sid, fps in seen.items():
            if len(fps) < 2:
                continue
            top = fps.most_common()
            # the majority fingerprint is taken as the segment's; on a tie every case is suspect
            odd = {fp for fp, c in top if c < top[0][1]} or set(fps)
            for p in run.pairs:
                r = p.arms.get(arm)
                if r is not None and r.segment_kv_fingerprints.get(sid) in odd:
                    problems[p.case_id].append(
                        f"arm '{arm}' segment {sid} KV fingerprint {r.segment_kv_fingerprints[sid][:12]} "
                        f"differs from other cases' ({len(fps)} distinct)")
    ok = (f"each of {n_segments} segments loaded identical KV in every case "
          f"(arms {', '.join(arms)})")
    return from_problems(problems, ok)
