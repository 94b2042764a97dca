"""The dataset format: a directory of three files, its records and its one reader and writer.

A *dataset* is written by ``kvaudit.generators`` and read by everything else:

``segments.jsonl``  one :class:`Segment` per line: ``id`` (content hash of ``text``), ``text``,
                    ``source`` (source document id), ``tags`` (free-form dict).
``cases.jsonl``     one :class:`Case` per line (fields below).
``dataset.json``    the :class:`DatasetCard`: generator, seed, parameters, reuse-dynamics
                    coverage and a content hash of the two JSONL files.

Bad input raises :class:`~kvaudit.core.errors.DatasetError`, whose message names the file, line
and field.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError, excerpt
from kvaudit.core.jsonio import (
    iter_jsonl,
    read_bytes,
    read_json,
    sha256_hex,
    write_json,
    write_jsonl,
)
from kvaudit.core.typed_json import check_fields, record_from_json

SEGMENTS_FILE = "segments.jsonl"
CASES_FILE = "cases.jsonl"
CARD_FILE = "dataset.json"

DEFAULT_SYSTEM = "Answer using only the documents."

TASK_FAMILIES = (
    "single_doc",
    "multi_hop_bridge",
    "multi_hop_compare",
    "aggregate",
    "position_probe",
    "leak_probe",
    "needle",
    "agreement",
    "imported",
)
METRICS = ("em", "f1", "rouge_l", "contains", "agreement")


def segment_id(text: str) -> str:
    """Content address of a segment's text."""
    return "s" + sha256_hex(text)[:16]


@dataclass
class Segment:
    id: str
    text: str
    source: str = ""
    tags: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    """One prompt to run under every arm.

    The prompt is: chat template with ``system`` as the system message; in the user turn,
    ``prefix`` (dynamic metadata, history, ...), then the segments in order (each followed by
    the fixed delimiter), then ``Question: {question}``.

    ``canary`` is set on leak probes: ``{"value": name, "decoys": [...],
    "capture_prefix": "My name is {name}.\\n"}``; the capture prefix is what preceded the
    segments in the (unsafe) first user request they were cached from.
    """

    id: str
    task: str
    segment_ids: list[str]
    question: str
    answers: list[str]
    system: str = DEFAULT_SYSTEM
    prefix: str = ""
    metric: str = "em"
    evidence: list[str] = field(default_factory=list)
    strata: dict[str, Any] = field(default_factory=dict)
    canary: dict[str, Any] | None = None


@dataclass
class DatasetCard:
    generator: str
    seed: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    coverage: dict[str, Any] = field(default_factory=dict)
    content_hash: str = ""
    counts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Dataset:
    segments: dict[str, Segment]
    cases: list[Case]
    card: DatasetCard
    path: Path | None = None


