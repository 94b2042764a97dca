"""Identity and reuse: the reuse code path reproduces the reference on KV built in true context,
and every reuse-family arm really reused its segment tokens.

**identity tolerance** (:data:`IDENTITY_TOL`): max |first-token logit difference| between the
identity-control arm and the reference. 1e-4 in float32/float64 (measured here: at most 5e-5 on
SmolLM2). In bfloat16 the identity control drifts by about 0.4 logits on SmolLM2 (its segment
KV is computed in a different chunking than the full prefill, so it rounds differently), so
the default is 1.0; float16 has 3 more mantissa bits, so 0.25 (extrapolated, not measured).
Real reuse moves logits by 2-6 on the same model, so these still catch a broken reuse path.
In float32/float64 the identity answer must equal the reference's; in low precision a different
answer is a warning, because the documented drift can flip a greedy near-tie anywhere in the
decoded answer. These fixed tolerances hold where the reference is exact. Where the noise-floor
arm shows noise (a GPU serving engine: on an H200 it differed by up to 1.9e-2 in fp32), identity
is judged against that noise floor instead (see :func:`check_identity`); a backend not known to
be deterministic that ran no noise-floor arm cannot be judged.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from kvaudit.audit.checks.base import (
    ALPHA,
    MAX_LISTED,
    CheckResult,
    check,
    fmt,
    from_problems,
    is_reuse_arm,
    probe_role,
    recomputed_expected,
    result,
    reused_expected,
    server_decides_reuse,
    short,
    source,
)
from kvaudit.audit.checks.loading import LoadedRun
from kvaudit.audit.checks.noise import noise_floor
from kvaudit.core.arms import IDENTITY_ARM, NOISE_ARM, REFERENCE_ARM, get_arm, is_repair
from kvaudit.core.manifest import Manifest
from kvaudit.core.run_format import PairRecord, flipped

DEFAULT_TOL = 1e-4
IDENTITY_TOL: dict[str, float] = {"float32": DEFAULT_TOL, "float64": DEFAULT_TOL,
                                  "bfloat16": 1.0, "float16": 0.25}
EXACT_DTYPES = ("float32", "float64")
IDENTITY_NOISE_SLACK = 2.0  # identity may differ from the reference by this times the noise floor
# The largest --identity-tol accepted (logits): real reuse moves first-token logits by 2-6 on
# SmolLM2, so a tolerance above this could no longer tell a broken reuse path from a working one.
MAX_IDENTITY_TOL = 2.0


def check_identity_tol(value: float) -> float:
    """``value`` as an identity tolerance override; a ValueError saying why for NaN, an
    infinity, a negative number or one above :data:`MAX_IDENTITY_TOL`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number of logits, not {str(value)[:40]!r}")
    if not math.isfinite(value) or not 0 <= value <= MAX_IDENTITY_TOL:
        raise ValueError(f"must be in [0, {MAX_IDENTITY_TOL:g}] logits, got {value:g} (real reuse moves "
                         "first-token logits by 2-6: a looser tolerance cannot tell a broken reuse path)")
    return float(value)


def run_dtype(manifest: Manifest) -> str | None:
    """The dtype the run's arms computed in (its identity's, else its model's), or None."""
    run_identity, model = manifest.identity, manifest.model
    dtype = (run_identity.dtype if run_identity else None) or (model.dtype if model else None)
    return dtype if isinstance(dtype, str) else None


def identity_tolerance(dtype: str | None, override: float | None = None) -> tuple[float, str]:
    """The identity tolerance for ``dtype`` and a sentence saying where it came from."""
    if override is not None:
        return override, f"tolerance {override:g} (--identity-tol), {dtype}"
    if dtype in IDENTITY_TOL:
        tol = IDENTITY_TOL[dtype]
        why = "" if dtype in EXACT_DTYPES else " (looser low-precision default: see docs/audit.md)"
        return tol, f"tolerance {tol:g} for {dtype}{why}"
    return DEFAULT_TOL, f"tolerance {DEFAULT_TOL:g} (unknown dtype {dtype!r}: the float32 default)"


def deterministic_backend(manifest: Manifest) -> bool:
    """Backends whose recompute is bit-reproducible (measured): the transformers backend on CPU.
    Anything else (vLLM, GPUs, servers) must show its noise floor before identity can be judged."""
    info = manifest.backend or {}
    backend = info.get("backend") or (manifest.identity.backend if manifest.identity else None)
    device = info.get("device")
    return backend == "transformers" and isinstance(device, str) and device.startswith("cpu")


