"""The replay directory (``kvaudit replay``): its configuration, one record per served request, and
:class:`ReplayDir`, the one reader and writer of its files.

A replay directory holds ``replay_config.json`` (:class:`ReplayConfig`: what a resumed replay must
share with the one it resumes), ``requests.jsonl`` (one :class:`RequestRecord` per served request,
appended a wave at a time and fsynced, so a killed replay resumes without losing or repeating a
request) and ``replay.json`` (the summary: percentiles, hit rates, throughput and the simulator's
prediction, :mod:`kvaudit.replay.summary`). The file names live in :mod:`kvaudit.core.run_format`
with every other run file's. One process writes a replay directory at a time (the run lock).
"""

from __future__ import annotations

import gzip
import math
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError, KvauditError, excerpt
from kvaudit.core.jsonio import (
    iter_jsonl,
    read_bytes,
    read_json,
    write_json,
)
from kvaudit.core.replay_summary_format import check_summary
from kvaudit.core.run_format import REPLAY_CONFIG_FILE, REPLAY_FILE, REPLAY_REQUESTS_FILE
from kvaudit.core.trace import KINDS, MAX_PIECE_TOKENS
from kvaudit.core.typed_json import check_fields, record_from_json
from kvaudit.core.vocabulary import EngineRole, ReplayPolicy, Schedule, words
from kvaudit.core.work_dir import WorkDir

REPLAY_FORMAT = 1
POLICIES = words(ReplayPolicy)  # what a replay's --cache-policy may be


