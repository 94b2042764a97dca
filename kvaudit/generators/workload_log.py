"""A team's own request log as a workload (``kvaudit generate workload --from-log FILE``).

Reads one request per line, in any of the shapes serving logs have:

* an OpenAI chat-completions request: ``{"messages": [{"role": ..., "content": ...}, ...]}``
  (``content`` a string or a list of ``{"type": "text", "text": ...}`` parts), also wrapped as
  the Batch API writes it (``{"custom_id": ..., "body": {...}}``);
* an OpenAI completions request: ``{"prompt": "..."}``;
* a plain prompt: ``{"text": "..."}`` or a bare JSON string.

Each request is cut into pieces by ``--split``: ``messages`` (chat requests: system messages are
the prefix, the last message the question, every message between them a document), or
``delimiter:STRING`` / ``regex:PATTERN`` (the prompt's text, chat messages joined by a newline, cut
at each match: the first piece is the prefix, the last the question, those between documents).
Empty pieces are dropped. A piece's id is the hash of its text (same text, same id, wherever it
appears) and its token count the tokenizer's count of the text alone. Only ids and counts are
written unless ``keep_text`` (logs hold user data).

A line that cannot be read (not UTF-8 or not JSON, no prompt, a message without text) is skipped
and named with its reason; ``strict`` refuses the file at the first one instead.

Bounds, so that no log runs unbounded in time or memory: the log is read a line at a time, and a
line over ``max_line_bytes`` (:data:`MAX_LINE_BYTES`, 8 MiB) refuses the log, naming the line; a
request the split cuts into more than ``max_pieces`` pieces (:data:`MAX_PIECES`) refuses it too;
a ``regex:`` pattern runs in the ``regex`` module with a limit of :data:`REGEX_TIMEOUT_S` s of CPU
time per request, and a pattern that runs past it (catastrophic backtracking) refuses the log,
naming ``--split``.

The card (:func:`reuse_card`) says how much of the log's prompt tokens repeat earlier content, and
how much of that repeated content sits at positions an exact prefix cache cannot reach.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import regex

from kvaudit.core.errors import DatasetError, KvauditError, excerpt
from kvaudit.core.jsonio import unwritable

MAX_LINE_BYTES = 8 * 2**20  # default --max-line-bytes: longest request line, newline not counted
MAX_PIECES = 4096  # default --max-pieces: most pieces one request may be cut into
REGEX_TIMEOUT_S = 2.0  # the most CPU seconds a --split regex may take on one request

Cutter = Callable[[str], list[str]]


@dataclass
class LogRequest:
    id: str
    timestamp: float | None
    pieces: list[tuple[str, str]]  # (kind, text) in prompt order


@dataclass
class ImportResult:
    requests: list[dict[str, Any]]  # workload lines (pieces with ids and token counts)
    skipped: list[dict[str, Any]] = field(default_factory=list)  # {"line", "reason"}
    card: dict[str, Any] = field(default_factory=dict)


class _Skip(Exception):
    """A line that cannot be read as a request: its reason."""


class _TooManyPieces(Exception):
    """A request cut into more pieces than allowed."""


class _TooSlow(Exception):
    """A ``--split`` regex that ran past :data:`REGEX_TIMEOUT_S` on one request."""


def parse_split(spec: str, max_pieces: int = MAX_PIECES) -> Cutter | None:
    """``messages`` -> None (cut by chat message); ``delimiter:S`` / ``regex:P`` -> a text cutter
    that raises :class:`_TooManyPieces` past ``max_pieces`` pieces and :class:`_TooSlow` when a
    regex runs past :data:`REGEX_TIMEOUT_S`."""
    if spec == "messages":
        return None
    kind, _, arg = spec.partition(":")
    if kind == "delimiter" and arg:
        return _bounded(lambda text: text.split(arg, max_pieces), max_pieces)
    if kind == "regex" and arg:
        try:
            pat = regex.compile(arg)
        except (regex.error, OverflowError, RecursionError) as e:
            raise KvauditError(f"--split regex:{excerpt(arg)}: not a regular expression ({e})") from None
        if pat.groups:
            raise KvauditError(f"--split regex:{excerpt(arg)}: capturing groups would be kept as pieces; "
                               "use (?:...)")

        def split(text: str) -> list[str]:
            try:
                return pat.split(text, maxsplit=max_pieces, timeout=REGEX_TIMEOUT_S)
            except TimeoutError:
                raise _TooSlow from None

        return _bounded(split, max_pieces)
    raise KvauditError(f"--split {excerpt(spec)!r}: expected messages, delimiter:STRING or regex:PATTERN")


def _bounded(cut: Cutter, max_pieces: int) -> Cutter:
    def bounded(text: str) -> list[str]:
        parts = cut(text)
        if len(parts) > max_pieces:
            raise _TooManyPieces
        return parts

    return bounded


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif not (isinstance(part, dict) and isinstance(part.get("type"), str)):
                raise _Skip(f"field '{where}[{i}]' is not a content part")
        return "".join(parts)
    if content is None:
        return ""
    raise _Skip(f"field '{where}' must be a string or a list of content parts")


def _request(obj: Any, line: int, cut: Cutter | None, max_pieces: int = MAX_PIECES) -> LogRequest:
    rid = f"line-{line}"
    ts = None
    if isinstance(obj, dict):
        raw_id = obj.get("custom_id", obj.get("id"))
        if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool):
            rid = str(raw_id)
        for key in ("timestamp", "created"):
            v = obj.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf"):
                ts = float(v)
                break
        if isinstance(obj.get("body"), dict):
            obj = obj["body"]
    if isinstance(obj, str):
        texts, messages = [obj], None
    elif isinstance(obj, dict) and "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise _Skip("field 'messages' must be a non-empty list")
        messages = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _Skip(f"field 'messages[{i}]' must be an object with a 'role'")
            messages.append((m["role"], _text(m.get("content"), f"messages[{i}].content")))
        texts = [t for _, t in messages]
    elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        texts, messages = [obj["prompt"]], None
    elif isinstance(obj, dict) and isinstance(obj.get("text"), str):
        texts, messages = [obj["text"]], None
    elif isinstance(obj, dict) and "prompt" in obj:
        raise _Skip("field 'prompt' must be a string (a list of prompts is several requests: one per line)")
    else:
        raise _Skip("no prompt: expected 'messages', 'prompt' or 'text' (or a JSON string)")
    if cut is None:
        if messages is None:
            raise _Skip("--split messages needs chat requests ('messages'); this line is a plain prompt")
        if len(messages) > max_pieces:
            raise _TooManyPieces
        system = [t for r, t in messages if r in ("system", "developer")]
        rest = [t for r, t in messages if r not in ("system", "developer")]
        pieces = ([("prefix", t) for t in system] + [("document", t) for t in rest[:-1]]
                  + [("question", t) for t in rest[-1:]])
    else:
        parts = cut("\n".join(texts))
        kinds = ["prefix"] + ["document"] * (len(parts) - 2) + ["question"] if len(parts) > 1 else ["question"]
        pieces = list(zip(kinds, parts, strict=True))
    pieces = [(k, t) for k, t in pieces if t.strip()]
    if not pieces:
        raise _Skip("the prompt is empty")
    return LogRequest(rid, ts, pieces)


def _parse(line: str) -> Any:
    """One line's JSON value, or :class:`_Skip` with the reason it cannot be read."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _Skip(f"not JSON ({e.msg} at column {e.colno})") from None
    except RecursionError:
        raise _Skip("JSON nested too deeply") from None
    except ValueError as e:  # an integer of more digits than Python converts
        raise _Skip(f"unreadable JSON value ({str(e)[:120]})") from None
    if "\\u" in line:  # a "\ud800" escape: a lone surrogate no UTF-8 output can hold
        bad = unwritable(obj, max_nesting=None)
        if bad:
            raise _Skip(bad)
    return obj