@check("identity_control", required=True, options=("identity_tol",), scope="reuse")
def check_identity(run: LoadedRun, identity_tol: float | None = None):
    """The identity arm (segment KV built in context, then reused) equals the reference, as
    exactly as the reference equals itself.

    Where the reference is exact (the noise floor, when run, is exactly 0; or the backend is
    known bit-deterministic) the dtype's fixed tolerance applies and, in float32/float64, every
    answer must match. Where the noise-floor arm shows noise, identity may differ by up to
    :data:`IDENTITY_NOISE_SLACK` times the noise floor's largest first-token difference (never
    less than the dtype's tolerance), and its flips must not exceed the noise floor's
    significantly (exact one-sided binomial test on the discordant cases at ``ALPHA``). A
    backend that is not known to be deterministic and ran no noise-floor arm cannot be judged:
    a fixed tolerance would fail it, or pass it, for the wrong reason.
    """
    # The engine's own prefix cache is exact and not kvaudit's code: the identity arm does not vouch for it.
    has_reuse = any(is_reuse_arm(a) and a != IDENTITY_ARM and source(a) != "engine_prefix"
                    for p in run.pairs for a in p.arms)
    if not any(IDENTITY_ARM in p.arms for p in run.pairs):
        if has_reuse and server_decides_reuse(run):
            return result(False, "the reuse arms ran on the server's own reuse path, which cannot be fed KV "
                                 f"built in true context: the {IDENTITY_ARM} control cannot run, so the reuse "
                                 "implementation is unvalidated (a black box; see docs/engines.md)", cannot_judge=True)
        if has_reuse:
            return result(False, f"{IDENTITY_ARM} arm not run: the reuse implementation is unvalidated "
                                 f"(rerun with --arms including {IDENTITY_ARM})")
        return result(True, "no reuse arm ran; nothing to validate")
    return equals_reference(run, IDENTITY_ARM, identity_tol)


def equals_reference(run: LoadedRun, arm: str, identity_tol: float | None = None, *,
                     cases: set[str] | None = None) -> CheckResult:
    """The identity rule for any arm that must reproduce the reference (the identity control, a
    repair's full-recompute control), on every case holding it (or only ``cases``): the dtype's
    tolerance where the reference is exact, else relative to the noise floor, as documented in
    :func:`check_identity`. A result without the registry's name (the caller's check gives it)."""
    from scipy.stats import binomtest

    dtype = run_dtype(run.manifest)
    tol, why = identity_tolerance(dtype, identity_tol)
    base_tol = tol
    noise = noise_floor(run)
    relative = noise is not None and not noise["exact"]
    if noise is None and not deterministic_backend(run.manifest):
        return result(False,
                      "cannot judge: this backend is not known to be bit-deterministic and "
                      f"{NOISE_ARM} did not run, so the identity error has no noise floor to "
                      f"be compared with (rerun with --arms including {NOISE_ARM})",
                      cannot_judge=True)
    if relative:
        floor = noise["max_diff"] or 0.0
        tol = max(tol, IDENTITY_NOISE_SLACK * floor)
        why = (f"tolerance {tol:.3g} = max({base_tol:g}, {IDENTITY_NOISE_SLACK:g} x the noise "
               f"floor's max logit diff {floor:.3g}); noise floor flips {noise['n_flips']} of {noise['n']}")
    exact = dtype in EXACT_DTYPES and not relative
    problems: dict[str, list[str]] = defaultdict(list)
    diffs, answer_flips = [], []
    for p in run.pairs:
        if cases is not None and p.case_id not in cases:
            continue
        r, ref = p.arms.get(arm), p.arms.get(REFERENCE_ARM)
        if r is None or ref is None:
            problems[p.case_id].append(f"{arm} or {REFERENCE_ARM} arm missing")
            continue
        d = r.logit_diff_vs_recompute
        if d is None or not math.isfinite(d):
            problems[p.case_id].append(f"logit difference not recorded ({d})")
        else:
            diffs.append(d)
            if d > tol:
                problems[p.case_id].append(f"first-token logits differ by {d:.3g} > {tol:.3g}")
        if flipped(r, ref):
            answer_flips.append(p.case_id)
            if exact:
                problems[p.case_id].append(f"answer {short(r.answer, 40)!r} differs from "
                                           f"{REFERENCE_ARM}'s {short(ref.answer, 40)!r}")
    n = sum(1 for p in run.pairs if arm in p.arms and (cases is None or p.case_id in cases))
    # Backends measure the first-token difference differently (runners.backend.LOGIT_DIFF_KINDS):
    # say which, so a table never reads a top-20 log-probability difference as a logit one.
    kind = (run.manifest.backend or {}).get("logit_diff_kind") or "logits"
    label = "logit diff" if kind == "logits" else f"{kind.replace('_', ' ')} diff"
    stats = f"max {label} {fmt(max(diffs) if diffs else None)} over {n} cases ({why})"
    warning = None
    if relative:
        with_identity = {p.case_id for p in run.pairs if arm in p.arms and (cases is None or p.case_id in cases)}
        both = [c for c in noise["flips"] if c in with_identity]
        ident = set(answer_flips)
        b = sum(c in ident and not noise["flips"][c] for c in both)
        c_ = sum(noise["flips"][c] and c not in ident for c in both)
        p_flip = float(binomtest(b, b + c_, 0.5, alternative="greater").pvalue) if b + c_ else 1.0
        stats += f"; {arm} flips {len(answer_flips)} vs noise floor {noise['n_flips']} (p={p_flip:.3g})"
        if p_flip < ALPHA:
            for cid in answer_flips:
                problems[cid].append(f"{arm} answer differs from {REFERENCE_ARM} more often than the "
                                     "noise floor's")
    elif answer_flips and not exact:
        warning = (f"{arm} answer differs from {REFERENCE_ARM} on {len(answer_flips)} case(s) "
                   f"({', '.join(answer_flips[:MAX_LISTED])}); tolerated in {dtype}, whose rounding "
                   "can flip greedy near-ties")
    ok = f"{stats}; answers equal on {n - len(answer_flips)} of {n}"
    return from_problems(problems, ok, warning, extra="" if not problems else f" [{stats}]")