def _check_strata(strata: Any, where: str) -> None:
    """Strata are a flat object: each key a stratum, each value a string, number or boolean (the
    report groups cases by ``str(value)``; a list or object there has no group)."""
    if not isinstance(strata, dict):
        raise DatasetError(f"{where}: field 'strata' must be an object of stratum values, "
                           f"got {type(strata).__name__}")
    for k, v in strata.items():
        if v is None or not isinstance(v, (str, int, float)):
            raise DatasetError(f"{where}: field 'strata.{excerpt(k, 40)}' must be a string, number or "
                               f"boolean, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise DatasetError(f"{where}: field 'strata.{excerpt(k, 40)}' must be a finite number")


_CANARY_FIELDS = {"value", "decoys", "capture_prefix"}


def _check_canary(c: Any, where: str) -> None:
    """A leak probe's canary: ``{"value": str, "decoys": [str, ...], "capture_prefix": str}``."""
    if not isinstance(c, dict) or not isinstance(c.get("value"), str) or not c["value"]:
        raise DatasetError(f"{where}: field 'canary' must be an object with a non-empty string 'value'")
    unknown = sorted(set(c) - _CANARY_FIELDS)
    if unknown:
        raise DatasetError(f"{where}: unknown field 'canary.{excerpt(unknown[0], 40)}'")
    decoys = c.get("decoys", [])
    if not isinstance(decoys, list) or not all(isinstance(d, str) and d for d in decoys):
        raise DatasetError(f"{where}: field 'canary.decoys' must be a list of non-empty strings")
    if not isinstance(c.get("capture_prefix", ""), str):
        raise DatasetError(f"{where}: field 'canary.capture_prefix' must be str")


def read_segments(path: Path, data: bytes | None = None) -> dict[str, Segment]:
    out: dict[str, Segment] = {}
    for n, obj in iter_jsonl(path, data=data):
        where = f"{path}, line {n}"
        check_fields(obj, Segment, where, closed=True)
        if obj["id"] in out:
            raise DatasetError(f"{where}: field 'id': duplicate segment id {excerpt(obj['id'])!r}")
        if not obj["text"]:
            raise DatasetError(f"{where}: field 'text' is empty")
        out[obj["id"]] = Segment(**obj)
    return out


def read_cases(path: Path, segments: dict[str, Segment], data: bytes | None = None) -> list[Case]:
    out: list[Case] = []
    seen: set[str] = set()
    for n, obj in iter_jsonl(path, data=data):
        where = f"{path}, line {n}"
        check_fields(obj, Case, where, closed=True)
        if obj["id"] in seen:
            raise DatasetError(f"{where}: field 'id': duplicate case id {excerpt(obj['id'])!r}")
        seen.add(obj["id"])
        if not obj["segment_ids"]:
            raise DatasetError(f"{where}: field 'segment_ids' is empty")
        for sid in obj["segment_ids"] + obj.get("evidence", []):
            if sid not in segments:
                raise DatasetError(f"{where}: field 'segment_ids' names unknown segment {excerpt(sid)!r}")
        outside = [e for e in obj.get("evidence", []) if e not in obj["segment_ids"]]
        if outside:
            raise DatasetError(f"{where}: field 'evidence' names {excerpt(outside[0])!r}, which is not one of "
                               "the case's segment_ids")
        if obj.get("metric", "em") not in METRICS:
            raise DatasetError(f"{where}: field 'metric' must be one of {', '.join(METRICS)}")
        _check_strata(obj.get("strata", {}), where)
        if obj.get("canary") is not None:
            _check_canary(obj["canary"], where)
        out.append(Case(**obj))
    if not out:
        raise DatasetError(f"{path}: no cases")
    return out


def content_hash(dir_: Path) -> str:
    """The dataset's content hash: sha256 of ``segments.jsonl`` then ``cases.jsonl``, 32 hex digits."""
    h = hashlib.sha256()
    for name in (SEGMENTS_FILE, CASES_FILE):
        h.update((dir_ / name).read_bytes())
    return h.hexdigest()[:32]


def read_dataset(dir_: str | os.PathLike) -> Dataset:
    """Read and validate a dataset directory."""
    d = Path(dir_)
    if not d.is_dir():
        raise DatasetError(f"{d}: dataset directory not found")
    # Each file is read once: the same bytes are parsed and hashed (content_hash's definition).
    seg_bytes, case_bytes = read_bytes(d / SEGMENTS_FILE), read_bytes(d / CASES_FILE)
    segments = read_segments(d / SEGMENTS_FILE, seg_bytes)
    cases = read_cases(d / CASES_FILE, segments, case_bytes)
    card_path = d / CARD_FILE
    actual_hash = hashlib.sha256(seg_bytes + case_bytes).hexdigest()[:32]
    card = read_card(card_path, actual_hash) if card_path.exists() else DatasetCard(generator="unknown")
    card.content_hash = actual_hash
    return Dataset(segments=segments, cases=cases, card=card, path=d)




def read_card(path: Path, actual_hash: str | None = None) -> DatasetCard:
    """Read and validate ``dataset.json``. Fields kvaudit does not define are ignored (a newer
    generator may add some); ``generator`` is required. A ``content_hash`` that does not match
    ``actual_hash`` (the two JSONL files' hash) means they were edited after the card was
    written: refused, since the coverage and counts the card states no longer describe them."""
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    # null is absent here (older generators wrote "seed": null), except where a value is required
    card = record_from_json({k: v for k, v in raw.items() if v is not None or k == "generator"}, DatasetCard,
                            str(path))
    if not card.generator.strip():
        raise DatasetError(f"{path}: field 'generator' is empty")
    stated = raw.get("content_hash") or ""
    if stated and actual_hash is not None and stated != actual_hash:
        raise DatasetError(
            f"{path}: field 'content_hash' is {excerpt(stated, 40)} but {SEGMENTS_FILE} and {CASES_FILE} hash "
            f"to {actual_hash}: the files were changed after the card was written; regenerate the "
            "dataset, or remove the field to accept the files as they are"
        )
    return card


def _shallow(obj: Any) -> dict[str, Any]:
    # Records hold only plain values, lists and dicts: asdict's deep copy is 5x slower for nothing.
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def write_dataset(dir_: str | os.PathLike, segments: Iterable[Segment], cases: Iterable[Case],
                  card: DatasetCard) -> None:
    """Write a dataset directory atomically file by file; fills in ``card.content_hash``."""
    d = Path(dir_)
    d.mkdir(parents=True, exist_ok=True)
    write_jsonl(d / SEGMENTS_FILE, (_shallow(s) for s in segments))
    write_jsonl(d / CASES_FILE, (_shallow(c) for c in cases))
    card.content_hash = content_hash(d)
    write_json(d / CARD_FILE, asdict(card))
