"""The records every part of kvaudit passes around, with validation and JSON(L) IO.

A *dataset* is a directory with three files (written by ``kvaudit.generators``, read by
everything else):

``segments.jsonl``  one :class:`Segment` per line: ``id`` (content hash of ``text``), ``text``,
                    ``source`` (source document id), ``tags`` (free-form dict).
``cases.jsonl``     one :class:`Case` per line (fields below).
``dataset.json``    the :class:`DatasetCard`: generator, seed, parameters, reuse-dynamics
                    coverage and a content hash of the two JSONL files.

A *run directory* (written by ``kvaudit.runners``) holds ``manifest.json`` (the typed
:class:`~kvaudit.core.run_records.Manifest`, with a format version, read and written by
:func:`kvaudit.core.run_records.read_manifest` / ``write_manifest``; its ``identity`` object,
:data:`MANIFEST_IDENTITY`, holds the fields two runs must share to be compared) and
``pairs.jsonl`` (one :class:`PairRecord` per case, holding every arm's :class:`ArmResult`;
:func:`read_pairs` is its one reader). ``audit.json`` (:mod:`kvaudit.audit.record`),
``summary.json`` and ``report.html`` are added by the audit and report stages.

Bad input raises :class:`DatasetError`, whose message names the file, line and field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

SEGMENTS_FILE = "segments.jsonl"
CASES_FILE = "cases.jsonl"
CARD_FILE = "dataset.json"
MANIFEST_FILE = "manifest.json"
PAIRS_FILE = "pairs.jsonl"
AUDIT_FILE = "audit.json"
MANIFEST_IDENTITY = "identity"  # the manifest's object of what makes a run's configuration one

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


class DatasetError(ValueError):
    """A dataset or run file is malformed; the message names the file, line and field."""


def sha256_hex(data: bytes | str) -> str:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return hashlib.sha256(data).hexdigest()


def ids_hash(ids: Iterable[int]) -> str:
    """Stable hash of a token-id sequence (what the audit compares across arms)."""
    return sha256_hex(",".join(str(int(i)) for i in ids))[:32]


def segment_id(text: str) -> str:
    """Content address of a segment's text."""
    return "s" + sha256_hex(text)[:16]


# --------------------------------------------------------------------------- dataset records


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


# --------------------------------------------------------------------------- run records


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


