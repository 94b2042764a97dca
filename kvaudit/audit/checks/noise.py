"""Noise floor and prefix cache: what nondeterminism alone does to answers (reported, not required).

**noise floor**: flips (answer differs from the reference) of the arm under test vs of the
noise-floor arm, compared per case with an exact one-sided McNemar test (binomial test on the
discordant cases, scipy ``binomtest``). A warning when the arm under test changed answers but
not significantly more often than the noise floor (p >= :data:`~kvaudit.audit.checks.base.ALPHA`).
"""

from __future__ import annotations

import statistics
from typing import Any

from kvaudit.audit.checks.base import (
    ALPHA,
    MAX_LISTED,
    check,
    flips_vs_reference,
    fmt,
    logit_diffs,
    not_run,
    result,
)
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, UNDER_TEST_ARM, arm_for
from kvaudit.core.run_format import flipped

PREFIX_COLD_ARM = arm_for("engine_prefix")
PREFIX_WARM_ARM = arm_for("engine_prefix_warm")


def noise_floor(run: LoadedRun) -> dict[str, Any] | None:
    """The noise-floor arm against the reference: per-case flips and first-token differences."""
    rows = [p for p in run.pairs if NOISE_ARM in p.arms and REFERENCE_ARM in p.arms]
    if not rows:
        return None
    diffs = logit_diffs(run, NOISE_ARM)
    flips = {p.case_id: flipped(p.arms[NOISE_ARM], p.arms[REFERENCE_ARM]) for p in rows}
    return {"n": len(rows), "flips": flips, "n_flips": sum(flips.values()),
            "max_diff": max(diffs) if diffs else None,
            "exact": not any(flips.values()) and all(d == 0 for d in diffs) and bool(diffs)}


@check("noise_floor", required=False)
def check_noise_floor(run: LoadedRun):
    """Flip rate and logit difference of the noise-floor arm vs the reference, against the arm
    under test's (reported)."""
    from scipy.stats import binomtest

    noise = flips_vs_reference(run, NOISE_ARM)
    if not noise:
        return not_run(f"no {NOISE_ARM} arm", warning=f"noise floor unknown: rerun with --arms including {NOISE_ARM}")
    n_noise = sum(noise.values())
    nd = logit_diffs(run, NOISE_ARM)
    noise_cases = [c for c, f in noise.items() if f]
    detail = (f"{NOISE_ARM} flips {n_noise} of {len(noise)}"
              + (f" ({', '.join(noise_cases[:MAX_LISTED])})" if noise_cases else "")
              + f", max logit diff {fmt(max(nd) if nd else None)}")
    reuse = flips_vs_reference(run, UNDER_TEST_ARM)
    if not reuse:
        return result(True, detail + f"; {UNDER_TEST_ARM} arm not run")
    both = [c for c in reuse if c in noise]
    b = sum(reuse[c] and not noise[c] for c in both)
    c_ = sum(noise[c] and not reuse[c] for c in both)
    p = float(binomtest(b, b + c_, 0.5, alternative="greater").pvalue) if b + c_ else 1.0
    rd = logit_diffs(run, UNDER_TEST_ARM)
    n_reuse = sum(reuse.values())
    detail += (f"; {UNDER_TEST_ARM} flips {n_reuse} of {len(reuse)}, logit diff median "
               f"{fmt(statistics.median(rd) if rd else None)} max {fmt(max(rd) if rd else None)}; "
               f"exact one-sided McNemar p={p:.3g}")
    warning = None
    if n_reuse and p < ALPHA:  # what a reviewer must not read as "nothing found"
        warning = (f"{UNDER_TEST_ARM} changes answers beyond the noise floor ({n_reuse}/{len(reuse)} against "
                   f"{n_noise}/{len(noise)}, McNemar p={p:.3g}): the quality deltas say what that costs")
    elif n_reuse and p >= ALPHA:
        warning = (f"{UNDER_TEST_ARM} flip rate ({n_reuse}/{len(reuse)}) is within the noise floor "
                   f"({n_noise}/{len(noise)}): not distinguishable at alpha {ALPHA}")
    if n_noise:
        nw = (f"{REFERENCE_ARM} is not deterministic: {NOISE_ARM} changed {n_noise} answer(s); "
              "flips at that rate are noise")
        warning = f"{warning}; {nw}" if warning else nw
    return result(True, detail, [], warning)


@check("prefix_cache_control", required=False, scope="reuse")
def check_prefix_cache_control(run: LoadedRun):
    """How often the engine's own exact prefix cache changes greedy answers: warm vs cold runs
    of the same prompt (reported; a warning when any flip)."""
    cold, warm = PREFIX_COLD_ARM, PREFIX_WARM_ARM
    both = [p for p in run.pairs if warm in p.arms and cold in p.arms]
    if not both:
        return not_run(f"no {warm} arms")
    flips = [p.case_id for p in both if flipped(p.arms[warm], p.arms[cold])]
    parts = [f"warm vs cold answers differ on {len(flips)} of {len(both)}"
             + (f" ({', '.join(flips[:MAX_LISTED])})" if flips else "")]
    for arm in (cold, warm):
        f = flips_vs_reference(run, arm)
        d = logit_diffs(run, arm)
        parts.append(f"{arm} vs {REFERENCE_ARM}: flips {sum(f.values())} of {len(f)}, "
                     f"max logit diff {fmt(max(d) if d else None)}")
    warning = None
    if flips:
        warning = (f"the engine's exact prefix cache changed {len(flips)} greedy answer(s) between cold and warm "
                   "runs of the same prompt: flips at that rate are not caused by segment reuse")
    return result(True, "; ".join(parts), [], warning)
