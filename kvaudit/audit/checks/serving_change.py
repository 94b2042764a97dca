"""Serving changes: the two engines differ only in the declared change, the candidate with its change
switched off equals the baseline, and the candidate's flips stand against each side's noise floor.

These checks apply only to a serving-change run (``kvaudit run --engines``; docs/serving-changes.md).

**engines_differ_only_in_change** (required): the manifest records each engine's configuration as
one flat mapping (:func:`kvaudit.runners.serving_change.configuration`: model and tokenizer
fingerprints, dtype, decoding, prompt limit, versions, device, threads, every engine option, and
over HTTP what the server reports about itself). Any key where the candidate (or the candidate
with its change off) differs from the baseline and that the change did not declare fails the
check, named with both values. An HTTP engine whose server reports no version cannot be judged:
two servers of unknown versions could differ in anything.

**candidate_control** (required where ``candidate_off`` ran): the candidate engine with its
change set back must equal the baseline's recompute, as the identity control does for reuse:
the same answers and first-token scores within the dtype's identity tolerance where the
baseline is exact (its noise floor shows no difference, or the backend is known to be
deterministic); elsewhere no more flips than the baseline's noise floor (exact one-sided
McNemar) and scores within :data:`~kvaudit.audit.checks.identity_reuse.IDENTITY_NOISE_SLACK`
times that floor.

**candidate_noise_floor** (reported): the candidate's flips against the baseline are set beside
both noise floors, the baseline's (``recompute_again`` vs ``recompute``) and the candidate's own
(``candidate_again`` vs ``candidate``): a change whose flips are not more frequent than either
side's noise is not distinguishable from that noise.
"""

from __future__ import annotations

from kvaudit.audit.checks.base import (
    ALPHA,
    MAX_LISTED,
    check,
    fmt,
    logit_diffs,
    not_run,
    result,
    short,
)
from kvaudit.audit.checks.identity_reuse import (
    IDENTITY_NOISE_SLACK,
    deterministic_backend,
    identity_tolerance,
    run_dtype,
)
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.audit.checks.noise import noise_floor
from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, arm_for
from kvaudit.core.run_format import flipped

CANDIDATE_ARM = arm_for("candidate")
CANDIDATE_NOISE_ARM = arm_for("candidate_noise_floor")
CANDIDATE_OFF_ARM = arm_for("candidate_control")
# What a server must report about itself for the configurations to be compared.
SERVER_VERSION_KEYS = ("server_model.version",)


def _undeclared(base: dict, other: dict, declares: list[str]) -> list[str]:
    from kvaudit.runners.serving_change import undeclared  # the one definition of "declared"

    return undeclared(base, other, declares)


def _flips(run: LoadedRun, arm: str, against: str) -> dict[str, bool]:
    return {p.case_id: flipped(p.arms[arm], p.arms[against]) for p in run.pairs
            if arm in p.arms and against in p.arms}


def _mcnemar(a: dict[str, bool], b: dict[str, bool]) -> float:
    """Exact one-sided McNemar p: ``a`` flips more often than ``b`` on their common cases."""
    from scipy.stats import binomtest

    both = [c for c in a if c in b]
    more = sum(a[c] and not b[c] for c in both)
    fewer = sum(b[c] and not a[c] for c in both)
    return float(binomtest(more, more + fewer, 0.5, alternative="greater").pvalue) if more + fewer else 1.0


@check("engines_differ_only_in_change", required=True, scope="serving_change")
def check_engines(run: LoadedRun):
    """The candidate (and the candidate with its change off) differ from the baseline only in what
    the change declares."""
    change = run.manifest.serving_change
    where = run.files.manifest_file
    configs = change.configurations
    if "baseline" not in configs or "candidate" not in configs and "candidate_off" not in configs:
        return result(False, f"{where}: field 'serving_change.configurations' lacks the baseline or the candidate")
    base = configs["baseline"]
    parts, failing = [], False
    unknown = [role for role, c in configs.items()
               if c.get("backend") == "openai" and not any(c.get(k) for k in SERVER_VERSION_KEYS)]
    for role in ("candidate", "candidate_off"):
        if role not in configs:
            continue
        other = configs[role]
        bad = _undeclared(base, other, change.declares)
        if bad:
            failing = True
            shown = "; ".join(f"{k}: {short(base.get(k), 40)} vs {short(other.get(k), 40)}" for k in bad[:MAX_LISTED])
            more = f"; and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
            parts.append(f"{role} differs from the baseline in what the change ({change.change}) does not declare: "
                         f"{shown}{more}")
        else:
            diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
            parts.append(f"{role} differs from the baseline only in {', '.join(diff)} (declared: "
                         f"{', '.join(change.declares)})" if diff else f"{role} has the baseline's configuration")
    warning = None
    if "candidate" in configs:
        cand = configs["candidate"]
        from kvaudit.runners.serving_change import declared

        idle = [d for d in change.declares
                if not any(base.get(k) != cand.get(k) for k in set(base) | set(cand) if declared(k, [d]))]
        if idle:
            warning = (f"the change declares {', '.join(idle)}, but the recorded configurations do not differ there: "
                       "is the change in effect?")
    detail = "; ".join(parts)
    if failing:
        return result(False, f"{where}: {detail}", warning=warning)
    if unknown:
        return result(False, f"{detail}; but the {' and '.join(unknown)} server(s) report no version: two servers "
                      "could differ in what they do not report", warning=warning, cannot_judge=True)
    return result(True, detail, warning=warning)


