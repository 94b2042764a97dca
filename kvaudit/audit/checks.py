"""The confounder audit's checks: each takes a loaded run and returns one :class:`CheckResult`.

A run passes the audit when every *required* check passes. Checks that are not required
(noise floor, coverage) never fail the audit; they carry a ``warning`` instead. Every check
that finds a problem names the cases it found it in (``failing_cases``).

Thresholds and tests, in one place so the docs (docs/audit.md) can point here:

* **identity tolerance** (:data:`IDENTITY_TOL`): max |first-token logit difference| between the
  ``identity`` arm and ``recompute``. 1e-4 in float32/float64 (measured here: at most 5e-5 on
  SmolLM2). In bfloat16 the identity control drifts by about 0.4 logits on SmolLM2 (its segment
  KV is computed in a different chunking than the full prefill, so it rounds differently), so
  the default is 1.0; float16 has 3 more mantissa bits, so 0.25 (extrapolated, not measured).
  Real reuse moves logits by 2-6 on the same model, so these still catch a broken reuse path.
  In float32/float64 the identity answer must equal recompute's; in low precision a different
  answer is a warning, because the documented drift can flip a greedy near-tie anywhere in the
  decoded answer. These fixed tolerances hold where recompute is exact. Where ``recompute_again``
  shows noise (a GPU serving engine: on an H200 recompute_again differed by up to 1.9e-2 in fp32),
  identity is judged against that noise floor instead (see :func:`check_identity`); a backend
  not known to be deterministic that ran no ``recompute_again`` cannot be judged.
* **noise floor**: flips (answer differs from ``recompute``) of ``reuse`` vs of
  ``recompute_again``, compared per case with an exact one-sided McNemar test (binomial test on
  the discordant cases, scipy ``binomtest``). A warning when reuse changed answers but not
  significantly more often than the noise floor (p >= :data:`ALPHA`).
* **leak probes**: exposure gain of a name = its log-probability under ``reuse`` minus under
  ``recompute``; per probe, the rank of the true name's gain among all candidates' gains,
  uniform without a leak; exact one-sided rank test across probes at :data:`ALPHA`
  (:mod:`kvaudit.stats.leak_tests`, computed by :func:`kvaudit.stats.leaks.leak_summary`).
  The neutral policy fails the audit when the test rejects. With fewer probes than the test
  needs for 80% power at the SmolLM2 first-user effect (``min_probes``) the check warns.
* **coverage minimums**: :data:`MIN_REFS_PER_SEGMENT`, :data:`MIN_NEVER_CACHED_SHARE`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.arms import ARMS
from kvaudit.core.errors import KvauditError
from kvaudit.core.records import (
    MANIFEST_FILE,
    PAIRS_FILE,
    Dataset,
    DatasetError,
    PairRecord,
    flipped,
    iter_jsonl,
    pair_from_dict,
    read_dataset,
    read_manifest,
)

DEFAULT_TOL = 1e-4
IDENTITY_TOL: dict[str, float] = {"float32": DEFAULT_TOL, "float64": DEFAULT_TOL,
                                  "bfloat16": 1.0, "float16": 0.25}
EXACT_DTYPES = ("float32", "float64")
IDENTITY_NOISE_SLACK = 2.0  # identity may differ from recompute by this times the noise floor
NOISE_ARM = "recompute_again"
ALPHA = 0.05
MIN_REFS_PER_SEGMENT = 2.0
MIN_NEVER_CACHED_SHARE = 0.5
MAX_LISTED = 5  # problems spelled out in a detail string; the rest are counted


@dataclass
class CheckResult:
    name: str
    passed: bool
    required: bool
    detail: str
    failing_cases: list[str] = field(default_factory=list)
    warning: str | None = None
    cannot_judge: bool = False  # the run lacks the evidence this check needs (never a pass)


@dataclass
class LoadedRun:
    path: Path
    manifest: dict[str, Any]
    pairs: list[PairRecord]
    dataset: Dataset | None = None
    dataset_note: str = ""  # why no dataset was loaded (for the coverage check)


# --------------------------------------------------------------------------- loading

_PAIR_TYPES: dict[str, type | tuple] = {
    "case_id": str, "ids_hash": str, "segment_ids": list, "segment_hashes": list,
    "segment_spans": list, "truncation": dict, "decoding": dict, "arm_order": list, "arms": dict,
    "n_prompt_tokens": int,
}
_ARM_TYPES: dict[str, type | tuple] = {
    "arm": str, "answer": str, "ids_hash": str, "segment_hashes": list, "truncation": dict,
    "decoding": dict, "tokens_reused": int, "tokens_computed": int,
}
_ARM_OPTIONAL: dict[str, type | tuple] = {
    "logit_diff_vs_recompute": (int, float), "segment_kv_fingerprints": dict, "canary_logprobs": dict,
}


def _type_name(typ: type | tuple) -> str:
    return typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)


def _validate(obj: dict, where: str, types: dict, optional: dict | None = None) -> None:
    for name, typ in types.items():
        if name not in obj:
            raise DatasetError(f"{where}: missing field '{name}'")
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, typ):
            raise DatasetError(f"{where}: field '{name}' must be {_type_name(typ)}, got {type(v).__name__}")
    for name, typ in (optional or {}).items():
        v = obj.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, typ)):
            raise DatasetError(f"{where}: field '{name}' must be {_type_name(typ)} or null, "
                               f"got {type(v).__name__}")


def _validate_pair(obj: dict, where: str) -> None:
    _validate(obj, where, _PAIR_TYPES)
    for span in obj["segment_spans"]:
        if (not isinstance(span, list) or len(span) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)):
            raise DatasetError(f"{where}: field 'segment_spans' must hold [start, end] integer pairs")
    if not isinstance(obj.get("evidence", []), list):
        raise DatasetError(f"{where}: field 'evidence' must be a list of strings")
    _str_list(obj, ("segment_ids", "segment_hashes", "arm_order", "evidence"), where)
    if obj.get("canary") is not None and not isinstance(obj["canary"], dict):
        raise DatasetError(f"{where}: field 'canary' must be an object or null")
    for name, arm in obj["arms"].items():
        if not isinstance(arm, dict):
            raise DatasetError(f"{where}: field 'arms.{name}' must be an object")
        arm_where = f"{where}, arm '{name}'"
        _validate(arm, arm_where, _ARM_TYPES, _ARM_OPTIONAL)
        _str_list(arm, ("segment_hashes",), arm_where)
        for key, kind in (("segment_kv_fingerprints", str), ("canary_logprobs", (int, float))):
            values = (arm.get(key) or {}).values()
            if any(isinstance(v, bool) or not isinstance(v, kind) for v in values):
                raise DatasetError(f"{arm_where}: field '{key}' must map names to {_type_name(kind)}")


def _str_list(obj: dict, names: tuple[str, ...], where: str) -> None:
    for name in names:
        if not all(isinstance(x, str) for x in obj.get(name, [])):
            raise DatasetError(f"{where}: field '{name}' must be a list of strings")


def read_run_pairs(run_dir: Path) -> list[PairRecord]:
    """``pairs.jsonl`` with every field the checks read type-checked (a torn last line is skipped)."""
    path = run_dir / PAIRS_FILE
    out = []
    for n, obj in iter_jsonl(path, tolerate_torn_tail=True):
        where = f"{path}, line {n}"
        _validate_pair(obj, where)
        try:
            out.append(pair_from_dict(obj))
        except TypeError as e:
            raise DatasetError(f"{where}: malformed pair record ({e})") from None
    if not out:
        raise KvauditError(f"{path}: no pair records; has the run finished any case?")
    return out


def _resolve_dataset(manifest: dict[str, Any], run_dir: Path) -> tuple[Path | None, str]:
    """The run's dataset directory named in its manifest, when it is still on disk."""
    raw = _get(manifest, "dataset", "path")
    if not isinstance(raw, str) or not raw:
        return None, "the manifest names no dataset path"
    for cand in (Path(raw), run_dir.parent / raw):
        if (cand / "cases.jsonl").is_file():
            return cand, ""
    return None, f"the run's dataset {raw} is not on disk"


