"""Request traces: the workload JSONL format, its validation, and a compact columnar form.

One request per line, pieces in prompt order::

    {"id": "r0000001", "timestamp": 0.42,
     "pieces": [{"kind": "prefix", "id": "meta-r0000001", "tokens": 180},
                {"kind": "document", "id": "doc-17", "tokens": 912},
                {"kind": "question", "id": "q-r0000001", "tokens": 40}]}

``kind`` is ``prefix``, ``document`` or ``question``; ``id`` names the piece's content (two
pieces with the same id hold the same tokens, so an id must always come with the same token
count); ``tokens`` is a positive integer, at most :data:`MAX_PIECE_TOKENS`. ``timestamp``
(seconds, optional; a finite number, or null or NaN for none) is informational: requests are
simulated in file order. Extra fields are ignored, so a serving log can be used as is once it
carries these.

A valid file is read with pyarrow (fast; installed with ``datasets``); on any problem, or without
pyarrow, it is read line by line, and errors name the file, line and field.
"""

from __future__ import annotations

import math
import mmap
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvaudit.core.errors import DatasetError
from kvaudit.core.jsonio import iter_jsonl

KINDS = ("prefix", "document", "question")
PREFIX, DOCUMENT, QUESTION = 0, 1, 2
# The most tokens one piece may hold: far above any context window, and small enough that a
# trace's token sums (a billion pieces of it) stay within int64.
MAX_PIECE_TOKENS = 10**9


def _show(v: object, n: int = 60) -> str:
    """A user's value for a message: its repr cut to ``n`` characters."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**n:
        return f"an integer of {len(str(abs(v)))} digits"
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


@dataclass
class Trace:
    """Requests as flat piece arrays; request ``r`` owns pieces ``offsets[r]:offsets[r+1]``."""

    offsets: np.ndarray  # int64, n_requests + 1
    kind: np.ndarray  # int8 index into KINDS, one per piece
    content: np.ndarray  # int64 content code, one per piece (same code = same tokens)
    tokens: np.ndarray  # int64, one per piece
    timestamps: np.ndarray | None = None  # float64 per request, NaN where absent
    request_ids: list[str] | None = None  # None: r0, r1, ... by position

    @property
    def n_requests(self) -> int:
        return len(self.offsets) - 1

    def request_tokens(self) -> np.ndarray:
        """Prompt tokens per request."""
        return np.add.reduceat(self.tokens, self.offsets[:-1]) if self.n_requests else np.zeros(0, np.int64)

    def request_index(self) -> np.ndarray:
        """For every piece, the index of its request."""
        return np.repeat(np.arange(self.n_requests), np.diff(self.offsets))

    def summary(self) -> dict:
        req_tokens = self.request_tokens()
        docs = self.kind == DOCUMENT
        return {
            "requests": self.n_requests,
            "pieces": int(len(self.kind)),
            "prompt_tokens": int(req_tokens.sum()),
            "mean_prompt_tokens": float(req_tokens.mean()) if self.n_requests else 0.0,
            "document_token_share": float(self.tokens[docs].sum() / max(1, self.tokens.sum())),
            "distinct_documents": int(len(np.unique(self.content[docs]))),
            "distinct_prefixes": int(len(np.unique(self.content[self.kind == PREFIX]))),
        }


def trace_from_requests(requests: Iterable[list[tuple[str, str, int]]]) -> Trace:
    """Build a trace from ``[(kind, content_id, tokens), ...]`` per request (tests, small logs)."""
    codes: dict[str, int] = {}
    offsets, kind, content, tokens = [0], [], [], []
    for req in requests:
        for k, cid, t in req:
            kind.append(KINDS.index(k))
            content.append(codes.setdefault(cid, len(codes)))
            tokens.append(int(t))
        offsets.append(len(kind))
    return Trace(np.array(offsets, np.int64), np.array(kind, np.int8),
                 np.array(content, np.int64), np.array(tokens, np.int64))


# --------------------------------------------------------------------------- reading


def read_trace(path: str | Path) -> Trace:
    """Read and validate a workload JSONL file; bad input raises :class:`DatasetError`."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    try:
        trace = _read_fast(path)
    except Exception:  # any oddity: the careful reader finds it and names the line
        trace = None
    if trace is None:
        trace = _read_careful(path)
    if trace.n_requests == 0:
        raise DatasetError(f"{path}: no requests")
    return trace


# A line whose first value is ``null``: pyarrow's JSON reader (26.0) crashes the process (a
# segfault) when a block of the file starts with one, so such a file goes to the careful reader.
_NULL_ROW = re.compile(rb"(?m)^[ \t\r]*null")
_CHUNK = 1 << 26


def _fast_lines(path: Path) -> int | None:
    """The file's line count (a last line without its newline counted), or None when the file is
    not for pyarrow: one holding a ``null`` row (see :data:`_NULL_ROW`), or starting with a byte
    order mark (which pyarrow skips and the careful reader, the reference, refuses)."""
    with open(path, "rb") as f:
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            return 0
        with mm:
            if mm[:3] == b"\xef\xbb\xbf" or (mm.find(b"null") != -1 and _NULL_ROW.search(mm)):
                return None
            n = sum(mm[i:i + _CHUNK].count(b"\n") for i in range(0, len(mm), _CHUNK))
            return n + (mm[-1:] != b"\n")