@dataclass
class ReplayConfig:
    """What a replay is: the same workload file, policy, budget, model and serving shape, or a
    resumed replay is refused."""

    workload: str
    workload_hash: str
    policy: ReplayPolicy
    budget_bytes: int
    model: str
    backend: str
    concurrency: int
    max_new_tokens: int
    n_requests: int
    arrivals: str = "closed"  # closed | timestamps | poisson:RATE:SEED
    # waves: requests go in waves, a wave one engine batch (arrivals during a wave wait for the
    # next); arrivals: each request joins the running batch at its arrival (in-process vLLM)
    schedule: Schedule = "waves"
    # the in-process vLLM engine's KV space for requests in flight where the user gave it
    # (--kv-space); None: sized so that none waits for space
    kv_space_bytes: int | None = None
    # a serving change under load (--engines FILE --engine ROLE): the table replayed on, the change
    # in words (the candidate's), and a digest of the table (a resume on an edited table is refused)
    engine_role: EngineRole | None = None
    engine_change: str | None = None
    engine_sha256: str | None = None
    format_version: int = REPLAY_FORMAT

    def identity(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("workload")  # the file may move; its hash is what must not change
        d.pop("n_requests")  # a replay of the first N (--limit) may be extended by a later session
        return d


@dataclass
class RequestRecord:
    """One served request (one line of ``requests.jsonl``).

    ``ttft_s`` is the time to first token as the request's client saw it, including everything
    kvaudit did on the request path for it: neutral warm-ups of missed documents (``warmup_s``,
    segment policy), the head's own prefill (``head_s``) and queueing behind the other requests of
    its wave (``queue_s``: submitted together, served by one engine; under arrivals, its wait from
    arrival until it was admitted, a slot free among the engine's running requests). ``prefix_cache_tokens`` are
    prompt tokens the engine's own prefix cache served; ``segment_hit_tokens`` those the segment
    store served that were already held before this request (the simulator's hit definition:
    a document warmed up for this request is a miss, ``warmup_tokens``); ``tokens_computed`` the
    prompt tokens prefilled for the request itself; ``evictions`` the store entries evicted while
    serving it (its wave's, shared evenly)."""

    index: int
    request_id: str
    wave: int
    session: int  # 0 for the first `kvaudit replay` of this directory, 1 for its first resume...
    n_prompt_tokens: int
    head_tokens: int
    segment_tokens: int
    ttft_s: float
    warmup_s: float
    head_s: float
    queue_s: float
    prefix_cache_tokens: int
    segment_hit_tokens: int
    warmup_tokens: int
    tokens_computed: int
    evictions: float
    wall_s: float  # the wave's wall time (first submission to last first token), for throughput
    ids_hash: str
    piece_ids: list[str] = field(default_factory=list)  # head, documents, question: for the simulator
    piece_tokens: list[int] = field(default_factory=list)
    piece_kinds: list[str] = field(default_factory=list)
    truncated: bool = False
    # the engine's own first-token latency for the request's main prefill (vLLM's request stats),
    # and the client's time to first token for that same request: their difference is kvaudit's overhead
    engine_ttft_s: float | None = None
    client_request_ttft_s: float | None = None
    # schedule "arrivals", vLLM: that difference split on vLLM's wall clock, before vLLM stamped the
    # request's arrival and after it stamped the first token (its output processing inside a step)
    client_before_engine_s: float | None = None
    client_after_engine_s: float | None = None
    arrival_s: float | None = None  # open loop: the request's arrival, seconds from its session's start
    # schedule "arrivals": head and document tokens the store could not hold while other requests
    # were in flight, prefilled by the request itself (misses); when it finished (seconds from its
    # session's start); its decoded tokens after the first and their time
    overflow_tokens: int = 0
    finish_s: float | None = None
    decode_tokens: int | None = None
    decode_s: float | None = None
    # schedule "arrivals", segment: per prompt piece, when the store took or refused this
    # request's warm-up of it (seconds from its session's start; null for a piece it did not warm up)
    piece_warmed_s: list[float | None] | None = None
    # schedule "arrivals", vLLM: when the engine step that first scheduled the request's own prefill
    # began (its load from the store ran in it; seconds from its session's start)
    loaded_s: float | None = None
    # schedule "arrivals", vLLM with request stats: times the engine preempted the request or the
    # warm-ups it started (its KV space ran out mid-batch). A replay sizes that space so that
    # nothing should be preempted, unless --kv-space gives the user's: a count above 0 then says
    # what that space costs, and otherwise that the engine was not the one intended
    preemptions: int | None = None


_COUNTS = ("n_prompt_tokens", "head_tokens", "segment_tokens", "prefix_cache_tokens", "segment_hit_tokens",
           "warmup_tokens", "tokens_computed", "overflow_tokens", "preemptions")  # preemptions: null where unknown


def read_request_records(path: Path) -> list[RequestRecord]:
    """The request records of a ``requests.jsonl``, or of a gzipped copy (``.gz``: the results
    folders keep them so), each validated; a torn last line from a killed replay is skipped."""
    data = read_bytes(path)
    if path.suffix == ".gz":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise DatasetError(f"{path}: not a readable gzip file ({e})") from None
    out: list[RequestRecord] = []
    for n, obj in iter_jsonl(path, tolerate_torn_tail=True, data=data):
        where = f"{path}, line {n}"
        check_fields(obj, RequestRecord, where)
        rec = RequestRecord(**{k: obj[k] for k in RequestRecord.__dataclass_fields__ if k in obj})
        _check_record(rec, where)
        out.append(rec)
    return out


def _check_record(r: RequestRecord, where: str) -> None:
    """What the summary and the simulator rely on beyond the field types: counts that are counts,
    hits within the prompt, and one kind and one token count per prompt piece."""
    for name in _COUNTS:
        value = getattr(r, name)
        if value is not None and value < 0:
            raise DatasetError(f"{where}: field '{name}' must not be negative, got {value}")
    if r.n_prompt_tokens < 1:
        raise DatasetError(f"{where}: field 'n_prompt_tokens' must be at least 1")
    if r.prefix_cache_tokens + r.segment_hit_tokens > r.n_prompt_tokens:
        raise DatasetError(f"{where}: fields 'prefix_cache_tokens' + 'segment_hit_tokens' exceed 'n_prompt_tokens'")
    if r.piece_warmed_s is not None and len(r.piece_warmed_s) != len(r.piece_ids):
        raise DatasetError(f"{where}: field 'piece_warmed_s' must have one entry per prompt piece "
                           f"(got {len(r.piece_warmed_s)} for {len(r.piece_ids)} pieces)")
    if not len(r.piece_ids) == len(r.piece_tokens) == len(r.piece_kinds):
        raise DatasetError(f"{where}: fields 'piece_ids', 'piece_tokens' and 'piece_kinds' must have one entry per "
                           f"prompt piece (got {len(r.piece_ids)}, {len(r.piece_tokens)}, {len(r.piece_kinds)})")
    for i, (k, t) in enumerate(zip(r.piece_kinds, r.piece_tokens)):
        if k not in KINDS:
            raise DatasetError(f"{where}: field 'piece_kinds[{i}]' must be one of {', '.join(KINDS)}, "
                               f"got {excerpt(repr(k), 40)}")
        if not 0 < t <= MAX_PIECE_TOKENS:
            raise DatasetError(f"{where}: field 'piece_tokens[{i}]' must be a positive count of at most "
                               f"{MAX_PIECE_TOKENS}, got {t}")


def poisson_spec(rate: float, seed: int) -> str:
    """The arrivals spec of Poisson arrivals at ``rate`` per second seeded by ``seed`` (what
    :func:`arrival_rate` reads back)."""
    return f"poisson:{rate}:{seed}"


def arrival_rate(arrivals: str) -> float | None:
    """The offered load of a ``poisson:RATE:SEED`` arrivals spec (requests per second), or None
    for a closed loop or timestamps; ValueError for anything else."""
    if arrivals in ("closed", "timestamps"):
        return None
    kind, _, rest = arrivals.partition(":")
    rate, _, seed = rest.partition(":")
    value = float(rate) if kind == "poisson" and seed.lstrip("-").isdigit() and len(seed) < 20 else math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(arrivals)
    return value


def check_config(obj: dict[str, Any], where: str, prefix: str = "") -> ReplayConfig:
    """``obj`` read as a :class:`ReplayConfig`, or a :class:`DatasetError` naming ``where`` and the
    field (after ``prefix``) where it is not a replay configuration this kvaudit reads."""
    version = obj.get("format_version", REPLAY_FORMAT)
    if not isinstance(version, int) or isinstance(version, bool) or version > REPLAY_FORMAT:
        raise DatasetError(f"{where}: field '{prefix}format_version' is {excerpt(repr(version), 40)}: this kvaudit "
                           f"reads replay format {REPLAY_FORMAT}; upgrade kvaudit to read this replay")
    config = record_from_json(obj, ReplayConfig, where, prefix=prefix)  # the schedule among them: a Literal
    if config.kv_space_bytes is not None and config.kv_space_bytes < 1:
        raise DatasetError(f"{where}: field '{prefix}kv_space_bytes' must be a positive number of bytes or null, "
                           f"got {config.kv_space_bytes}")
    try:
        arrival_rate(config.arrivals)
    except ValueError:
        raise DatasetError(f"{where}: field '{prefix}arrivals' must be closed, timestamps or poisson:RATE:SEED "
                           f"(a positive rate, an integer seed), got {excerpt(repr(config.arrivals), 40)}") from None
    return config


class ReplayDir(WorkDir[RequestRecord]):
    """A replay directory at ``path`` (which need not exist yet); its journal is ``requests.jsonl``."""

    journal_name = REPLAY_REQUESTS_FILE

    @property
    def config_file(self) -> Path:
        return self.path / REPLAY_CONFIG_FILE

    @property
    def requests_file(self) -> Path:
        return self.journal_file

    @property
    def summary_file(self) -> Path:
        return self.path / REPLAY_FILE

    def is_replay(self) -> bool:
        return self.config_file.is_file()

    # ------------------------------------------------------------------ replay_config.json
    def read_config(self) -> ReplayConfig:
        obj = read_json(self.config_file)
        where = str(self.config_file)
        if not isinstance(obj, dict):
            raise DatasetError(f"{where}: expected a JSON object")
        return check_config(obj, where)

    def write_config(self, config: ReplayConfig) -> None:
        write_json(self.config_file, asdict(config))

    def check_resumable(self, config: ReplayConfig) -> None:
        """Refuse to append to a replay of something else (another workload, policy, budget...)."""
        if not self.config_file.exists():
            if self.requests_file.exists():
                raise KvauditError(f"{self.requests_file}: exists without {REPLAY_CONFIG_FILE}; "
                                   "use a new --out directory")
            return
        old = self.read_config().identity()
        new = config.identity()
        diff = [k for k in new if old.get(k) != new[k]]
        if diff:
            k = diff[0]
            raise KvauditError(f"{self.path} holds a replay with {k}={old.get(k)!r}, not {new[k]!r}; "
                               "use a new --out directory to replay something else")

    # ------------------------------------------------------------------ requests.jsonl
    def read_journal(self) -> list[RequestRecord]:
        return self.read_requests()

    def record_to_dict(self, record: RequestRecord) -> dict[str, Any]:
        return asdict(record)

    def read_requests(self) -> list[RequestRecord]:
        """Every request record, validated (a torn last line from a killed replay is skipped)."""
        return read_request_records(self.requests_file) if self.requests_file.exists() else []

    def finished(self) -> list[RequestRecord]:
        """The requests served so far (:meth:`finished_records`)."""
        return self.finished_records()

    # ------------------------------------------------------------------ replay.json
    def read_summary(self) -> dict[str, Any]:
        """The summary, its fields checked (:mod:`kvaudit.core.replay_summary_format`)."""
        where = str(self.summary_file)
        obj = check_summary(read_json(self.summary_file), where)
        check_config({**obj["config"], "n_requests": obj["requests"]}, where, prefix="config.")
        return obj

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.summary_file, summary)
