"""Paired execution: every case through every arm, appended to ``pairs.jsonl`` as it completes.

The runner talks to its engine only through :class:`~kvaudit.runners.backend.Backend` and asks the
arm registry for roles and flags; it names no arm.

A run directory is bound to one dataset, model, dtype, arm set and decoding setting (its
*identity*, stored in ``manifest.json``). Rerunning the same command resumes: finished cases are
skipped, a torn last line from a killed run is dropped, and nothing finished is lost. A run
directory made with a different identity is refused instead of being mixed.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvaudit.core.arms import (
    REFERENCE_ARM,
    UNDER_TEST_ARM,
    ArmSpec,
    evidence_only,
    get_arm,
)
from kvaudit.core.attestation import attest, attestation_key
from kvaudit.core.dataset_format import CASES_FILE, Case, Dataset
from kvaudit.core.errors import KvauditError, excerpt
from kvaudit.core.manifest import (
    DatasetRef,
    Manifest,
    ModelInfo,
    RunIdentity,
    ServingChange,
    Session,
    WarmupPrefix,
)
from kvaudit.core.run_dir import RunDir
from kvaudit.core.run_format import MANIFEST_FILE, PAIRS_FILE, PairRecord, flipped
from kvaudit.runners.backend import ArmRequest, Backend, check_info, logit_diff
from kvaudit.runners.prompt import assemble, shortest_prompt_tokens
from kvaudit.runners.registry import check_arms_run_on

# Wall time is split into the reference, the arms under test (reuse; a serving change's candidate),
# "repairs", "controls" (every other arm) and one-time "caching" (building segment KV).
TIMED_ARMS = (REFERENCE_ARM, UNDER_TEST_ARM, "candidate")


@dataclass
class RunConfig:
    dataset: Dataset
    out: Path
    arms: list[str]
    model_name: str
    limit: int | None = None
    extra_manifest: dict[str, Any] = field(default_factory=dict)
    # Leave out the cases no prompt of which fits the model (recorded in the manifest) instead
    # of refusing the run (:func:`check_cases_fit`).
    skip_unfit: bool = False


def git_revision() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def run_identity(cfg: RunConfig, backend: Backend) -> RunIdentity:
    """What must not change between a run and its resumption."""
    info = check_info(backend.info())
    change = backend.serving_change()
    return RunIdentity(
        dataset_hash=cfg.dataset.card.content_hash,
        model_fingerprint=backend.fingerprint,
        model=cfg.model_name,
        backend=info["backend"],
        dtype=info["dtype"],
        arms=list(cfg.arms),
        decoding=backend.decoding.as_dict(),
        warmup_prefix_hash=backend.neutral_hash,
        # Greedy outputs can change with the thread count and library versions.
        threads=info["threads"],
        torch=info["torch"],
        transformers=info.get("transformers"),
        concurrent_cases=backend.concurrent_cases if backend.concurrent_cases > 1 else None,
        # A serving-change run resumes only with the same engines file (what it says, not its bytes).
        extra={"engines_sha256": change["engines_sha256"]} if change else {},
    )


def check_resumable(out: Path, identity: dict[str, Any]) -> Manifest | None:
    """The previous manifest of ``out`` if its identity matches (any subset of keys), else an error.

    Called with the cheap keys (dataset, arms, model name) before a model is loaded, and with the
    full identity once the backend exists.
    """
    run = RunDir(out)
    if not run.manifest_file.exists():
        if run.pairs_file.exists():
            raise KvauditError(f"{out}: has {PAIRS_FILE} but no {MANIFEST_FILE}; use a new --out directory")
        return None
    old = run.read_manifest()
    prev = old.identity.values() if old.identity else {}
    diffs = [k for k in identity if prev.get(k) != identity[k]]
    if diffs:
        k = diffs[0]
        raise KvauditError(
            f"{out} holds a run with a different {k} ({prev.get(k)!r} vs {identity[k]!r}); "
            "use a new --out directory instead of mixing runs"
        )
    return old


class Progress:
    """Running numbers for the progress bar."""

    def __init__(self) -> None:
        self.ttft: dict[str, list[float]] = defaultdict(list)
        self.reused = 0
        self.prompt_tokens = 0
        self.flips = 0

    def add(self, rec: PairRecord) -> None:
        for name, r in rec.arms.items():
            self.ttft[name].append(r.ttft_s)
        if UNDER_TEST_ARM in rec.arms:
            # THE token hit rate (kvaudit.core.hit_rate), as the report's header shows it: tokens
            # already cached when the case arrived, not the ones warmed up for it
            self.reused += rec.arms[UNDER_TEST_ARM].cache_hit_tokens
            self.prompt_tokens += rec.n_prompt_tokens
            self.flips += flipped(rec.arms[UNDER_TEST_ARM], rec.arms[REFERENCE_ARM])

    def postfix(self) -> dict[str, str]:
        out = {}
        if self.prompt_tokens:
            out["token_hit"] = f"{self.reused / self.prompt_tokens:.0%}"
            out["flips"] = str(self.flips)
        for name in TIMED_ARMS:
            if self.ttft.get(name):
                out[f"ttft_{name}"] = f"{statistics.median(self.ttft[name]):.2f}s"
        return out


@dataclass
class _CaseInputs:
    """One case's assembled prompts, shared by every arm."""

    case: Case
    prompt: Any
    capture: Any = None
    candidates: list[str] | None = None
    evidence_prompt: Any = None