# --------------------------------------------------------------------------- IO helpers


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable_dir(path: str | os.PathLike, flag: str = "--out") -> Path:
    """Fail early, before any expensive work, when ``path`` cannot become a directory we write:
    it is a file, or its nearest existing ancestor is not writable."""
    d = Path(path)
    if d.exists() and not d.is_dir():
        raise DatasetError(f"{flag} {d}: exists and is not a directory")
    probe = d
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise DatasetError(f"{flag} {d}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise DatasetError(f"{flag} {d}: {probe} is not writable")
    return d


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_atomic(path, dump_json(obj))


def dump_jsonl(rows: Iterable[Any]) -> str:
    return "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> None:
    write_atomic(path, dump_jsonl(rows))


def parse_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` that fails only with a :class:`DatasetError` naming ``where``.

    Beyond malformed JSON this covers what the standard parser raises on hostile input: an
    integer of more digits than Python converts (ValueError) and nesting deeper than the
    interpreter's recursion limit (RecursionError).
    """
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        at = "" if e.lineno == 1 else f": line {e.lineno} column {e.colno}"
        raise DatasetError(f"{where}: not valid JSON ({e.msg}{at})") from None
    except UnicodeDecodeError as e:
        raise DatasetError(f"{where}: not UTF-8 text ({e.reason})") from None
    except RecursionError:
        raise DatasetError(f"{where}: JSON nested too deeply to read") from None
    except ValueError as e:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise DatasetError(f"{where}: unreadable JSON value ({str(e)[:120]})") from None
    # A "\ud800" escape decodes to a lone surrogate, which reads fine and then cannot be written
    # back as UTF-8 (a resumed run would die writing it). Checked only when such an escape occurs.
    if _SURROGATE_ESCAPE.search(text if isinstance(text, str) else text.decode("utf-8", "replace")):
        bad = unwritable(obj, max_nesting=None)
        if bad is not None:
            raise DatasetError(f"{where}: {bad}")
    return obj


_SURROGATE_ESCAPE = re.compile(r"\\[uU][dD][89a-fA-F]")


# How deep a run file's values may nest. The parser reads up to the interpreter's recursion
# limit, but writing such a value back (json.dumps, dataclasses.asdict) from a deeper call fails
# far below it; no record kvaudit writes nests beyond a few levels.
MAX_NESTING = 64


def _utf8(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _name(key: str) -> str:
    """A key for a field path in a message: as is when short and printable, else quoted and cut."""
    return key if len(key) <= 40 and key.isprintable() and _utf8(key) else ascii(key)[:40]


def unwritable(obj: Any, max_nesting: int | None = MAX_NESTING) -> str | None:
    """Why a parsed JSON value cannot be written back as UTF-8 JSON, naming the field, else
    ``None``: a string (key or value) holding a lone surrogate (JSON's ``\\ud800`` escape
    decodes to one; no UTF-8 file can hold it), or nesting deeper than ``max_nesting`` (None: no
    limit). Iterative, so a value nested as deeply as the parser allows is walked without recursion."""
    stack: list[tuple[str, int, Any]] = [("", 0, obj)]
    while stack:
        where, depth, v = stack.pop()
        field_ = f"field '{where if len(where) <= 80 else where[:80] + '...'}'" if where else "the document"
        if isinstance(v, str):
            if not _utf8(v):
                return (f"{field_} is not Unicode text (it holds a lone surrogate, a \\ud800-\\udfff "
                        "escape without its pair)")
        elif isinstance(v, (dict, list)):
            if max_nesting is not None and depth >= max_nesting:
                return f"{field_} nests deeper than {max_nesting} levels"
            if isinstance(v, dict):
                for k, x in reversed(v.items()):
                    sub = f"{where}.{_name(k)}" if where else _name(k)
                    if not _utf8(k):
                        return f"field '{sub[:80]}' is not Unicode text (a key with a lone surrogate)"
                    stack.append((sub, depth + 1, x))
            else:
                stack.extend((f"{where}[{i}]", depth + 1, x) for i, x in reversed(list(enumerate(v))))
    return None


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    return parse_json(read_bytes(path), str(path))


def read_bytes(path: str | os.PathLike) -> bytes:
    """A file's bytes (a DatasetError naming it when it is missing)."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise DatasetError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e})") from None


def iter_jsonl(path: str | os.PathLike, *, tolerate_torn_tail: bool = False,
               data: bytes | None = None) -> Iterator[tuple[int, dict]]:
    """Yield ``(line_number, object)``.

    A last line without its newline is a record like any other when it parses; when it does not
    (a writer killed mid-line) it is skipped if ``tolerate_torn_tail``, else an error.
    ``data``: the file's bytes, when the caller has read them already (``path`` names them).
    """
    path = Path(path)
    try:
        text = (read_bytes(path) if data is None else data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    # Split on "\n" only: str.splitlines also breaks at U+2028, U+0085 and other separators that
    # JSON strings may hold raw (json.dumps(ensure_ascii=False) writes them so).
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = parse_json(line, f"{path}, line {n}")
        except DatasetError:
            if tolerate_torn_tail and n == len(lines) and not line.endswith("\n"):
                return
            raise
        if not isinstance(obj, dict):
            raise DatasetError(f"{path}, line {n}: expected a JSON object, got {type(obj).__name__}")
        yield n, obj


def _check_fields(obj: dict, cls: type, where: str, types: dict[str, type | tuple]) -> dict:
    known = {f.name for f in fields(cls)}
    unknown = set(obj) - known
    if unknown:
        raise DatasetError(f"{where}: unknown field '{_cut(sorted(unknown)[0], 40)}'")
    for name, typ in types.items():
        if name not in obj:
            raise DatasetError(f"{where}: missing field '{name}'")
        if not isinstance(obj[name], typ):
            want = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
            raise DatasetError(
                f"{where}: field '{name}' must be {want}, got {type(obj[name]).__name__}"
            )
    return obj


def _str_list(obj: dict, name: str, where: str) -> None:
    v = obj.get(name, [])
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise DatasetError(f"{where}: field '{name}' must be a list of strings")


def _check_strata(strata: Any, where: str) -> None:
    """Strata are a flat object: each key a stratum, each value a string, number or boolean (the
    report groups cases by ``str(value)``; a list or object there has no group)."""
    if not isinstance(strata, dict):
        raise DatasetError(f"{where}: field 'strata' must be an object of stratum values, "
                           f"got {type(strata).__name__}")
    for k, v in strata.items():
        if v is None or not isinstance(v, (str, int, float)):
            raise DatasetError(f"{where}: field 'strata.{_cut(k, 40)}' must be a string, number or "
                               f"boolean, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise DatasetError(f"{where}: field 'strata.{_cut(k, 40)}' must be a finite number")


_CANARY_FIELDS = {"value", "decoys", "capture_prefix"}


def _check_canary(c: Any, where: str) -> None:
    """A leak probe's canary: ``{"value": str, "decoys": [str, ...], "capture_prefix": str}``."""
    if not isinstance(c, dict) or not isinstance(c.get("value"), str) or not c["value"]:
        raise DatasetError(f"{where}: field 'canary' must be an object with a non-empty string 'value'")
    unknown = sorted(set(c) - _CANARY_FIELDS)
    if unknown:
        raise DatasetError(f"{where}: unknown field 'canary.{_cut(unknown[0], 40)}'")
    decoys = c.get("decoys", [])
    if not isinstance(decoys, list) or not all(isinstance(d, str) and d for d in decoys):
        raise DatasetError(f"{where}: field 'canary.decoys' must be a list of non-empty strings")
    if not isinstance(c.get("capture_prefix", ""), str):
        raise DatasetError(f"{where}: field 'canary.capture_prefix' must be str")


def read_segments(path: Path, data: bytes | None = None) -> dict[str, Segment]:
    out: dict[str, Segment] = {}
    for n, obj in iter_jsonl(path, data=data):
        where = f"{path}, line {n}"
        _check_fields(obj, Segment, where, {"id": str, "text": str})
        if not isinstance(obj.get("source", ""), str):
            raise DatasetError(f"{where}: field 'source' must be str")
        if not isinstance(obj.get("tags", {}), dict):
            raise DatasetError(f"{where}: field 'tags' must be an object")
        if obj["id"] in out:
            raise DatasetError(f"{where}: field 'id': duplicate segment id {_cut(obj['id'])!r}")
        if not obj["text"]:
            raise DatasetError(f"{where}: field 'text' is empty")
        out[obj["id"]] = Segment(**obj)
    return out


def read_cases(path: Path, segments: dict[str, Segment], data: bytes | None = None) -> list[Case]:
    out: list[Case] = []
    seen: set[str] = set()
    for n, obj in iter_jsonl(path, data=data):
        where = f"{path}, line {n}"
        _check_fields(
            obj, Case, where, {"id": str, "task": str, "segment_ids": list, "question": str, "answers": list}
        )
        for name in ("segment_ids", "answers", "evidence"):
            _str_list(obj, name, where)
        if obj["id"] in seen:
            raise DatasetError(f"{where}: field 'id': duplicate case id {_cut(obj['id'])!r}")
        seen.add(obj["id"])
        if not obj["segment_ids"]:
            raise DatasetError(f"{where}: field 'segment_ids' is empty")
        for sid in obj["segment_ids"] + obj.get("evidence", []):
            if sid not in segments:
                raise DatasetError(f"{where}: field 'segment_ids' names unknown segment {_cut(sid)!r}")
        outside = [e for e in obj.get("evidence", []) if e not in obj["segment_ids"]]
        if outside:
            raise DatasetError(f"{where}: field 'evidence' names {_cut(outside[0])!r}, which is not one of "
                               "the case's segment_ids")
        if obj.get("metric", "em") not in METRICS:
            raise DatasetError(f"{where}: field 'metric' must be one of {', '.join(METRICS)}")
        _check_strata(obj.get("strata", {}), where)
        if obj.get("canary") is not None:
            _check_canary(obj["canary"], where)
        for name in ("system", "prefix", "metric"):
            if name in obj and not isinstance(obj[name], str):
                raise DatasetError(f"{where}: field '{name}' must be str")
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


_CARD_TYPES: dict[str, type | tuple] = {
    "generator": str, "seed": int, "params": dict, "coverage": dict, "content_hash": str, "counts": dict,
}


def read_card(path: Path, actual_hash: str | None = None) -> DatasetCard:
    """Read and validate ``dataset.json``. Fields kvaudit does not define are ignored (a newer
    generator may add some); ``generator`` is required. A ``content_hash`` that does not match
    ``actual_hash`` (the two JSONL files' hash) means they were edited after the card was
    written: refused, since the coverage and counts the card states no longer describe them."""
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise DatasetError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    if "generator" not in raw:
        raise DatasetError(f"{path}: missing field 'generator'")
    for name, typ in _CARD_TYPES.items():
        v = raw.get(name)
        if v is None and name != "generator":
            continue
        if isinstance(v, bool) or not isinstance(v, typ):
            raise DatasetError(f"{path}: field '{name}' must be {_type_name(typ)}, got {type(v).__name__}")
    if not raw["generator"].strip():
        raise DatasetError(f"{path}: field 'generator' is empty")
    stated = raw.get("content_hash") or ""
    if stated and actual_hash is not None and stated != actual_hash:
        raise DatasetError(
            f"{path}: field 'content_hash' is {_cut(stated, 40)} but {SEGMENTS_FILE} and {CASES_FILE} hash "
            f"to {actual_hash}: the files were changed after the card was written; regenerate the "
            "dataset, or remove the field to accept the files as they are"
        )
    known = {f.name for f in fields(DatasetCard)}
    return DatasetCard(**{k: v for k, v in raw.items() if k in known and v is not None})


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


# --------------------------------------------------------------------------- run IO

# The one reader of pairs.jsonl (the audit, the report and a resumed run all read through it):
# every field a reader relies on is type-checked here, so a malformed record is a DatasetError
# naming the file, line and field, never a KeyError or a wrong number further on.
_PAIR_TYPES: dict[str, type | tuple] = {
    "case_id": str, "task": str, "strata": dict, "ids_hash": str, "segment_ids": list,
    "segment_hashes": list, "segment_spans": list, "truncation": dict, "decoding": dict,
    "arm_order": list, "arms": dict, "n_prompt_tokens": int,
}
_ARM_TYPES: dict[str, type | tuple] = {
    "arm": str, "answer": str, "ids_hash": str, "segment_hashes": list, "truncation": dict,
    "decoding": dict, "tokens_reused": int, "tokens_computed": int, "margin": (int, float),
    "ttft_s": (int, float), "top_k": list,
}
_ARM_OPTIONAL: dict[str, type | tuple] = {
    "logit_diff_vs_recompute": (int, float), "segment_kv_fingerprints": dict, "canary_logprobs": dict,
    "engine": dict, "repair": dict, "cache_hit_tokens": int, "decode_s": (int, float), "answer_ids": list,
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


def _str_lists(obj: dict, names: tuple[str, ...], where: str) -> None:
    for name in names:
        if not all(isinstance(x, str) for x in obj.get(name, [])):
            raise DatasetError(f"{where}: field '{name}' must be a list of strings")


def validate_pair(obj: dict, where: str) -> None:
    """Type-check one raw ``pairs.jsonl`` object; ``where`` (file and line) starts every message."""
    _validate(obj, where, _PAIR_TYPES)
    for span in obj["segment_spans"]:
        if (not isinstance(span, list) or len(span) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in span)):
            raise DatasetError(f"{where}: field 'segment_spans' must hold [start, end] integer pairs")
    for name in ("evidence", "answers"):
        if not isinstance(obj.get(name, []), list):
            raise DatasetError(f"{where}: field '{name}' must be a list of strings")
    _str_lists(obj, ("segment_ids", "segment_hashes", "arm_order", "evidence", "answers"), where)
    if not isinstance(obj.get("metric", "em"), str):
        raise DatasetError(f"{where}: field 'metric' must be str")
    if obj.get("canary") is not None and not isinstance(obj["canary"], dict):
        raise DatasetError(f"{where}: field 'canary' must be an object or null")
    for name, arm in obj["arms"].items():
        if not isinstance(arm, dict):
            raise DatasetError(f"{where}: field 'arms.{name}' must be an object")
        arm_where = f"{where}, arm '{name}'"
        _validate(arm, arm_where, _ARM_TYPES, _ARM_OPTIONAL)
        _str_lists(arm, ("segment_hashes",), arm_where)
        if "segment_kv_fingerprints" in arm and arm["segment_kv_fingerprints"] is None:
            raise DatasetError(f"{arm_where}: field 'segment_kv_fingerprints' must be an object, got null")
        if "answer_ids" not in arm:
            raise DatasetError(f"{arm_where}: missing field 'answer_ids'")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in arm["answer_ids"] or []):
            raise DatasetError(f"{arm_where}: field 'answer_ids' must be a list of integers")
        if not all(isinstance(e, list) and len(e) == 2 and isinstance(e[0], int) and not isinstance(e[0], bool)
                   and isinstance(e[1], (int, float)) and not isinstance(e[1], bool) for e in arm["top_k"]):
            raise DatasetError(f"{arm_where}: field 'top_k' must hold [token id, logit] pairs")
        for key, kind in (("segment_kv_fingerprints", str), ("canary_logprobs", (int, float))):
            values = (arm.get(key) or {}).values()
            if any(isinstance(v, bool) or not isinstance(v, kind) for v in values):
                raise DatasetError(f"{arm_where}: field '{key}' must map names to {_type_name(kind)}")


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
            raise DatasetError(f"{where}: malformed pair record ({_cut(str(e), 160)})") from None
    return out


def mend_pairs_tail(run_dir: str | os.PathLike) -> None:
    """Make ``pairs.jsonl`` end at a record boundary before records are appended to it.

    A last line without its newline is either a complete record (killed between the write and the
    newline, or saved by an editor): it gets its newline and is kept; or a torn one (killed
    mid-line): it is cut, and its case runs again.
    """
    path = Path(run_dir) / PAIRS_FILE
    if not path.exists():
        return
    raw = read_bytes(path)
    if not raw or raw.endswith(b"\n"):
        return
    cut = raw.rfind(b"\n") + 1
    try:
        complete = isinstance(parse_json(raw[cut:], str(path)), dict)
    except DatasetError:
        complete = False
    write_atomic(path, (raw + b"\n" if complete else raw[:cut]).decode("utf-8", errors="strict"))


def _cut(text: str, n: int = 80) -> str:
    """User input echoed in a message: control characters escaped, cut to ``n`` characters."""
    shown = text[:n] if text[:n].isprintable() else ascii(text[:n])[1:-1]
    return shown if len(text) <= n else shown + f"... ({len(text)} chars)"