@check("candidate_control", required=True, options=("identity_tol",), scope="serving_change")
def check_candidate_control(run: LoadedRun, identity_tol: float | None = None):
    """The candidate engine with its change switched off equals the baseline's recompute."""
    off = _flips(run, CANDIDATE_OFF_ARM, REFERENCE_ARM)
    if not off:
        return not_run(f"no {CANDIDATE_OFF_ARM} arm",
                      warning=f"the candidate engine itself is not shown to change nothing: rerun with --arms "
                              f"including {CANDIDATE_OFF_ARM} (docs/serving-changes.md)")
    n_flips = sum(off.values())
    diffs = logit_diffs(run, CANDIDATE_OFF_ARM)
    worst = max(diffs) if diffs else None
    tol, tol_why = identity_tolerance(run_dtype(run.manifest), identity_tol)
    noise = noise_floor(run)
    flipped_cases = [c for c, f in off.items() if f]
    detail = (f"{CANDIDATE_OFF_ARM} vs {REFERENCE_ARM}: answers differ on {n_flips} of {len(off)}"
              + (f" ({', '.join(flipped_cases[:MAX_LISTED])})" if flipped_cases else "")
              + f", max first-token difference {fmt(worst)}")
    exact = (noise is not None and noise["exact"]) or deterministic_backend(run.manifest)
    if exact:
        ok = n_flips == 0 and (worst is None or worst <= tol)
        return result(ok, f"{detail}; the baseline is exact, so it must equal: {tol_why}", flipped_cases)
    if noise is None:
        return result(False, f"{detail}; the baseline ran no {NOISE_ARM}, and its engine is not known to be "
                      "deterministic: the control cannot be told from noise", cannot_judge=True)
    p = _mcnemar(off, noise["flips"])
    bound = max(tol, IDENTITY_NOISE_SLACK * (noise["max_diff"] or 0.0))
    ok = p >= ALPHA and (worst is None or worst <= bound)
    return result(ok, f"{detail}; against the baseline's noise floor ({noise['n_flips']} of {noise['n']} flips, "
                  f"max difference {fmt(noise['max_diff'])}): exact one-sided McNemar p={p:.3g}, bound on the "
                  f"difference {fmt(bound)}", [] if ok else flipped_cases)


@check("candidate_noise_floor", required=False, scope="serving_change")
def check_candidate_noise(run: LoadedRun):
    """The candidate's flips against the baseline beside each side's noise floor (reported)."""
    cand = _flips(run, CANDIDATE_ARM, REFERENCE_ARM)
    if not cand:
        return not_run(f"no {CANDIDATE_ARM} arm", warning=f"rerun with --arms including {CANDIDATE_ARM}")
    n = sum(cand.values())
    diffs = logit_diffs(run, CANDIDATE_ARM)
    parts = [f"{CANDIDATE_ARM} flips {n} of {len(cand)} against {REFERENCE_ARM}, max first-token difference "
             f"{fmt(max(diffs) if diffs else None)}"]
    unknown, within = [], []
    for label, floor in (("baseline", _flips(run, NOISE_ARM, REFERENCE_ARM)),
                         ("candidate", _flips(run, CANDIDATE_NOISE_ARM, CANDIDATE_ARM))):
        if not floor:
            unknown.append(label)
            continue
        p = _mcnemar(cand, floor)
        parts.append(f"{label} noise floor {sum(floor.values())} of {len(floor)} (one-sided McNemar p={p:.3g})")
        if n and p >= ALPHA:
            within.append(label)
    warnings = []
    if within:
        warnings.append(f"{CANDIDATE_ARM}'s flips ({n}/{len(cand)}) are not distinguishable from the "
                        f"{' and the '.join(within)} noise floor at alpha {ALPHA}")
    if unknown:
        arms = {"baseline": NOISE_ARM, "candidate": CANDIDATE_NOISE_ARM}
        warnings.append(f"{' and '.join(unknown)} noise floor unknown: rerun with --arms including "
                        f"{', '.join(arms[u] for u in unknown)}")
    return result(True, "; ".join(parts), warning="; ".join(warnings) or None)