def _open_log(path: Path) -> BinaryIO:
    """The log opened for reading; a :class:`DatasetError` saying what ``path`` is when it is not
    a readable regular file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e})") from None
    mode = st.st_mode
    if stat.S_ISDIR(mode):
        raise DatasetError(f"{path}: is a directory, not a file")
    if not stat.S_ISREG(mode):
        what = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
                else "a pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")
        raise DatasetError(f"{path}: not a regular file ({what}); --from-log reads a JSONL file")
    if st.st_size == 0:
        raise DatasetError(f"{path}: empty (0 bytes)")
    try:
        return path.open("rb")
    except OSError as e:
        raise DatasetError(f"{path}: cannot be read ({e.strerror or e})") from None


def _lines(path: Path, max_line_bytes: int) -> Iterator[tuple[int, bytes]]:
    """``(line number, bytes)`` of each line, read one at a time; a line longer than
    ``max_line_bytes`` (0 = no limit; its newline not counted) is a :class:`DatasetError`."""
    with _open_log(path) as f:
        for n in itertools.count(1):
            raw = f.readline(max_line_bytes + 1 if max_line_bytes else -1)
            if not raw:
                return
            if max_line_bytes and len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                raise DatasetError(f"{path}, line {n}: longer than {max_line_bytes} bytes "
                                   "(--max-line-bytes; raise it for longer requests)")
            yield n, raw


def _line_request(raw: bytes, n: int, cut: Cutter | None, max_pieces: int) -> LogRequest | None:
    """Line ``n``'s request, None for a blank line; :class:`_Skip` when it cannot be read."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _Skip(f"not UTF-8 text (byte {e.start} of the line)") from None
    if n == 1:
        line = line.lstrip("\ufeff")
    if not line.strip():
        return None
    return _request(_parse(line), n, cut, max_pieces)