@check("reuse_happened", required=True, scope="reuse")
def check_reuse_happened(run: LoadedRun):
    """Every reuse-family arm reused exactly the segment tokens (> 0); recomputes reused none."""
    problems: dict[str, list[str]] = defaultdict(list)
    totals: Counter[str] = Counter()
    server_decides = server_decides_reuse(run)
    on_server: set[str] = set()  # reuse arms on the server's own path: server_cache_evidence judges them
    for p in run.pairs:
        for name, r in p.arms.items():
            expected = reused_expected(p, name)
            family = is_reuse_arm(name)
            if family is None or probe_role(name):  # tenant probes: the server checks judge them
                continue
            if family and server_decides and source(name) != "engine_prefix":
                on_server.add(name)  # the server's own reuse: server_cache_evidence holds it to what it reported
                continue
            if not family:
                if r.tokens_reused:
                    problems[p.case_id].append(f"arm '{name}' is a full recompute but reused "
                                               f"{r.tokens_reused} tokens")
                continue
            totals[name] += r.tokens_reused
            if source(name) == "engine_prefix":
                if msgs := _engine_prefix_problems(p, name):
                    problems[p.case_id].extend(msgs)
                continue
            if is_repair(name):  # blend@1 may reuse nothing; the count is exact all the same
                if r.tokens_reused != expected:
                    problems[p.case_id].append(
                        f"arm '{name}' reused {r.tokens_reused} tokens; its segment tokens less the "
                        f"{recomputed_expected(p, name)} it must recompute are {expected}")
            elif expected <= 0:
                problems[p.case_id].append(f"arm '{name}': no segment tokens to reuse (all dropped?)")
            elif r.tokens_reused != expected:
                problems[p.case_id].append(f"arm '{name}' reused {r.tokens_reused} tokens, "
                                           f"segment tokens are {expected}")
    judged_there = (f"{', '.join(sorted(on_server))} ran on the server's own reuse path (server_cache_evidence "
                    "holds it to what the server reported)") if on_server else ""
    if not totals:
        return from_problems(problems, judged_there or "no reuse-family arm ran")
    seg = {a: n for a, n in totals.items() if source(a) != "engine_prefix"}
    eng = {a: n for a, n in totals.items() if source(a) == "engine_prefix"}
    parts = []
    if seg:
        parts.append("reused tokens equal the segment tokens (less a repair's recomputed ones) on every case: "
                     + ", ".join(f"{a} {n}" for a, n in sorted(seg.items())) + " tokens in all")
    if eng:
        n_prompt = sum(p.n_prompt_tokens for p in run.pairs)
        parts.append("engine prefix cache found " + ", ".join(
            f"{a} {n} of {n_prompt} prompt tokens ({n / max(n_prompt, 1):.1%})" for a, n in sorted(eng.items())))
    return from_problems(problems, "; ".join(parts + ([judged_there] if judged_there else [])))


def _engine_prefix_problems(p: PairRecord, name: str) -> list[str]:
    """An engine prefix-cache arm: 0 <= cached < prompt tokens (the engine always computes the
    last token); an arm that runs after its cold twin must find at least as much, and more than 0."""
    r, out = p.arms[name], []
    if not 0 <= r.tokens_reused < p.n_prompt_tokens:
        out.append(f"arm '{name}' reports {r.tokens_reused} cached tokens for a {p.n_prompt_tokens}-token prompt")
    if r.cache_hit_tokens != r.tokens_reused:
        out.append(f"arm '{name}': cache_hit_tokens {r.cache_hit_tokens} != tokens_reused {r.tokens_reused}")
    if get_arm(name).role == "engine_prefix_flushed" or (r.engine or {}).get("cache_reset"):  # after a reset: cold
        if r.tokens_reused:
            out.append(f"arm '{name}' found {r.tokens_reused} cached tokens right after the server's cache reset "
                       "(the reset did not empty the cache)")
        return out
    for before in get_arm(name).requires:
        prev = p.arms.get(before)
        if prev is not None and not r.tokens_reused > 0:
            out.append(f"arm '{name}' found nothing in the prefix cache right after '{before}' "
                       "ran the same prompt (prefix caching off?)")
        elif prev is not None and r.tokens_reused < prev.tokens_reused:
            out.append(f"arm '{name}' found {r.tokens_reused} cached tokens, fewer than '{before}' "
                       f"({prev.tokens_reused}) on the same prompt")
    return out