def unfit_cases(backend: Backend, cases: list[Case], cfg: RunConfig) -> dict[str, int]:
    """Case id -> prompt tokens of each case that cannot run on the model: even with one document
    its prompt (or its leak-capture prompt) is over ``backend.max_prompt_tokens``. Tokenization
    only: found before the first case runs, not when the run reaches the case."""
    segments, limit = cfg.dataset.segments, backend.max_prompt_tokens
    out: dict[str, int] = {}
    for case in cases:
        need = shortest_prompt_tokens(case, segments, backend.tok)
        if case.canary:
            capture = case.canary.get("capture_prefix", "")
            need = max(need, shortest_prompt_tokens(case, segments, backend.tok, prefix=capture))
        if need > limit:
            out[case.id] = need
    return out


def check_cases_fit(backend: Backend, cases: list[Case], cfg: RunConfig) -> dict[str, int]:
    """The unfit cases (:func:`unfit_cases`) when ``cfg.skip_unfit``; otherwise any refuses the run
    with a :class:`KvauditError` naming the dataset's cases file and the cases."""
    unfit = unfit_cases(backend, cases, cfg)
    if unfit and not cfg.skip_unfit:
        shown = ", ".join(f"{cid!r} ({n} tokens)" for cid, n in list(unfit.items())[:5])
        more = f" and {len(unfit) - 5} more" if len(unfit) > 5 else ""
        where = Path(cfg.dataset.path or ".") / CASES_FILE
        raise KvauditError(f"{where}: {len(unfit)} case(s) cannot fit the model's prompt limit of "
                           f"{backend.max_prompt_tokens} tokens even with one document: {shown}{more}; nothing "
                           "was run. Shorten them, or pass --skip-unfit-cases to leave them out (the "
                           "manifest records them and the gate counts them missing)")
    return unfit


def _case_inputs(backend: Backend, case: Case, cfg: RunConfig) -> _CaseInputs:
    segments = cfg.dataset.segments
    prompt = assemble(case, segments, backend.tok, backend.max_prompt_tokens)
    inputs = _CaseInputs(case=case, prompt=prompt)
    if case.canary:
        inputs.capture = assemble(case, segments, backend.tok, backend.max_prompt_tokens,
                                  prefix=case.canary.get("capture_prefix", ""))
        inputs.candidates = [case.canary["value"], *case.canary.get("decoys", [])]
    # The oracle pair's prompt: only the kept evidence segments (none: the pair does not run).
    kept_evidence = evidence_only(prompt.segment_ids, case.evidence, bool(case.canary))
    if kept_evidence:
        inputs.evidence_prompt = assemble(replace(case, segment_ids=kept_evidence), segments, backend.tok,
                                          backend.max_prompt_tokens)
    return inputs


def _arm_request(spec: ArmSpec, inputs: _CaseInputs) -> ArmRequest | None:
    """What one arm runs on for one case; None where the arm does not apply to the case."""
    if spec.leak_only and not inputs.case.canary:
        return None
    prompt = inputs.prompt
    if spec.prompt == "evidence":
        if inputs.evidence_prompt is None:
            return None
        prompt = inputs.evidence_prompt
    return ArmRequest(prompt=prompt, capture_prompt=inputs.capture,
                      candidates=inputs.candidates if spec.scores_candidates else None)


