"""Load a run directory and answer the report's questions about it (one object, computed once).

:func:`load_run` reads ``manifest.json`` and ``pairs.jsonl`` through the one validated reader
of each (through :class:`kvaudit.core.run_dir.RunDir`),
once: the audit's verification (:func:`kvaudit.audit.trust.verify`: ``missing`` when the audit
has not run) reruns the checks on the same records, and the case questions come from the
dataset the audit read (read again only when the audit did not read it). ``simulation.json`` is
optional (its sha256 is kept, for the gate to check it against what the audit and the attestation
bound; a rate outside [0, 1] raises when read). Anything malformed raises
:class:`~kvaudit.core.dataset_format.DatasetError` with the file and field.

:class:`Analysis` scores every (case, arm) once and then serves paired deltas for any *group*
of cases. A group selector is ``"overall"`` (every answer-quality case), ``"task:<glob>"``
(task families matching a shell glob, pooled: ``task:multi_hop_*``), or ``"<key>:<glob>"`` for
a key of ``PairRecord.strata`` (``hops:2``). Leak probes and cases without a gold answer (and
not agreement cases) are not answer-quality cases.

Token hit rate per arm comes from :func:`kvaudit.core.hit_rate.run_hit_rate` (hit tokens
over prompt tokens, token-weighted), so measured and simulated rates mean the same thing.
"""

from __future__ import annotations

import fnmatch
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvaudit.audit.checks.base import server_decides_reuse
from kvaudit.audit.trust import VerifiedAudit, verify
from kvaudit.core.arms import NOISE_ARM, REFERENCE_ARM, get_arm, known_arm, reference_of
from kvaudit.core.dataset_format import CASES_FILE
from kvaudit.core.errors import DatasetError
from kvaudit.core.jsonio import file_sha256, iter_jsonl
from kvaudit.core.manifest import Manifest, run_dataset_dir
from kvaudit.core.run_dir import RunDir, RunRecords
from kvaudit.core.run_format import PairRecord, case_batches
from kvaudit.core.typed_json import json_type
from kvaudit.reports import scoring
from kvaudit.stats import paired as stats
from kvaudit.stats.leaks import leak_summary
from kvaudit.stats.noninferiority import PairedBound, check_confidence, paired_bound
from kvaudit.stats.speed import RatioInterval, median_ratio, median_ratio_by_batch


def arm_reason(arm: str) -> str:
    """Why an arm is in the run: its spec's ``why`` (:func:`kvaudit.core.arms.get_arm`: registry
    entries and parameterised repairs alike); empty for a name that is no arm."""
    return get_arm(arm).why if known_arm(arm) else ""


@dataclass
class Run(RunRecords):
    """A run directory as the report reads it: ``audit`` is the verified state of its audit
    (:func:`kvaudit.audit.trust.verify`); ``simulation_sha256`` the sha256 of the
    ``simulation.json`` read (``None``: none); ``missing_cases`` the cases the manifest says the
    run was to hold that ``pairs.jsonl`` lacks (ids from the dataset when it is still on disk)."""

    audit: VerifiedAudit
    simulation: dict[str, Any] | None = None
    simulation_sha256: str | None = None
    questions: dict[str, str] = field(default_factory=dict)
    n_expected: int | None = None
    missing_cases: list[str] = field(default_factory=list)


def _check_pairs(pairs: list[PairRecord], path: Path) -> None:
    """What the report needs beyond a well-formed record (:func:`kvaudit.core.run_format.read_pairs`
    checks the types): each case once, each with the reference arm."""
    if not pairs:
        raise DatasetError(f"{path}: no pair records")
    seen: set[str] = set()
    for i, p in enumerate(pairs, 1):
        if p.case_id in seen:
            raise DatasetError(f"{path}, record {i}: field 'case_id': duplicate case {p.case_id!r}")
        seen.add(p.case_id)
        if REFERENCE_ARM not in p.arms:
            raise DatasetError(f"{path}, record {i} ({p.case_id}): field 'arms' has no '{REFERENCE_ARM}' arm")


