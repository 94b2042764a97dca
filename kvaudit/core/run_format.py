"""The run format: the files of a run directory, by name, and the pair records of ``pairs.jsonl``.

A *run directory* (written by ``kvaudit run``) holds ``manifest.json`` (the typed
:class:`~kvaudit.core.manifest.Manifest`; its ``identity`` object, :data:`MANIFEST_IDENTITY`,
holds the fields two runs must share to be compared) and ``pairs.jsonl`` (one :class:`PairRecord`
per case, holding every arm's :class:`ArmResult`; :func:`read_pairs` is its one reader).
``audit.json`` (:mod:`kvaudit.core.audit_format`), ``summary.json`` and ``report.html`` are added by
the audit and report stages, ``attestation.json`` by a run signed with a key. Every reader and
writer of these files is reached through :class:`kvaudit.core.run_dir.RunDir`.

Bad input raises :class:`~kvaudit.core.errors.DatasetError`, whose message names the file, line
and field.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError, excerpt
from kvaudit.core.jsonio import iter_jsonl, mend_jsonl_tail
from kvaudit.core.typed_json import check_fields

MANIFEST_FILE = "manifest.json"
PAIRS_FILE = "pairs.jsonl"
AUDIT_FILE = "audit.json"
MANIFEST_IDENTITY = "identity"  # the manifest's object of what makes a run's configuration one
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.html"
ATTESTATION_FILE = "attestation.json"
SAMPLES_FILE = "samples.jsonl"  # the report's per-case table (kvaudit report)
SIMULATION_FILE = "simulation.json"  # the cache simulator's results, where `kvaudit simulate --out RUN` put them
# A replay directory (`kvaudit replay`, kvaudit.core.replay_format): its configuration, one record
# per served request (appended, resumable like pairs.jsonl) and the replay's summary.
REPLAY_CONFIG_FILE = "replay_config.json"
REPLAY_REQUESTS_FILE = "requests.jsonl"
REPLAY_FILE = "replay.json"
REPLAYS_JSON, REPLAYS_HTML = "replays.json", "replays.html"  # kvaudit compare / report on replays
SWEEP_FILE = "sweep.json"  # kvaudit replay --rate R1,R2,...: one replay per load in rate-R/, this lists them
LOCK_FILE = ".kvaudit.lock"
# Files a command writes in a run directory: each must be a regular file of the directory (a
# symbolic link would make an append land outside it).
WRITTEN_FILES = (MANIFEST_FILE, PAIRS_FILE, AUDIT_FILE, SUMMARY_FILE, REPORT_FILE, SAMPLES_FILE, ATTESTATION_FILE,
                 SIMULATION_FILE, REPLAY_CONFIG_FILE, REPLAY_REQUESTS_FILE, REPLAY_FILE, REPLAYS_JSON, REPLAYS_HTML, SWEEP_FILE)


@dataclass
class ArmResult:
    """What one arm produced for one case.

    ``ids_hash``, ``segment_hashes``, ``truncation`` and ``decoding`` are copied from the
    prompt the arm actually consumed, so the audit can prove every arm saw the same input.
    ``logit_diff_vs_recompute`` is the max abs difference of the first-token logits against
    the case's ``recompute`` arm (filled in by the runner; ``None`` for recompute itself).
    ``segment_kv_fingerprints`` maps segment id to a hash of the KV bytes the arm loaded.
    ``cache_hit_tokens`` counts reused tokens whose KV was already in the shared segment cache
    before this case (the simulator's hit definition); ``tokens_reused`` also counts segments
    warmed up for this case.
    ``canary_logprobs`` (leak probes only) maps candidate name to its teacher-forced
    log-probability as the answer.
    """

    arm: str
    answer: str
    answer_ids: list[int]
    top_k: list[tuple[int, float]]
    margin: float
    ttft_s: float
    tokens_reused: int
    tokens_computed: int
    ids_hash: str
    segment_hashes: list[str]
    truncation: dict[str, Any]
    decoding: dict[str, Any]
    decode_s: float = 0.0
    # Tokens decoded after the first, as the engine counted them (None: not recorded; the answer's
    # own length less one is then the count). ``decode_s / decode_tokens`` is the time per output token.
    decode_tokens: int | None = None
    cache_hit_tokens: int = 0
    logit_diff_vs_recompute: float | None = None
    segment_kv_fingerprints: dict[str, str] = field(default_factory=dict)
    canary_logprobs: dict[str, float] | None = None
    # What a serving engine reported about this arm's request(s) (HTTP backends): the prompt ids
    # it says it consumed (``prompt_ids_hash``), the cached prompt tokens it reported
    # (``cached_tokens``; None when it reports none), the model it names (``model``), and the
    # tokens the warm-up or tenant requests of this arm found cached (``warmup_cached_tokens``).
    # ``None`` for in-process backends, whose evidence the runner holds directly.
    engine: dict[str, Any] | None = None
    # Inside ``ttft_s``: the head's own prefill request, sent first where the engine's connector
    # loads only a prompt prefix (vLLM; 0 where none went), and the engine's own first-token time
    # for the arm's main request where it keeps one (``None`` otherwise). ``ttft_s - head_s -
    # engine_ttft_s`` is what kvaudit's client adds.
    head_s: float = 0.0
    engine_ttft_s: float | None = None
    # A repair arm's own account (blend@R, epic@K): recomputed prompt positions, their count and
    # share of the segment tokens, the selection and recomputation seconds (inside TTFT) and the
    # first-token difference against the arm under test (:mod:`kvaudit.core.repair_log`).
    repair: dict[str, Any] | None = None


@dataclass
class PairRecord:
    """One case under every arm (one line of ``pairs.jsonl``)."""

    case_id: str
    task: str
    strata: dict[str, Any]
    n_prompt_tokens: int
    ids_hash: str
    segment_ids: list[str]
    segment_hashes: list[str]
    segment_spans: list[tuple[int, int]]
    truncation: dict[str, Any]
    decoding: dict[str, Any]
    arm_order: list[str]
    arms: dict[str, ArmResult]
    answers: list[str] = field(default_factory=list)
    metric: str = "em"
    evidence: list[str] = field(default_factory=list)
    canary: dict[str, Any] | None = None
    # the cases each arm ran together (--concurrent-cases above 1: "session.batch"); None alone.
    # Their timings share the batch's conditions: speed is judged per batch (kvaudit.stats.speed)
    batch: str | None = None


def case_batches(batches: list[str | None], concurrent_cases: int) -> tuple[list[str] | None, str | None]:
    """How a run's cases group for their timings, from each case's ``PairRecord.batch`` and how many
    ran at a time (the manifest's ``backend.batching``): ``(labels, None)`` where batches are recorded
    (a case without one in a run of one case at a time is a batch of its own), ``(None, None)`` for
    cases run one at a time, ``(None, why)`` where cases ran together but which did is not recorded
    (their timings are not independent, and no grouping is known)."""
    if concurrent_cases > 1 and None in batches:
        return None, (f"the cases ran {concurrent_cases} at a time and which ran together is not recorded (a run "
                      "made before kvaudit recorded batches, or an edited record)")
    if any(k is not None for k in batches):
        return [k if k is not None else f"alone.{i}" for i, k in enumerate(batches)], None
    return None, None


def flipped(arm: ArmResult, reference: ArmResult) -> bool:
    """The one definition of a *flip*, used by the runner, audit and report: the arm's answer
    text differs from the reference's, byte for byte (greedy decoding from the same ids must
    reproduce the same text; trailing whitespace is a different token too)."""
    return arm.answer != reference.answer


def documents(pair: PairRecord) -> tuple[str, ...]:
    """The documents a case rests on, for clustering: its evidence segment ids, sorted (all its
    segment ids when it names no evidence; its own id when it has no segment at all).

    Cases that share a document are correlated (a document the model reads badly hurts every
    question about it); a case on {A, B} shares with the cases on A and with those on B, so the
    statistics treat membership as a set, not as one label (see
    :mod:`kvaudit.stats.noninferiority`). Segment ids are content hashes: one document, one id.
    """
    return tuple(sorted(set(pair.evidence or pair.segment_ids))) or (pair.case_id,)


def cluster_key(pair: PairRecord) -> str:
    """:func:`documents` joined with ``|`` (one string per case, for tables)."""
    return "|".join(documents(pair))


def pair_to_dict(rec: PairRecord) -> dict[str, Any]:
    return asdict(rec)


def pair_from_dict(d: dict[str, Any]) -> PairRecord:
    d = dict(d)
    d["arms"] = {k: ArmResult(**v) for k, v in d["arms"].items()}
    return PairRecord(**d)


# The one reader of pairs.jsonl (the audit, the report and a resumed run all read through it):
# every field is type-checked against the dataclasses above (their annotations are the one
# declaration of the types), so a malformed record is a DatasetError naming the file, line and
# field, never a KeyError or a wrong number further on.
def validate_pair(obj: dict, where: str) -> None:
    """Type-check one raw ``pairs.jsonl`` object; ``where`` (file and line) starts every message."""
    check_fields(obj, PairRecord, where)
    for name, arm in obj["arms"].items():
        check_fields(arm, ArmResult, f"{where}, arm '{excerpt(name, 40)}'")


def read_pairs(run_dir: str | os.PathLike) -> list[PairRecord]:
    """Read and validate ``pairs.jsonl`` of a run (a torn last line from a killed run is skipped).

    Every field a reader relies on is type-checked (:func:`validate_pair`); a malformed record
    raises :class:`DatasetError` naming the file, line and field. An empty file gives ``[]``:
    whether that is an error is the caller's to say.
    """
    path = Path(run_dir) / PAIRS_FILE
    out = []
    for n, obj in iter_jsonl(path, tolerate_torn_tail=True):
        where = f"{path}, line {n}"
        validate_pair(obj, where)
        try:
            out.append(pair_from_dict(obj))
        except TypeError as e:
            raise DatasetError(f"{where}: malformed pair record ({excerpt(str(e), 160)})") from None
    return out


def mend_pairs_tail(run_dir: str | os.PathLike) -> None:
    """Make ``pairs.jsonl`` end at a record boundary before records are appended to it
    (:func:`kvaudit.core.jsonio.mend_jsonl_tail`)."""
    mend_jsonl_tail(Path(run_dir) / PAIRS_FILE)