def run_cases(backend: Backend, cases: list[Case], cfg: RunConfig, timing: dict[str, float]) -> list[PairRecord]:
    """Cases under every arm, arm by arm: each arm runs for all of ``cases`` together
    (:func:`~kvaudit.runners.backend.run_arms`: one batch on an engine that batches), so every arm
    of a case meets the same batch conditions. A repair arm's own account goes into its
    ``ArmResult.repair``."""
    inputs = [_case_inputs(backend, c, cfg) for c in cases]
    arms: list[dict[str, Any]] = [{} for _ in cases]
    first_logits: list[dict[str, Any]] = [{} for _ in cases]
    details: list[dict[str, dict[str, Any]]] = [{} for _ in cases]
    for name in _arm_order(cfg.arms, len(cases)):
        spec = get_arm(name)
        todo = [(i, r) for i, r in ((i, _arm_request(spec, x)) for i, x in enumerate(inputs)) if r is not None]
        if not todo:
            continue
        t0 = time.perf_counter()
        outs = backend.run_arms(spec, [r for _, r in todo])
        wall = time.perf_counter() - t0
        if spec.source == "neutral":
            built = sum(o.build_s for o in outs)
            timing["caching"] += built
            wall -= built
        timing[name if name in TIMED_ARMS else "repairs" if spec.repair else "controls"] += wall
        for (i, _), out in zip(todo, outs):
            out.result.head_s = round(out.head_s, 6)
            out.result.engine_ttft_s = out.engine_ttft_s
            arms[i][name] = out.result
            first_logits[i][name] = out.first_logits
            if out.detail is not None:
                details[i][name] = dict(out.detail)
    return [_pair_record(backend, x, a, fl, d) for x, a, fl, d in zip(inputs, arms, first_logits, details)]


def _arm_order(arms: list[str], n_cases: int) -> list[str]:
    """The order the arms run in: as given, except that in a group of several cases an arm that
    resets the engine's cache goes last (its reset would otherwise wipe, for the group's other
    cases, what a later arm such as the warm prefix cache relies on)."""
    if n_cases == 1:
        return list(arms)
    return [a for a in arms if not get_arm(a).resets_engine_cache] + [a for a in arms if get_arm(a).resets_engine_cache]


def _pair_record(backend: Backend, inputs: _CaseInputs, arms: dict[str, Any], first_logits: dict[str, Any],
                 details: dict[str, dict[str, Any]]) -> PairRecord:
    # Every arm against its reference's logits (the reference arm, or the oracle's own
    # recompute), whatever order the arms ran in.
    for name, result in arms.items():
        ref = get_arm(name).compared_with
        if name != REFERENCE_ARM:
            result.logit_diff_vs_recompute = logit_diff(first_logits[name], first_logits[ref])
    for name, d in details.items():
        if UNDER_TEST_ARM in first_logits:
            d["logit_diff_vs_reuse"] = logit_diff(first_logits[name], first_logits[UNDER_TEST_ARM])
        arms[name].repair = d
    case, prompt = inputs.case, inputs.prompt
    return PairRecord(
        case_id=case.id,
        task=case.task,
        strata=dict(case.strata),
        n_prompt_tokens=len(prompt.ids),
        ids_hash=prompt.ids_hash,
        segment_ids=prompt.segment_ids,
        segment_hashes=prompt.segment_hashes,
        segment_spans=[tuple(s) for s in prompt.spans],
        truncation=prompt.truncation,
        decoding=backend.decoding.as_dict(),
        arm_order=list(arms),
        arms=arms,
        answers=list(case.answers),
        metric=case.metric,
        evidence=list(case.evidence),
        canary=case.canary,
    )


def execute(cfg: RunConfig, backend: Backend, *, progress: bool = True) -> Manifest:
    """Run (or resume) ``cfg`` on ``backend``, holding the run directory's writer lock; returns the
    final manifest."""
    out = cfg.out
    check_arms_run_on(cfg.arms, backend.name)
    backend.check_arms(list(cfg.arms))  # what this engine's configuration cannot run, refused now
    if REFERENCE_ARM not in cfg.arms:
        raise KvauditError(f"the arms must include the reference arm {REFERENCE_ARM!r}: every other arm "
                           "is compared with it")
    with RunDir(out).lock("run", create=True):
        return _execute_locked(cfg, backend, progress=progress)