def load_run(run_dir: str | Path, dataset_dir: str | Path | None = None) -> LoadedRun:
    """Read a run directory (and its dataset: ``dataset_dir``, else the manifest's path if found).

    Missing or corrupt files raise :class:`KvauditError` / :class:`DatasetError` naming the file.
    A dataset passed explicitly must be the one the run was made from.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise KvauditError(f"{path}: run directory not found")
    if not (path / MANIFEST_FILE).is_file():
        raise KvauditError(f"{path}: no {MANIFEST_FILE}; not a kvaudit run directory "
                           "(run `kvaudit run --dataset DIR --out RUN` first)")
    if not (path / PAIRS_FILE).is_file():
        raise KvauditError(f"{path}: no {PAIRS_FILE}; the run has not finished any case")
    manifest = read_manifest(path)
    pairs = read_run_pairs(path)
    run_hash = _get(manifest, "dataset", "hash")
    dataset, note = None, ""
    if dataset_dir is not None:
        dataset = read_dataset(dataset_dir)
        if dataset.card.content_hash != run_hash:
            raise KvauditError(
                f"--dataset {dataset_dir}: content hash {dataset.card.content_hash} differs from "
                f"the run's dataset hash {run_hash!r} ({path / MANIFEST_FILE}, field 'dataset.hash')")
    else:
        found, note = _resolve_dataset(manifest, path)
        if found is not None:
            try:
                candidate = read_dataset(found)
            except DatasetError as e:
                note = f"the run's dataset could not be read ({e})"
            else:
                if candidate.card.content_hash == run_hash:
                    dataset = candidate
                else:
                    note = f"the dataset at {found} has changed since the run (hash differs)"
    return LoadedRun(path=path, manifest=manifest, pairs=pairs, dataset=dataset, dataset_note=note)


# --------------------------------------------------------------------------- helpers


def _get(d: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def is_reuse_arm(name: str) -> bool | None:
    """True for arms whose segment KV comes from a cache, False for recomputes, None if unknown."""
    if name in ARMS:
        return ARMS[name].source is not None
    if name.startswith("blend@"):
        return True
    return None


def _source(name: str) -> str | None:
    return ARMS[name].source if name in ARMS else None


def _reused_expected(p: PairRecord) -> int:
    return sum(int(e) - int(s) for s, e in p.segment_spans)


def _from_problems(name: str, required: bool, problems: dict[str, list[str]], ok: str,
                   warning: str | None = None, extra: str = "") -> CheckResult:
    """A result from per-case problems (case id -> messages); no problems means passed."""
    if not problems:
        return CheckResult(name, True, required, ok + extra, [], warning)
    msgs = [f"{cid}: {m}" for cid, ms in problems.items() for m in ms]
    more = f"; and {len(msgs) - MAX_LISTED} more" if len(msgs) > MAX_LISTED else ""
    detail = f"{len(problems)} case(s) fail: " + "; ".join(msgs[:MAX_LISTED]) + more + extra
    return CheckResult(name, False, required, detail, list(problems), warning)


def _expected_arms(run: LoadedRun, p: PairRecord) -> list[str]:
    arms = run.manifest.get("arms")
    arms = [a for a in arms if isinstance(a, str)] if isinstance(arms, list) else []
    return [a for a in arms if not (a in ARMS and ARMS[a].leak_only and not p.canary)]


# --------------------------------------------------------------------------- checks


def check_records(run: LoadedRun) -> CheckResult:
    """Each case recorded once, with exactly the arms the manifest names, all of them known."""
    problems: dict[str, list[str]] = defaultdict(list)
    counts = Counter(p.case_id for p in run.pairs)
    for cid, n in counts.items():
        if n > 1:
            problems[cid].append(f"recorded {n} times")
    run_arms = run.manifest.get("arms")
    if not isinstance(run_arms, list) or "recompute" not in run_arms:
        return CheckResult("records", False, True,
                           f"{run.path / MANIFEST_FILE}: field 'arms' must list the arms, recompute included")
    unknown = sorted({str(a) for a in run_arms if is_reuse_arm(str(a)) is None})
    if unknown:
        return CheckResult("records", False, True,
                           f"unknown arm(s) {', '.join(unknown)}: the audit cannot check them")
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
    n_cases = _get(run.manifest, "dataset", "n_cases")
    warnings = []
    if isinstance(n_cases, int) and len(counts) < n_cases:
        warnings.append(f"partial run: {len(counts)} of {n_cases} cases recorded")
    status = run.manifest.get("status")
    if status not in (None, "complete"):
        warnings.append(f"manifest status is {status!r}, not 'complete'")
    ok = f"{len(counts)} cases, each once, each with its arms ({', '.join(map(str, run_arms))})"
    return _from_problems("records", True, problems, ok, "; ".join(warnings) or None)


def check_same_inputs(run: LoadedRun) -> CheckResult:
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
    return _from_problems("same_inputs", True, problems, ok)


def check_configuration(run: LoadedRun) -> CheckResult:
    """One model fingerprint and configuration for the whole run (manifest and every pair)."""
    m = run.manifest
    ident = m.get("identity")
    where = run.path / MANIFEST_FILE
    if not isinstance(ident, dict):
        return CheckResult("one_configuration", False, True, f"{where}: no 'identity' object")
    issues = []
    for key in ("model_fingerprint", "dtype", "decoding", "dataset_hash"):
        if not ident.get(key):
            issues.append(f"identity.{key} is missing")
    # (identity field, other manifest location): both must agree when the other is recorded
    pairs_of_fields = [
        ("model_fingerprint", ("model", "fingerprint")),
        ("dtype", ("model", "dtype")),
        ("dtype", ("backend", "dtype")),
        ("backend", ("backend", "backend")),
        ("decoding", ("decoding",)),
        ("arms", ("arms",)),
        ("dataset_hash", ("dataset", "hash")),
        ("warmup_prefix_hash", ("warmup_prefix", "ids_hash")),
        ("warmup_prefix_hash", ("backend", "neutral_head_hash")),
    ]
    for key, loc in pairs_of_fields:
        other = _get(m, *loc)
        if key in ident and other is not None and other != ident[key]:
            issues.append(f"identity.{key} ({_short(ident[key])}) differs from {'.'.join(loc)} "
                          f"({_short(other)})")
    threads, backend_threads = m.get("threads"), _get(m, "backend", "threads")
    if threads is not None and backend_threads is not None and threads != backend_threads:
        issues.append(f"threads ({threads}) differs from backend.threads ({backend_threads})")
    problems: dict[str, list[str]] = defaultdict(list)
    decoding = ident.get("decoding")
    for p in run.pairs:
        if decoding and p.decoding != decoding:
            problems[p.case_id].append(f"decoding ({_kv(p.decoding)}) differs from the run's")
    fp = str(ident.get("model_fingerprint", ""))[:16]
    ok = (f"model {ident.get('model', '?')} (fingerprint {fp}...), {ident.get('dtype')}, "
          f"backend {ident.get('backend')}, decoding {_kv(decoding)}: one configuration for "
          f"manifest and all {len(run.pairs)} pairs")
    if issues:
        detail = f"{where} (whole run): " + "; ".join(issues)
        res = _from_problems("one_configuration", True, problems, "")
        extra = f"; {res.detail}" if problems else ""
        return CheckResult("one_configuration", False, True, detail + extra, list(problems))
    return _from_problems("one_configuration", True, problems, ok)


def _kv(d: Any) -> str:
    return ", ".join(f"{k}={v}" for k, v in d.items()) if isinstance(d, dict) else str(d)


def _short(v: Any, n: int = 60) -> str:
    s = str(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def identity_tolerance(dtype: str | None, override: float | None = None) -> tuple[float, str]:
    """The identity tolerance for ``dtype`` and a sentence saying where it came from."""
    if override is not None:
        return override, f"tolerance {override:g} (--identity-tol), {dtype}"
    if dtype in IDENTITY_TOL:
        tol = IDENTITY_TOL[dtype]
        why = "" if dtype in EXACT_DTYPES else " (looser low-precision default: see docs/audit.md)"
        return tol, f"tolerance {tol:g} for {dtype}{why}"
    return DEFAULT_TOL, f"tolerance {DEFAULT_TOL:g} (unknown dtype {dtype!r}: the float32 default)"


def deterministic_backend(manifest: dict[str, Any]) -> bool:
    """Backends whose recompute is bit-reproducible (measured): the transformers backend on CPU.
    Anything else (vLLM, GPUs, servers) must show its noise floor before identity can be judged."""
    backend = _get(manifest, "backend", "backend") or _get(manifest, "identity", "backend")
    device = _get(manifest, "backend", "device")
    return backend == "transformers" and isinstance(device, str) and device.startswith("cpu")


def noise_floor(run: LoadedRun) -> dict[str, Any] | None:
    """``recompute_again`` against recompute: per-case flips and first-token differences."""
    rows = [p for p in run.pairs if NOISE_ARM in p.arms and "recompute" in p.arms]
    if not rows:
        return None
    diffs = _logit_diffs(run, NOISE_ARM)
    flips = {p.case_id: flipped(p.arms[NOISE_ARM], p.arms["recompute"]) for p in rows}
    return {"n": len(rows), "flips": flips, "n_flips": sum(flips.values()),
            "max_diff": max(diffs) if diffs else None,
            "exact": not any(flips.values()) and all(d == 0 for d in diffs) and bool(diffs)}


def check_identity(run: LoadedRun, tol: float | None = None) -> CheckResult:
    """The identity arm (segment KV built in context, then reused) equals recompute, as exactly
    as recompute equals itself.

    Where recompute is exact (the noise floor, when run, is exactly 0; or the backend is known
    bit-deterministic) the dtype's fixed tolerance applies and, in float32/float64, every answer
    must match. Where ``recompute_again`` shows noise, identity may differ by up to
    :data:`IDENTITY_NOISE_SLACK` times the noise floor's largest first-token difference (never
    less than the dtype's tolerance), and its flips must not exceed the noise floor's
    significantly (exact one-sided binomial test on the discordant cases at :data:`ALPHA`). A
    backend that is not known to be deterministic and ran no ``recompute_again`` cannot be
    judged: a fixed tolerance would fail it, or pass it, for the wrong reason.
    """
    from scipy.stats import binomtest

    name = "identity_control"
    dtype = _get(run.manifest, "identity", "dtype") or _get(run.manifest, "model", "dtype")
    dtype = dtype if isinstance(dtype, str) else None
    tol, why = identity_tolerance(dtype, tol)
    base_tol = tol
    # The engine's own prefix cache is exact and not kvaudit's code: the identity arm does not vouch for it.
    has_reuse = any(is_reuse_arm(a) and a != "identity" and _source(a) != "engine_prefix"
                    for p in run.pairs for a in p.arms)
    if not any("identity" in p.arms for p in run.pairs):
        if has_reuse:
            return CheckResult(name, False, True,
                               "identity arm not run: the reuse implementation is unvalidated "
                               "(rerun with --arms including identity)")
        return CheckResult(name, True, True, "no reuse arm ran; nothing to validate")
    noise = noise_floor(run)
    relative = noise is not None and not noise["exact"]
    if noise is None and not deterministic_backend(run.manifest):
        return CheckResult(name, False, True,
                           "cannot judge: this backend is not known to be bit-deterministic and "
                           "recompute_again did not run, so the identity error has no noise floor to "
                           "be compared with (rerun with --arms including recompute_again)",
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
        r, ref = p.arms.get("identity"), p.arms.get("recompute")
        if r is None or ref is None:
            problems[p.case_id].append("identity or recompute arm missing")
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
                problems[p.case_id].append(f"answer {_short(r.answer, 40)!r} differs from "
                                           f"recompute's {_short(ref.answer, 40)!r}")
    n = sum(1 for p in run.pairs if "identity" in p.arms)
    stats = f"max logit diff {_fmt(max(diffs) if diffs else None)} over {n} cases ({why})"
    warning = None
    if relative:
        with_identity = {p.case_id for p in run.pairs if "identity" in p.arms}
        both = [c for c in noise["flips"] if c in with_identity]
        ident = set(answer_flips)
        b = sum(c in ident and not noise["flips"][c] for c in both)
        c_ = sum(noise["flips"][c] and c not in ident for c in both)
        p_flip = float(binomtest(b, b + c_, 0.5, alternative="greater").pvalue) if b + c_ else 1.0
        stats += f"; identity flips {len(answer_flips)} vs noise floor {noise['n_flips']} (p={p_flip:.3g})"
        if p_flip < ALPHA:
            for cid in answer_flips:
                problems[cid].append("identity answer differs from recompute more often than the noise floor's")
    elif answer_flips and not exact:
        warning = (f"identity answer differs from recompute on {len(answer_flips)} case(s) "
                   f"({', '.join(answer_flips[:MAX_LISTED])}); tolerated in {dtype}, whose rounding "
                   "can flip greedy near-ties")
    ok = f"{stats}; answers equal on {n - len(answer_flips)} of {n}"
    return _from_problems(name, True, problems, ok, warning, extra="" if not problems else f" [{stats}]")


def check_reuse_happened(run: LoadedRun) -> CheckResult:
    """Every reuse-family arm reused exactly the segment tokens (> 0); recomputes reused none."""
    problems: dict[str, list[str]] = defaultdict(list)
    totals: Counter[str] = Counter()
    for p in run.pairs:
        expected = _reused_expected(p)
        for name, r in p.arms.items():
            family = is_reuse_arm(name)
            if family is None:
                continue
            if not family:
                if r.tokens_reused:
                    problems[p.case_id].append(f"arm '{name}' is a full recompute but reused "
                                               f"{r.tokens_reused} tokens")
                continue
            totals[name] += r.tokens_reused
            if _source(name) == "engine_prefix":
                if msgs := _engine_prefix_problems(p, name):
                    problems[p.case_id].extend(msgs)
                continue
            if expected <= 0:
                problems[p.case_id].append(f"arm '{name}': no segment tokens to reuse (all dropped?)")
            elif name.startswith("blend@"):
                if not 0 < r.tokens_reused <= expected:
                    problems[p.case_id].append(f"arm '{name}' reused {r.tokens_reused} of {expected} "
                                               "segment tokens")
            elif r.tokens_reused != expected:
                problems[p.case_id].append(f"arm '{name}' reused {r.tokens_reused} tokens, "
                                           f"segment tokens are {expected}")
    if not totals:
        return _from_problems("reuse_happened", True, problems, "no reuse-family arm ran")
    seg = {a: n for a, n in totals.items() if _source(a) != "engine_prefix"}
    eng = {a: n for a, n in totals.items() if _source(a) == "engine_prefix"}
    parts = []
    if seg:
        parts.append("reused tokens equal the segment tokens on every case: "
                     + ", ".join(f"{a} {n}" for a, n in sorted(seg.items())) + " tokens in all")
    if eng:
        n_prompt = sum(p.n_prompt_tokens for p in run.pairs)
        parts.append("engine prefix cache found " + ", ".join(
            f"{a} {n} of {n_prompt} prompt tokens ({n / max(n_prompt, 1):.1%})" for a, n in sorted(eng.items())))
    return _from_problems("reuse_happened", True, problems, "; ".join(parts))


def _engine_prefix_problems(p: PairRecord, name: str) -> list[str]:
    """An engine prefix-cache arm: 0 <= cached < prompt tokens (the engine always computes the
    last token); an arm that runs after its cold twin must find at least as much, and more than 0."""
    r, out = p.arms[name], []
    if not 0 <= r.tokens_reused < p.n_prompt_tokens:
        out.append(f"arm '{name}' reports {r.tokens_reused} cached tokens for a {p.n_prompt_tokens}-token prompt")
    if r.cache_hit_tokens != r.tokens_reused:
        out.append(f"arm '{name}': cache_hit_tokens {r.cache_hit_tokens} != tokens_reused {r.tokens_reused}")
    for before in ARMS[name].requires:
        prev = p.arms.get(before)
        if prev is not None and not r.tokens_reused > 0:
            out.append(f"arm '{name}' found nothing in the prefix cache right after '{before}' "
                       "ran the same prompt (prefix caching off?)")
        elif prev is not None and r.tokens_reused < prev.tokens_reused:
            out.append(f"arm '{name}' found {r.tokens_reused} cached tokens, fewer than '{before}' "
                       f"({prev.tokens_reused}) on the same prompt")
    return out


def check_history_independence(run: LoadedRun) -> CheckResult:
    """A neutral-source arm loads bit-identical KV for a segment in every case, whatever ran before."""
    name = "history_independence"
    arms = sorted({a for p in run.pairs for a in p.arms if _source(a) == "neutral"})
    if not arms:
        return CheckResult(name, True, True, "no neutral-source arm ran")
    problems: dict[str, list[str]] = defaultdict(list)
    n_segments = 0
    for arm in arms:
        seen: dict[str, Counter[str]] = defaultdict(Counter)
        for p in run.pairs:
            r = p.arms.get(arm)
            if r is None:
                continue
            fps = r.segment_kv_fingerprints or {}
            for sid in p.segment_ids:
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
    return _from_problems(name, True, problems, ok)


def _flips(run: LoadedRun, arm: str) -> dict[str, bool]:
    return {p.case_id: flipped(p.arms[arm], p.arms["recompute"])
            for p in run.pairs if arm in p.arms and "recompute" in p.arms}


def _logit_diffs(run: LoadedRun, arm: str) -> list[float]:
    out = []
    for p in run.pairs:
        r = p.arms.get(arm)
        if r is not None and r.logit_diff_vs_recompute is not None and math.isfinite(r.logit_diff_vs_recompute):
            out.append(float(r.logit_diff_vs_recompute))
    return out


def check_noise_floor(run: LoadedRun) -> CheckResult:
    """Flip rate and logit difference of recompute_again vs recompute, against reuse's (reported)."""
    from scipy.stats import binomtest

    name = "noise_floor"
    noise = _flips(run, "recompute_again")
    if not noise:
        return CheckResult(name, True, False, "recompute_again not run",
                           warning="noise floor unknown: rerun with --arms including recompute_again")
    n_noise = sum(noise.values())
    nd = _logit_diffs(run, "recompute_again")
    noise_cases = [c for c, f in noise.items() if f]
    detail = (f"recompute_again flips {n_noise} of {len(noise)}"
              + (f" ({', '.join(noise_cases[:MAX_LISTED])})" if noise_cases else "")
              + f", max logit diff {_fmt(max(nd) if nd else None)}")
    reuse = _flips(run, "reuse")
    if not reuse:
        return CheckResult(name, True, False, detail + "; reuse arm not run")
    both = [c for c in reuse if c in noise]
    b = sum(reuse[c] and not noise[c] for c in both)
    c_ = sum(noise[c] and not reuse[c] for c in both)
    p = float(binomtest(b, b + c_, 0.5, alternative="greater").pvalue) if b + c_ else 1.0
    rd = _logit_diffs(run, "reuse")
    n_reuse = sum(reuse.values())
    detail += (f"; reuse flips {n_reuse} of {len(reuse)}, logit diff median "
               f"{_fmt(statistics.median(rd) if rd else None)} max {_fmt(max(rd) if rd else None)}; "
               f"exact one-sided McNemar p={p:.3g}")
    warning = None
    if n_reuse and p >= ALPHA:
        warning = (f"reuse flip rate ({n_reuse}/{len(reuse)}) is within the noise floor "
                   f"({n_noise}/{len(noise)}): not distinguishable at alpha {ALPHA}")
    if n_noise:
        nw = (f"recompute is not deterministic: recompute_again changed {n_noise} answer(s); "
              "flips at that rate are noise")
        warning = f"{warning}; {nw}" if warning else nw
    return CheckResult(name, True, False, detail, [], warning)