def _read_fast(path: Path) -> Trace | None:
    """Columnar read with pyarrow; None when anything needs the careful reader's judgement.

    The careful reader is the reference: whatever this reads, it reads the same. pyarrow reads
    values separated by any whitespace, so a file of another line count than rows (two requests
    on a line, or blank lines) goes to the careful reader. One difference stays: fields the format
    ignores are skipped here unread, so a value in them that Python's JSON parser refuses (an
    integer of over 4300 digits, nesting deeper than its recursion limit) passes here and is
    refused, naming the line, where pyarrow is not installed.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj

    lines = _fast_lines(path)
    if lines is None:
        return None
    piece = pa.struct([("kind", pa.string()), ("id", pa.string()), ("tokens", pa.int64())])
    schema = pa.schema([("id", pa.string()), ("timestamp", pa.float64()), ("pieces", pa.list_(piece))])
    # Wrong types raise (and send the file to the careful reader); extra fields are ignored.
    table = pj.read_json(path, parse_options=pj.ParseOptions(explicit_schema=schema,
                                                             unexpected_field_behavior="ignore"))
    if table.num_rows != lines:
        return None
    ids = table["id"].combine_chunks()
    pieces = table["pieces"].combine_chunks()
    if (ids.null_count or pieces.null_count or pc.count_distinct(ids).as_py() != len(ids)
            or np.any(pc.equal(pc.utf8_length(ids), 0).to_numpy(zero_copy_only=False))):
        return None
    offsets = pieces.offsets.to_numpy().astype(np.int64)
    offsets -= offsets[0]
    if np.any(np.diff(offsets) <= 0):
        return None
    flat = pieces.flatten()
    kind_a, id_a, tok_a = (flat.field(n) for n in ("kind", "id", "tokens"))
    if flat.null_count or kind_a.null_count or id_a.null_count or tok_a.null_count:
        return None
    kind_idx = pc.index_in(kind_a, value_set=pa.array(KINDS))
    if kind_idx.null_count:
        return None
    tokens = tok_a.to_numpy().astype(np.int64)
    if (np.any(tokens <= 0) or np.any(tokens > MAX_PIECE_TOKENS)
            or np.any(pc.equal(pc.utf8_length(id_a), 0).to_numpy(zero_copy_only=False))):
        return None
    enc = pc.dictionary_encode(id_a)
    content = enc.indices.to_numpy().astype(np.int64)
    first = np.zeros(len(enc.dictionary), np.int64)
    first[content] = tokens  # any one of a content id's counts; all must agree
    if np.any(first[content] != tokens):
        return None
    ts = table["timestamp"].to_numpy().astype(np.float64)  # nulls become NaN
    if np.any(np.isinf(ts)):
        return None
    return Trace(offsets, kind_idx.to_numpy().astype(np.int8), content, tokens, ts,
                 ids.to_pylist())


def _read_careful(path: Path) -> Trace:
    codes: dict[str, int] = {}
    seen_tokens: dict[str, tuple[int, int]] = {}
    request_ids: list[str] = []
    seen_ids: set[str] = set()
    offsets, kind, content, tokens, timestamps = [0], [], [], [], []
    for n, obj in iter_jsonl(path):
        where = f"{path}, line {n}"
        rid = obj.get("id")
        if not isinstance(rid, str) or not rid:
            raise DatasetError(f"{where}: field 'id' must be a non-empty string")
        if rid in seen_ids:
            raise DatasetError(f"{where}: field 'id': duplicate request id {_show(rid)}")
        seen_ids.add(rid)
        ts = obj.get("timestamp")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
            raise DatasetError(f"{where}: field 'timestamp' must be a number")
        if ts is not None and ((isinstance(ts, int) and abs(ts) > 1e300) or math.isinf(ts)):
            raise DatasetError(f"{where}: field 'timestamp' must be a finite number, got {_show(ts)}")
        pieces = obj.get("pieces")
        if not isinstance(pieces, list) or not pieces:
            raise DatasetError(f"{where}: field 'pieces' must be a non-empty list")
        for i, p in enumerate(pieces):
            pw = f"{where}: field 'pieces[{i}]"
            if not isinstance(p, dict):
                raise DatasetError(f"{pw}' must be an object with kind, id and tokens")
            kind_ = p.get("kind")
            if not isinstance(kind_, str) or kind_ not in KINDS:
                raise DatasetError(f"{pw}.kind' must be one of {', '.join(KINDS)}, got {_show(kind_)}")
            cid = p.get("id")
            if not isinstance(cid, str) or not cid:
                raise DatasetError(f"{pw}.id' must be a non-empty string")
            t = p.get("tokens")
            if isinstance(t, bool) or not isinstance(t, int) or not 0 < t <= MAX_PIECE_TOKENS:
                raise DatasetError(f"{pw}.tokens' must be a positive integer of at most "
                                   f"{MAX_PIECE_TOKENS:,}, got {_show(t)}")
            prev = seen_tokens.setdefault(cid, (t, n))
            if prev[0] != t:
                raise DatasetError(f"{pw}.tokens': content id {_show(cid)} has {t} tokens here but "
                                   f"{prev[0]} on line {prev[1]} (same id must mean same content)")
            kind.append(KINDS.index(p["kind"]))
            content.append(codes.setdefault(cid, len(codes)))
            tokens.append(t)
        offsets.append(len(kind))
        request_ids.append(rid)
        timestamps.append(np.nan if ts is None else float(ts))
    return Trace(np.array(offsets, np.int64), np.array(kind, np.int8), np.array(content, np.int64),
                 np.array(tokens, np.int64), np.array(timestamps, np.float64), request_ids)