def _session_manifest(cfg: RunConfig, backend: Backend, identity: RunIdentity, old: Manifest | None, n_cases: int,
                      unfit: dict[str, Any]) -> Manifest:
    """The manifest this session writes first: the run's identity and configuration, the backend's
    own ``info()``, the dataset (unfit cases counted: the run is partial without them), earlier sessions."""
    import torch

    info = backend.info()
    manifest = Manifest(
        kvaudit_version=__import__("kvaudit").__version__,
        identity=identity,
        backend=info,
        model=ModelInfo(name=cfg.model_name, fingerprint=backend.fingerprint, dtype=info["dtype"]),
        threads=torch.get_num_threads(),
        decoding=backend.decoding.as_dict(),
        arms=list(cfg.arms),
        arm_reasons={a: backend.arm_reason(get_arm(a)) for a in cfg.arms},
        dataset=DatasetRef(
            path=str(cfg.dataset.path),
            hash=cfg.dataset.card.content_hash,
            generator=cfg.dataset.card.generator,
            n_cases=n_cases,
            coverage=cfg.dataset.card.coverage,
            extra={"unfit_cases": unfit} if unfit else {},
        ),
        warmup_prefix=WarmupPrefix(system="neutral", ids_hash=backend.neutral_hash),
        cache_budget_bytes=backend.cache.capacity_bytes,
        git_revision=git_revision(),
        sessions=list(old.sessions) if old else [],
        extra=dict(cfg.extra_manifest),
    )
    change = backend.serving_change()
    manifest.serving_change = ServingChange(**change) if change else None
    return manifest


def _execute_locked(cfg: RunConfig, backend: Backend, *, progress: bool) -> Manifest:
    from tqdm import tqdm

    out = cfg.out
    run = RunDir(out)
    identity = run_identity(cfg, backend)
    old = check_resumable(out, identity.values())
    done = run.finished()
    cases = cfg.dataset.cases[: cfg.limit] if cfg.limit else cfg.dataset.cases
    todo = [c for c in cases if c.id not in done]
    unfit = check_cases_fit(backend, todo, cfg)  # before the manifest or the pairs are touched
    if unfit:
        todo = [c for c in todo if c.id not in unfit]
        print(f"kvaudit: leaving out {len(unfit)} case(s) that cannot fit the model: "
              f"{', '.join(excerpt(c) for c in list(unfit)[:10])}{' ...' if len(unfit) > 10 else ''}",
              file=sys.stderr)
    if todo:  # new pairs make any earlier audit stale: remove it rather than leave it lying
        run.forget_audit()
    # This session rewrites the manifest: an earlier attestation no longer holds (a new one is
    # written when the session ends, if the key is set).
    run.forget_attestation()
    manifest = _session_manifest(cfg, backend, identity, old, len(cases), unfit)
    session = Session(started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), cases_before=len(done))
    manifest.sessions.append(session)
    manifest.status = "running"
    run.write_manifest(manifest)

    timing: dict[str, float] = defaultdict(float)
    per_batch = backend.concurrent_cases
    prog = Progress()
    t_start = time.perf_counter()
    bar = tqdm(total=len(cases), initial=len(cases) - len(todo), unit="case", disable=not progress,
               dynamic_ncols=True)
    with run.appending() as pairs:
        for k in range(0, len(todo), per_batch):
            for rec in run_cases(backend, todo[k: k + per_batch], cfg, timing):
                if per_batch > 1:  # cases that ran together: their timings are one batch's
                    rec.batch = f"{len(manifest.sessions) - 1}.{k // per_batch}"
                pairs.append(rec)
                prog.add(rec)
                bar.update(1)
            pairs.flush()
            bar.set_postfix(prog.postfix(), refresh=False)
    bar.close()
    stats = backend.cache.stats
    session.finished = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    session.cases_run = len(todo)
    session.wall_s = time.perf_counter() - t_start
    session.timing_s = {k: round(v, 4) for k, v in sorted(timing.items())}
    session.segment_cache = asdict(stats)
    session.unique_segments_seen = len({sid for c in todo for sid in c.segment_ids})
    manifest.backend = backend.info()  # what the engine showed it can do during the run (HTTP servers)
    change = backend.serving_change()  # each engine as it ran (a server's report included)
    manifest.serving_change = ServingChange(**change) if change else None
    manifest.timing_s = _sum_timings(manifest.sessions)
    manifest.status = "complete" if len(done) + pairs.written >= len(cases) else "partial"
    run.write_manifest(manifest)
    key = attestation_key()
    if key is not None:
        attest(out, key, {"tool": "kvaudit run", "kvaudit_version": manifest.kvaudit_version,
                          "git_revision": manifest.git_revision})
    return manifest


def _sum_timings(sessions: list[Session]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for s in sessions:
        for k, v in (s.timing_s or {}).items():
            total[k] += v
        total["wall"] += s.wall_s or 0.0
    return {k: round(v, 4) for k, v in sorted(total.items())}