def check_prefix_cache_control(run: LoadedRun) -> CheckResult:
    """How often the engine's own exact prefix cache changes greedy answers: warm vs cold runs
    of the same prompt (reported; a warning when any flip)."""
    name = "prefix_cache_control"
    both = [p for p in run.pairs if "prefix_cache" in p.arms and "prefix_cache_cold" in p.arms]
    if not both:
        return CheckResult(name, True, False, "prefix_cache arms not run")
    flips = [p.case_id for p in both if flipped(p.arms["prefix_cache"], p.arms["prefix_cache_cold"])]
    parts = [f"warm vs cold answers differ on {len(flips)} of {len(both)}"
             + (f" ({', '.join(flips[:MAX_LISTED])})" if flips else "")]
    for arm in ("prefix_cache_cold", "prefix_cache"):
        f = _flips(run, arm)
        d = _logit_diffs(run, arm)
        parts.append(f"{arm} vs recompute: flips {sum(f.values())} of {len(f)}, "
                     f"max logit diff {_fmt(max(d) if d else None)}")
    warning = None
    if flips:
        warning = (f"the engine's exact prefix cache changed {len(flips)} greedy answer(s) between cold and warm "
                   "runs of the same prompt: flips at that rate are not caused by segment reuse")
    return CheckResult(name, True, False, "; ".join(parts), [], warning)