def iter_log(path: str | Path, split: str, *, strict: bool = False, max_line_bytes: int = MAX_LINE_BYTES,
             max_pieces: int = MAX_PIECES, skipped: list[dict[str, Any]] | None = None) -> Iterator[LogRequest]:
    """The log's requests, one at a time; the lines skipped are appended to ``skipped``
    (``{"line", "reason"}``). ``strict`` refuses the file at the first bad line, a line over
    ``max_line_bytes`` or a request of more than ``max_pieces`` pieces refuses it always, each with
    a :class:`DatasetError` naming the line."""
    path = Path(path)
    cut = parse_split(split, max_pieces)
    skipped = skipped if skipped is not None else []
    for n, raw in _lines(path, max_line_bytes):
        try:
            req = _line_request(raw, n, cut, max_pieces)
        except _TooSlow:
            raise KvauditError(f"--split {excerpt(split)!r}: matching took over {REGEX_TIMEOUT_S:g} s on {path}, "
                               f"line {n} (a pattern that backtracks catastrophically?); simplify the "
                               "pattern") from None
        except _TooManyPieces:
            raise DatasetError(f"{path}, line {n}: --split {excerpt(split)!r} cuts this request into more than "
                               f"{max_pieces} pieces (--max-pieces); choose a split that cuts less often, "
                               "or raise --max-pieces") from None
        except _Skip as e:
            if strict:
                raise DatasetError(f"{path}, line {n}: {e} (refused by --strict; without it the line "
                                   "is skipped)") from None
            skipped.append({"line": n, "reason": excerpt(str(e), 200)})
            continue
        if req is not None:
            yield req


def _nothing_read(path: str | Path, skipped: list[dict[str, Any]]) -> DatasetError:
    first = (f" ({len(skipped)} lines skipped; first: line {skipped[0]['line']}: {skipped[0]['reason']})"
             if skipped else "")
    return DatasetError(f"{path}: no request could be read{first}")


def read_log(path: str | Path, split: str, *, strict: bool = False, max_line_bytes: int = MAX_LINE_BYTES,
             max_pieces: int = MAX_PIECES) -> tuple[list[LogRequest], list[dict[str, Any]]]:
    """The log's requests and the lines skipped (``{"line", "reason"}``), as :func:`iter_log`
    reads them; a log without a readable request is a :class:`DatasetError`."""
    skipped: list[dict[str, Any]] = []
    requests = list(iter_log(path, split, strict=strict, max_line_bytes=max_line_bytes, max_pieces=max_pieces,
                             skipped=skipped))
    if not requests:
        raise _nothing_read(path, skipped)
    return requests, skipped