def _dataset_cases(manifest: Manifest, run_dir: Path, audit: VerifiedAudit) -> list[tuple[str, str]]:
    """``(case id, question)`` in dataset order from the dataset the run names, when it is still
    on disk (empty otherwise): the dataset the audit read when it read that one, else its cases file."""
    found, _ = run_dataset_dir(manifest, run_dir)
    if found is None:
        return []
    read = audit.run.dataset if audit.run is not None else None
    if read is not None and read.path == found:
        return [(c.id, c.question) for c in read.cases]
    try:
        return [(str(o.get("id")), str(o.get("question", ""))) for _, o in iter_jsonl(found / CASES_FILE)]
    except DatasetError:
        return []


def load_run(run_dir: str | Path) -> Run:
    """Read a run directory; missing or malformed manifest/pairs/audit raise DatasetError."""
    files = RunDir(run_dir)
    path = files.path
    if not path.is_dir():
        raise DatasetError(f"{path}: run directory not found")
    manifest = files.read_manifest()
    pairs = files.read_pairs()
    _check_pairs(pairs, files.pairs_file)
    audit = verify(path, manifest=manifest, pairs=pairs)
    simulation = files.read_simulation()
    simulation_sha256 = file_sha256(files.simulation_file) if simulation is not None else None
    cases = _dataset_cases(manifest, path, audit)
    n_expected = manifest.dataset.n_cases if manifest.dataset else None
    missing: list[str] = []
    if n_expected is not None and len(pairs) < n_expected:
        seen = {p.case_id for p in pairs}
        expected = [cid for cid, _ in cases[:n_expected]] if len(cases) >= n_expected else []
        missing = [cid for cid in expected if cid not in seen] or [f"({n_expected - len(pairs)} unnamed)"]
    return Run(path=path, manifest=manifest, pairs=pairs, audit=audit, simulation=simulation,
               simulation_sha256=simulation_sha256, questions=dict(cases), n_expected=n_expected,
               missing_cases=missing)


def _natural(v: str) -> tuple:
    try:
        return (0, float(v), v)
    except ValueError:
        return (1, 0.0, v)


def _decoded(r: Any) -> int:
    """Tokens an arm decoded after its first: as the engine counted them, else its answer's length less one."""
    return r.decode_tokens if r.decode_tokens is not None else max(0, len(r.answer_ids) - 1)


@dataclass(frozen=True)
class FlipRate:
    """How often an arm's answer differs from recompute's (:meth:`Analysis.flips`): ``flips`` of ``n``
    cases, the ``rate`` with its Wilson interval ``ci``, how many were near ties (the reference's
    first-token margin below the run's threshold), the share whose top first token changed, the
    first-token logit differences (mean, 90th percentile, max) and the cases that flipped."""

    arm: str
    n: int
    flips: int
    rate: float
    ci: list[float] | None
    near_tie_cases: int
    near_tie_flips: int
    flips_not_near_tie: int
    top1_changed_rate: float | None
    logit_diff_mean: float | None
    logit_diff_p90: float | None
    logit_diff_max: float | None
    flipped_cases: list[str]

    def as_dict(self) -> dict[str, Any]:
        """The record as summary.json writes it."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class GroupDelta(stats.PairedDelta):
    """A paired delta of ``arm`` against its ``reference`` on one ``group`` of cases."""

    arm: str
    group: str
    reference: str


@dataclass(frozen=True, kw_only=True)
class Comparison(GroupDelta):
    """A row of :meth:`Analysis.comparisons`: a group's delta with its p-value Holm-adjusted across
    the arm's groups (None where the test gave none)."""

    p_adj: float | None


@dataclass(frozen=True, kw_only=True)
class FlipExcess(stats.PairedDelta):
    """``arm``'s flip rate minus ``noise_arm``'s on the same cases, as a paired delta of 0/1 flips."""

    arm: str
    noise_arm: str