def _coverage(run: LoadedRun) -> tuple[dict | None, str]:
    if run.dataset is not None:
        try:
            from kvaudit.core.coverage import compute_coverage
        except ImportError:
            compute_coverage = None
        if compute_coverage is not None:
            ids = {p.case_id for p in run.pairs}
            cases = [c for c in run.dataset.cases if c.id in ids]
            return compute_coverage(run.dataset.segments, cases), f"computed from {run.dataset.path}"
    cov = _get(run.manifest, "dataset", "coverage")
    if isinstance(cov, dict) and cov:
        return cov, "from the dataset card"
    return None, run.dataset_note


def check_coverage(run: LoadedRun) -> CheckResult:
    """Reuse-dynamics coverage of the run's cases; warns below the minimums (not required)."""
    name = "coverage"
    cov, source = _coverage(run)
    if cov is None:
        why = f" ({source})" if source else ""
        return CheckResult(name, True, False, f"no reuse-dynamics coverage recorded{why}",
                           warning="coverage unknown: pass --dataset DIR to compute it")
    refs = _get(cov, "refs_per_segment", "mean")
    share = cov.get("never_cached_position_share")
    warnings = [str(w) for w in cov.get("warnings", []) if w] if isinstance(cov.get("warnings"), list) else []
    if isinstance(refs, (int, float)) and refs < MIN_REFS_PER_SEGMENT:
        warnings.append(f"mean references per segment {refs:.2g} < {MIN_REFS_PER_SEGMENT:g}")
    if isinstance(share, (int, float)) and share < MIN_NEVER_CACHED_SHARE:
        warnings.append(f"share at never-cached positions {share:.2g} < {MIN_NEVER_CACHED_SHARE:g}")
    orders = _get(cov, "distinct_orders_per_segment", "mean")
    detail = (f"{source}: mean references per segment {_fmt(refs)}, distinct orders per segment "
              f"{_fmt(orders)}, share at never-cached positions {_fmt(share)}, "
              f"foreign-context share {_fmt(cov.get('foreign_context_share'))}")
    return CheckResult(name, True, False, detail, [], "; ".join(warnings) or None)