def content_id(text: str) -> str:
    return "c-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def reuse_card(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """How much of the log's prompt tokens repeat content seen earlier in the log, and how much of
    that repeat an exact prefix cache (unbounded, at piece granularity) can reach: a repeated
    piece is prefix-reachable when every piece before it in its prompt matches an earlier prompt's
    leading pieces in order."""
    seen: set[str] = set()
    trie: dict[str, Any] = {}
    total = repeated = prefix_reachable = 0
    for req in lines:
        node: dict[str, Any] | None = trie
        for p in req["pieces"]:
            t = p["tokens"]
            total += t
            if p["id"] in seen:
                repeated += t
                if node is not None and p["id"] in node:
                    prefix_reachable += t
            node = node.get(p["id"]) if node is not None else None
        seen.update(p["id"] for p in req["pieces"])
        node = trie
        for p in req["pieces"]:
            node = node.setdefault(p["id"], {})
    return {
        "prompt_tokens": total,
        "repeated_tokens": repeated,
        "repeated_share": repeated / total if total else 0.0,
        "prefix_reachable_tokens": prefix_reachable,
        "non_prefix_share_of_repeated": (repeated - prefix_reachable) / repeated if repeated else 0.0,
        "definition": "repeated: tokens of pieces whose content (same text) appeared earlier in the log; "
                      "prefix-reachable: repeated tokens whose whole preceding prompt matches an earlier "
                      "prompt's leading pieces (what an exact prefix cache with unbounded room could serve)",
    }


LONG_LINE_CHARS = 80  # a line this long seen again in another request is content, not boilerplate
HIDDEN_REPEAT_SHARE = 0.20  # lines seen in earlier requests, of the text: worth a split of its own
LOW_PIECE_REPEAT_SHARE = 0.05  # ... while the pieces themselves repeat less than this


class _LineRepeats:
    """How much of the log's text sits in long lines (:data:`LONG_LINE_CHARS`) that earlier
    requests also held, whatever the split: the repeats a split that keeps documents inside one
    piece hides (a RAG prompt's documents pasted into one user message)."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.chars = self.repeated = 0

    def add(self, texts: list[str]) -> None:
        mine: set[str] = set()
        for text in texts:
            for line in text.splitlines():
                self.chars += len(line)
                if len(line) < LONG_LINE_CHARS:
                    continue
                h = hashlib.sha256(line.encode("utf-8")).hexdigest()[:20]
                if h in self.seen:
                    self.repeated += len(line)
                mine.add(h)
        self.seen |= mine

    @property
    def share(self) -> float:
        return self.repeated / self.chars if self.chars else 0.0


def hidden_repeats_hint(card: dict[str, Any]) -> str | None:
    """A warning when the pieces repeat little but the requests' long lines repeat much: the
    split keeps repeated documents inside pieces that differ (docs/simulator.md, "Documents inside
    one message"); None otherwise."""
    lines = card.get("repeated_line_share", 0.0)
    if card["repeated_share"] >= LOW_PIECE_REPEAT_SHARE or lines < HIDDEN_REPEAT_SHARE:
        return None
    return (f"warning: --split {card['split']} found {100 * card['repeated_share']:.1f}% of prompt tokens repeated, "
            f"but {100 * lines:.1f}% of the requests' text sits in long lines that earlier requests also held: "
            "documents inside one message are one piece with the rest of it, and never repeat whole. Cut them "
            "out with a split that matches what separates them, e.g. --split 'regex:\\n*\\[Document \\d+\\]\\n*|\\n+(?=Question:)' "
            "(docs/simulator.md, \"Documents inside one message\")")


def import_log(path: str | Path, split: str, count_tokens: Callable[[str], int], *, keep_text: bool = False,
               strict: bool = False, max_line_bytes: int = MAX_LINE_BYTES,
               max_pieces: int = MAX_PIECES) -> ImportResult:
    """The log as workload lines (the format ``kvaudit simulate`` and ``kvaudit replay`` read)."""
    skipped: list[dict[str, Any]] = []
    lines = []
    long_lines = _LineRepeats()
    for r in iter_log(path, split, strict=strict, max_line_bytes=max_line_bytes, max_pieces=max_pieces,
                      skipped=skipped):
        long_lines.add([text for _, text in r.pieces])
        pieces = []
        for kind, text in r.pieces:
            piece: dict[str, Any] = {"kind": kind, "id": content_id(text), "tokens": max(1, count_tokens(text))}
            if keep_text:
                piece["text"] = text
            pieces.append(piece)
        line: dict[str, Any] = {"id": r.id, "pieces": pieces}
        if r.timestamp is not None:
            line["timestamp"] = r.timestamp
        lines.append(line)
    if not lines:
        raise _nothing_read(path, skipped)
    card = {"source": str(path), "split": split, "requests": len(lines), "skipped_lines": len(skipped),
            "kept_text": keep_text, **reuse_card(lines), "repeated_line_share": long_lines.share}
    return ImportResult(lines, skipped, card)


def iter_lines(result: ImportResult) -> Iterator[str]:
    for line in result.requests:
        yield json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n"