class Analysis:
    """Scores and statistics of one run; every number the report and gate show comes from here."""

    def __init__(self, run: Run, *, near_tie: float = scoring.DEFAULT_NEAR_TIE,
                 confidence: float = stats.DEFAULT_CONFIDENCE, min_icc: float = 0.0):
        self.run = run
        self.near_tie = near_tie
        self.confidence = check_confidence(confidence)
        self.min_icc = min_icc
        self.scores = scoring.score_pairs(run.pairs, near_tie=near_tie)
        quality = self.scores[self.scores["scorable"]]
        self._wide = quality.pivot(index="case_id", columns="arm", values="score")
        self._meta = quality.drop_duplicates("case_id").set_index("case_id")
        self._docs = self.scores.drop_duplicates("case_id").set_index("case_id")["documents"]

    @cached_property
    def rows(self) -> dict[tuple[str, str], dict[str, Any]]:
        """Score rows keyed by ``(case_id, arm)`` (plain dicts: fast lookups for per-case output)."""
        return {(r["case_id"], r["arm"]): r for r in self.scores.to_dict("records")}

    # ------------------------------------------------------------------ arms and groups

    @cached_property
    def arms(self) -> list[str]:
        """Every arm in the run, recompute first, then in the manifest's (or first seen) order."""
        seen: list[str] = []
        for name in self.run.manifest.arms or []:
            if name not in seen:
                seen.append(name)
        for p in self.run.pairs:
            seen.extend(a for a in p.arms if a not in seen)
        present = {a for p in self.run.pairs for a in p.arms}
        ordered = [a for a in seen if a in present]
        return [REFERENCE_ARM] + [a for a in ordered if a != REFERENCE_ARM]

    @property
    def compared_arms(self) -> list[str]:
        return [a for a in self.arms if a != REFERENCE_ARM]

    @cached_property
    def tasks(self) -> list[str]:
        return sorted(self._meta["task"].unique()) if len(self._meta) else []

    @cached_property
    def strata_keys(self) -> list[str]:
        return sorted(c.split(":", 1)[1] for c in self._meta.columns if c.startswith("stratum:"))

    def groups(self) -> list[str]:
        """``overall``, ``agreement`` (when the run has such cases), each task family, then each
        stratum value, in a stable order."""
        out = ["overall"] + (["agreement"] if self._agreement.any() else []) + [f"task:{t}" for t in self.tasks]
        for key in self.strata_keys:
            values = self._meta[f"stratum:{key}"].dropna().unique()
            out += [f"{key}:{v}" for v in sorted(map(str, values), key=_natural)]
        return out

    @cached_property
    def _agreement(self) -> pd.Series:
        return self._meta["metric"] == "agreement"

    def select(self, group: str) -> pd.Index:
        """Case ids (answer-quality cases) that a group selector picks.

        ``overall`` and stratum groups hold the gold-scored cases only: an agreement case scores
        recompute against itself (always 1), so every arm's delta there is at most 0 and a
        paraphrase counts as a loss; those cases form the ``agreement`` group (and their task
        family's) instead of biasing ``overall``.
        """
        gold = self._meta.index[~self._agreement.to_numpy(bool)]
        if group == "overall":
            return gold
        if group == "agreement":
            return self._meta.index[self._agreement.to_numpy(bool)]
        key, sep, pattern = group.partition(":")
        if not sep:
            raise ValueError(f"group {group!r} must be 'overall', 'task:<glob>' or '<stratum>:<glob>'")
        column = "task" if key == "task" else f"stratum:{key}"
        if column not in self._meta.columns:
            return self._meta.index[:0]
        # A case without this stratum (missing value) matches no glob; pandas 3 keeps it missing
        # even through astype(str), so test for it explicitly.
        values = self._meta[column]
        picked = values.map(lambda v: not pd.isna(v) and fnmatch.fnmatchcase(str(v), pattern))
        ids = self._meta.index[picked.to_numpy(bool)]
        return ids if key == "task" else ids.intersection(gold, sort=False)

    # ------------------------------------------------------------------ quality deltas

    def _paired(self, arm: str, group: str) -> tuple[str, pd.DataFrame]:
        """``arm``'s reference and the group's cases scored under both (columns ref, arm)."""
        ids = self.select(group)
        ref = reference_of(arm)
        if arm in self._wide.columns and ref in self._wide.columns:
            return ref, self._wide.loc[ids, [ref, arm]].dropna()
        return ref, pd.DataFrame(columns=[ref, arm])

    def delta(self, arm: str, group: str = "overall") -> GroupDelta:
        """Paired delta of ``arm`` against its reference on a group (see :func:`stats.paired_delta`):
        recompute, or for the oracle its own recompute on the same evidence-only prompt."""
        ref, both = self._paired(arm, group)
        d = stats.paired_delta(both[ref].to_numpy(float), both[arm].to_numpy(float),
                               self._docs.loc[both.index].tolist(), confidence=self.confidence,
                               min_icc=self.min_icc)
        return GroupDelta(**vars(d), arm=arm, group=group, reference=ref)

    def sequential_decision(self, arm: str, group: str, margin_points: float, plan: Any, look: int) -> Any:
        """The sequential design's decision (:func:`kvaudit.stats.sequential.decide_at_look`) for
        ``arm`` on a group at look ``look``, margin in points."""
        from kvaudit.stats.sequential import decide_at_look

        ref, both = self._paired(arm, group)
        d = both[arm].to_numpy(float) - both[ref].to_numpy(float)
        return decide_at_look(d, self._docs.loc[both.index].tolist(), margin_points / stats.SCALE, plan, look,
                              min_icc=self.min_icc)

    def flip_excess(self, arm: str, noise_arm: str = NOISE_ARM) -> FlipExcess | None:
        """``arm``'s flip rate minus the noise floor's on the same cases (points), with the
        paired interval of :func:`stats.paired_delta` (flips as 0/1 scores)."""
        rows = self.scores[self.scores["flip"].notna()]
        wide = rows.pivot(index="case_id", columns="arm", values="flip")
        if arm not in wide.columns or noise_arm not in wide.columns or arm == noise_arm:
            return None
        both = wide[[noise_arm, arm]].dropna().astype(float)
        if both.empty:
            return None
        d = stats.paired_delta(both[noise_arm].to_numpy(float), both[arm].to_numpy(float),
                               self._docs.loc[both.index].tolist(), confidence=self.confidence)
        return FlipExcess(**vars(d), arm=arm, noise_arm=noise_arm)

    def comparisons(self, arm: str) -> list[Comparison]:
        """Delta rows for every group with cases, with Holm-adjusted p-values across them."""
        rows = [r for r in (self.delta(arm, g) for g in self.groups()) if r.n > 0]
        return [Comparison(**vars(r), p_adj=adj) for r, adj in zip(rows, stats.holm([r.p for r in rows]), strict=True)]

    # ------------------------------------------------------------------ flips, hits, timing

    def flips(self, arm: str) -> FlipRate | None:
        """How often ``arm``'s answer differs from recompute's, over every case with both."""
        rows = self.scores[(self.scores["arm"] == arm) & self.scores["flip"].notna()]
        if rows.empty:
            return None
        flip = rows["flip"].astype(bool)
        near = rows["near_tie"].fillna(False).astype(bool)
        k, n = int(flip.sum()), len(rows)
        diffs = rows["logit_diff"].dropna().astype(float)
        top1 = rows["top1_changed"].dropna().astype(bool)
        return FlipRate(
            arm=arm, n=n, flips=k, rate=k / n, ci=_list(stats.wilson(k, n, self.confidence)),
            near_tie_cases=int(near.sum()), near_tie_flips=int((flip & near).sum()),
            flips_not_near_tie=int((flip & ~near).sum()),
            top1_changed_rate=float(top1.mean()) if len(top1) else None,
            logit_diff_mean=float(diffs.mean()) if len(diffs) else None,
            logit_diff_p90=float(np.quantile(diffs, 0.9)) if len(diffs) else None,
            logit_diff_max=float(diffs.max()) if len(diffs) else None,
            flipped_cases=rows.loc[flip.to_numpy(), "case_id"].tolist(),
        )

    def flip_bound(self, arm: str) -> PairedBound | None:
        """``arm``'s flip rate (answers that differ from recompute's) with the paired bound's
        interval and the documents' design effect (:func:`paired_bound` on 0/1 flips): what a
        ``[flips]`` gate threshold judges. None where the arm has no flip scores."""
        rows = self.scores[(self.scores["arm"] == arm) & self.scores["flip"].notna()]
        if rows.empty:
            return None
        return paired_bound(rows["flip"].astype(float).to_numpy(), self._docs.loc[rows["case_id"]].tolist(),
                            confidence=self.confidence, min_icc=self.min_icc)

    def hit_rate(self, arm: str, basis: str = "prompt") -> float | None:
        """Measured hit rate of ``arm``: ``prompt`` basis is the simulator's token hit rate
        (tokens already cached / prompt tokens); ``segment`` basis is chunk-aligned (tokens loaded
        from the segment store / segment tokens)."""
        from kvaudit.core.hit_rate import run_hit_rate, run_segment_hit_rate

        if basis == "segment" and known_arm(arm) and (
                get_arm(arm).source == "engine_prefix"
                or get_arm(arm).role in ("tenant_probe", "segment_tenant_probe")
                or (get_arm(arm).source and server_decides_reuse(self.run))):
            # an engine's prefix cache (or a server's own reuse, or what another tenant's request
            # was served) holds blocks, not segments
            return None
        fn = run_segment_hit_rate if basis == "segment" else run_hit_rate
        try:
            return fn(self.run.pairs, arm).rate
        except ValueError as e:
            field_ = "tokens_reused" if basis == "segment" else "cache_hit_tokens"
            raise DatasetError(f"{RunDir(self.run.path).pairs_file}: field '{field_}' of arm '{arm}': {e}") from None

    def simulated_hit_rates(self) -> dict[str, float]:
        """``"<policy> @ <capacity>" -> token hit rate`` from ``simulation.json`` (``results``).
        A rate of null (no requests) is left out; one that is not a finite number in [0, 1]
        (``57.0``, ``NaN``, a string) raises :class:`DatasetError` naming the file and field."""
        results = (self.run.simulation or {}).get("results")
        out: dict[str, float] = {}
        for i, r in enumerate(results if isinstance(results, list) else []):
            rate = r.get("token_hit_rate") if isinstance(r, dict) else None
            if rate is None:
                continue
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise DatasetError(f"{RunDir(self.run.path).simulation_file}: field 'results[{i}].token_hit_rate' "
                                   f"must be a rate in [0, 1], got {_shown(rate)}")
            out[f"{r.get('policy', '?')} @ {r.get('capacity', '?')}"] = float(rate)
        return out

    def ttft(self, arm: str) -> dict[str, Any] | None:
        t = self.scores.loc[self.scores["arm"] == arm, "ttft_s"].dropna().astype(float)
        if t.empty:
            return None
        p50, p90, p99 = np.quantile(t, [0.5, 0.9, 0.99])
        return {"n": len(t), "mean": float(t.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}

    def ttft_parts(self, arm: str) -> dict[str, Any] | None:
        """What ``arm``'s recorded TTFT holds, medians over its cases (seconds): the head's own
        request where one went first (vLLM's connector loads only a prefix, so segment reuse
        prefills the head by itself), the engine's own first-token time for the main request
        where it keeps one, and the rest, kvaudit's client. ``None`` where neither was recorded."""
        rows = [p.arms[arm] for p in self.run.pairs if arm in p.arms]
        heads = [r.head_s for r in rows]
        timed = [r for r in rows if r.engine_ttft_s is not None and r.head_s is not None and r.ttft_s is not None]
        if not rows or (not any(heads) and not timed):
            return None
        out: dict[str, Any] = {"n": len(rows), "head_s": float(np.median(heads)) if any(heads) else None,
                               "engine_s": None, "client_s": None}
        if timed:
            out["engine_s"] = float(np.median([r.engine_ttft_s for r in timed]))
            out["client_s"] = float(np.median([r.ttft_s - r.head_s - r.engine_ttft_s for r in timed]))  # type: ignore[operator]
        return out

    def times(self, arm: str, metric: str) -> tuple[list[float], list[float]]:
        """Per case that ran both, ``arm``'s and its reference's times for ``metric``
        (:data:`kvaudit.stats.speed.METRICS`): TTFT, or decode seconds per output token after the
        first (cases where either answer has fewer than two tokens are left out)."""
        a, b, _ = self._times(arm, metric)
        return a, b

    def _times(self, arm: str, metric: str) -> tuple[list[float], list[float], list[str | None]]:
        """:meth:`times`, and each case's batch (the cases its arms ran together, or None)."""
        ref = reference_of(arm)
        a, b, batch = [], [], []
        for p in self.run.pairs:
            x, y = p.arms.get(arm), p.arms.get(ref)
            if x is None or y is None:
                continue
            if metric == "ttft":
                a.append(x.ttft_s)
                b.append(y.ttft_s)
                batch.append(p.batch)
            else:
                nx, ny = _decoded(x), _decoded(y)
                if nx and ny:
                    a.append(x.decode_s / nx)
                    b.append(y.decode_s / ny)
                    batch.append(p.batch)
        return a, b, batch

    def speed(self, arm: str, metric: str = "ttft") -> RatioInterval | None:
        """``arm``'s time over its reference's: the median per-case ratio with its distribution-free
        interval at the run's confidence (:func:`kvaudit.stats.speed.median_ratio`), or where cases
        ran in batches (``--concurrent-cases``) the median over batches of a batch's median ratio
        (:func:`~kvaudit.stats.speed.median_ratio_by_batch`: cases of one batch are not independent).
        A run whose cases ran several at a time without recording which gets no interval."""
        a, b, batch = self._times(arm, metric)
        labels, unrecorded = case_batches(batch, self.concurrent_cases)
        if labels is not None:
            return median_ratio_by_batch(a, b, labels, self.confidence)
        iv = median_ratio(a, b, self.confidence)
        if iv is not None and unrecorded:
            return RatioInterval(iv.n, iv.median, None, None, iv.confidence, unjudged=unrecorded)
        return iv

    @property
    def concurrent_cases(self) -> int:
        """How many cases each arm ran for at once (the manifest's ``backend.batching``; 1 if unsaid)."""
        batching = (self.run.manifest.backend or {}).get("batching")
        n = batching.get("concurrent_cases") if isinstance(batching, dict) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1

    def speedup(self, arm: str) -> dict[str, Any] | None:
        """Recompute TTFT over ``arm`` TTFT: ratio of medians and median of per-case ratios."""
        wide = self.scores.pivot(index="case_id", columns="arm", values="ttft_s")
        if arm not in wide.columns:
            return None
        both = wide[[REFERENCE_ARM, arm]].dropna()
        both = both[(both > 0).all(axis=1)]
        if both.empty:
            return None
        return {"n": len(both),
                "ratio_of_medians": float(both[REFERENCE_ARM].median() / both[arm].median()),
                "median_paired": float((both[REFERENCE_ARM] / both[arm]).median())}

    @cached_property
    def leaks(self) -> dict[str, Any]:
        return leak_summary(self.run.pairs, confidence=self.confidence)

    @cached_property
    def timing(self) -> dict[str, Any]:
        """``{probe: TimingAUC}`` of the tenant probes that ran (:func:`kvaudit.reports.security.timing_probes`)."""
        from kvaudit.reports.security import timing_probes

        return timing_probes(self.run.pairs, self.confidence, self.concurrent_cases)

    @cached_property
    def security(self) -> dict[str, Any]:
        """Tenant isolation, the timing side channel and the cold/flushed/warm attribution
        (:func:`kvaudit.reports.security.security_summary`)."""
        from kvaudit.reports.security import security_summary

        # cases run together: the report says the timing interval clusters by batch
        return {**security_summary(self.run.pairs, self.timing), "concurrent_cases": self.concurrent_cases}

    @property
    def coverage(self) -> dict[str, Any] | None:
        ds = self.run.manifest.dataset
        return (ds.coverage or None) if ds else None

    # ------------------------------------------------------------------ figures (additive)

    def flips_by_group(self, arm: str, groups: list[str] | None = None) -> list[dict[str, Any]]:
        """``arm``'s flip rate on each group's answer-quality cases (default: every group of
        :meth:`groups`), with Wilson intervals at the run's confidence; a group where the arm
        has no case is left out. With ``recompute_again`` it gives the noise floor per group."""
        rows = self.scores[(self.scores["arm"] == arm) & self.scores["flip"].notna()]
        flips = rows.set_index("case_id")["flip"]
        out = []
        for g in self.groups() if groups is None else groups:
            picked = flips.loc[flips.index.intersection(self.select(g), sort=False)].astype(bool)
            k, n = int(picked.sum()), len(picked)
            if n:
                out.append({"group": g, "arm": arm, "n": n, "flips": k, "rate": k / n,
                            "ci": _list(stats.wilson(k, n, self.confidence))})
        return out

    def ttft_samples(self, arm: str) -> list[float]:
        """Every case's time to first token (seconds) under ``arm``, in case order: the values
        :meth:`ttft` summarises, for the distribution figure."""
        t = self.scores.loc[self.scores["arm"] == arm, "ttft_s"].dropna().astype(float)
        return [float(x) for x in t]


def _shown(v: Any) -> str:
    """A JSON value for an error message: a number as %g (NaN fails ``0 <= v <= 1`` too), else its type."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return json_type(v)
    try:
        return f"{float(v):g}"
    except OverflowError:
        return "an integer too large for a float"


def _list(x: tuple[float, float] | None) -> list[float] | None:
    return None if x is None else list(x)