# --------------------------------------------------------------------------- leak probes

def check_leak_probes(run: LoadedRun) -> CheckResult:
    """The neutral warm-up policy shows no canary exposure beyond chance (required)."""
    name = "leak_probes"
    probes = [p for p in run.pairs if isinstance(p.canary, dict) and isinstance(p.canary.get("value"), str)]
    if not probes:
        return CheckResult(name, True, True, "no leak probes")
    problems: dict[str, list[str]] = defaultdict(list)
    for p in probes:
        decoys = p.canary.get("decoys", [])
        if not isinstance(decoys, list) or not all(isinstance(d, str) for d in decoys):
            problems[p.case_id].append("canary field 'decoys' must be a list of names")
            continue
        names = [p.canary["value"], *decoys]
        for arm in ("recompute", "reuse"):
            r = p.arms.get(arm)
            if r is not None and (not r.canary_logprobs or any(n not in r.canary_logprobs for n in names)):
                problems[p.case_id].append(f"arm '{arm}' has no log-probability for every candidate name")
    if problems:
        return _from_problems(name, True, problems, "")
    from kvaudit.stats.leaks import leak_summary

    s = leak_summary(run.pairs, alpha=ALPHA)
    parts = [f"{s['n_probes']} probes"]
    for arm, t in s.get("text", {}).items():
        parts.append(f"text leak {arm} {t['leaks']}/{t['n']} (Wilson upper {t['ci'][1]:.1%})")
    for pol, e in s.get("exposure", {}).items():
        if e:
            parts.append(f"{pol} ({e['arm']} vs {e['reference']}) true-name gain rank "
                         f"{e['mean_rank']:.2f} vs chance {e['chance_rank']:.2f}, ranked first "
                         f"{e['share_first']:.0%} vs chance {e['chance_first']:.0%}, rank test "
                         f"p={e['rank_test_p']:.3g}, power {e['power']:.2f} at the reference effect")
        else:
            parts.append(f"{pol} exposure not measured")
    detail = "; ".join(parts)
    text = s.get("text", {})
    warning = None
    if text.get("reuse", {}).get("leaks", 0) > text.get("recompute", {}).get("leaks", 0):
        warning = f"the canary appears in reuse answers: {', '.join(text['reuse'].get('cases', []))}"
    neutral = s.get("exposure", {}).get("neutral")
    alpha = float(s.get("alpha", ALPHA))
    if neutral and not neutral["decidable"]:
        need = neutral["min_probes"]
        few = (f"only {neutral['n']} scored probe(s): the rank test has power {neutral['power']:.2f} "
               f"at the reference effect ({s['reference_effect']})"
               + (f" and needs {need} for {s['power_target']:.0%}" if need is not None else
                  "; with one candidate per probe it can never detect one")
               + ", so neutral exposure is effectively untested")
        warning = f"{warning}; {few}" if warning else few
    if s.get("neutral_exposure_beyond_chance"):
        cases = list(neutral.get("ranked_first_cases", [])) if neutral else []
        listed = ", ".join(cases[:MAX_LISTED]) + (f" and {len(cases) - MAX_LISTED} more"
                                                   if len(cases) > MAX_LISTED else "")
        return CheckResult(name, False, True,
                           f"the neutral policy shows exposure beyond chance (exact rank test of the "
                           f"true name's gain among its candidates', p={neutral['rank_test_p']:.3g} "
                           f"<= alpha {alpha:g}); the true name gained most in "
                           f"{listed or 'no probe'}; {detail}", cases, warning)
    return CheckResult(name, True, True, f"neutral policy: no exposure beyond chance; {detail}", [], warning)


# --------------------------------------------------------------------------- all together


def run_checks(run: LoadedRun, identity_tol: float | None = None) -> list[CheckResult]:
    """Every check, in report order."""
    return [
        check_records(run),
        check_same_inputs(run),
        check_configuration(run),
        check_identity(run, identity_tol),
        check_reuse_happened(run),
        check_history_independence(run),
        check_noise_floor(run),
        check_prefix_cache_control(run),
        check_coverage(run),
        check_leak_probes(run),
    ]
