"""A replay's summary (``replay.json``) as its readers use it: the fields the replay page, the load
sweep's table and the GPU scripts read, declared once as records, and :func:`check_summary`, which
reads a parsed summary against them and refuses what they could not use, naming the file and field.

kvaudit writes the summary itself (:mod:`kvaudit.replay.summary`), but it is a file on disk that a
reviewer may have edited, copied between versions or cut short: every field read here is checked
for its type, every number for being finite (JSON holds ``NaN`` and ``1e400``), counts and times
for not being negative, rates for lying in [0, 1], and the configuration as ``replay_config.json``
is (:func:`kvaudit.core.replay_format.check_config`, called by the reader of the directory,
:meth:`~kvaudit.core.replay_format.ReplayDir.read_summary`). Fields not declared here are kept
and not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvaudit.core.errors import DatasetError, excerpt
from kvaudit.core.typed_json import record_from_json


@dataclass
class Interval:
    """A percentile and its interval's ends (``None``: the sample cannot bound that end)."""

    value: float
    low: float | None
    high: float | None


@dataclass
class TtftPercentiles:
    p50: Interval
    p95: Interval
    p99: Interval


@dataclass
class HitRateValue:
    token_hit_rate: float | None
    hit_tokens: int
    prompt_tokens: int
    requests: int


@dataclass
class Window:
    start: int
    end: int
    token_hit_rate: float | None


@dataclass
class HitRates:
    measured: HitRateValue
    simulated: HitRateValue
    over_time: list[Window]
    simulated_over_time: list[Window]
    gap_points: float
    simulator_agrees: bool
    simulated_engine_order: HitRateValue | None = None
    gap_points_engine_order: float | None = None
    overflow_tokens: int = 0


@dataclass
class Throughput:
    busy_s: float
    requests_per_s: float | None
    prompt_tokens_per_s: float | None


@dataclass
class LengthBin:
    tokens_low: int
    tokens_high: int
    requests: int
    ttft_p50_s: float


@dataclass
class Growth:
    """TTFT's growth over an open loop's arrivals (:mod:`kvaudit.stats.saturation`)."""

    requests: int
    slope: float
    past_saturation: bool


@dataclass
class Spread:
    p50: float
    p95: float


@dataclass
class ClientOverhead:
    requests: int
    p50: float
    p95: float
    before_engine: Spread | None = None
    after_engine: Spread | None = None


@dataclass
class Preemptions:
    requests: int  # requests preempted (their own or a warm-up they started), of those recorded
    total: int
    recorded: int


@dataclass
class ReplaySummary:
    config: dict[str, Any]  # a replay's configuration less n_requests: checked as ReplayConfig
    requests: int
    sessions: int
    ttft_s: TtftPercentiles
    warmup_s_total: float
    ttft_by_length: list[LengthBin]
    hit_rate: HitRates
    throughput: Throughput
    evictions: float
    ttft_intervals_claimed: bool = True
    client_overhead_s: ClientOverhead | None = None
    ttft_growth: Growth | None = None
    preemptions: Preemptions | None = None


# numbers that may be negative: differences (measured - simulated, client - engine) and slopes
_SIGNED = ("gap_points", "gap_points_engine_order", "slope", "client_overhead_s")
_RATES = ("token_hit_rate",)
MAX_NUMBER = 1e15  # beyond any count, byte size or time a replay records; keeps arithmetic on them finite


def _numbers(obj: Any, path: str) -> list[tuple[str, Any]]:
    """Every number in ``obj`` with its field path in JSON's words (``hit_rate.over_time[2].end``)."""
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int | float):
        return [(path, obj)]
    if isinstance(obj, dict):
        return [x for k, v in obj.items() for x in _numbers(v, f"{path}.{k}" if path else str(k))]
    if isinstance(obj, list):
        return [x for i, v in enumerate(obj) for x in _numbers(v, f"{path}[{i}]")]
    return []


def check_summary(obj: Any, where: str) -> dict[str, Any]:
    """``obj`` (a parsed ``replay.json``) when every field its readers use fits; else a
    :class:`DatasetError` starting with ``where`` and naming the field."""
    record_from_json(obj, ReplaySummary, where)
    read = {k: obj[k] for k in ReplaySummary.__dataclass_fields__ if k in obj and k != "config"}
    for path, v in _numbers(read, ""):
        field = f"field '{excerpt(path, 80)}'"
        if not (isinstance(v, int) and v.bit_length() < 60 or isinstance(v, float) and abs(v) <= MAX_NUMBER):
            raise DatasetError(f"{where}: {field} must be a finite number of at most {MAX_NUMBER:g}, "
                               f"got {excerpt(str(v), 40)}")
        if v < 0 and not path.startswith(_SIGNED) and path.rsplit(".", 1)[-1] not in _SIGNED:
            raise DatasetError(f"{where}: {field} must not be negative, got {v:g}")
        if path.rsplit(".", 1)[-1] in _RATES and v > 1:
            raise DatasetError(f"{where}: {field} must be a rate from 0 to 1, got {v:g}")
    for name in ("requests", "sessions"):
        if obj[name] < 1:
            raise DatasetError(f"{where}: field '{name}' must be at least 1, got {obj[name]}")
    return obj
