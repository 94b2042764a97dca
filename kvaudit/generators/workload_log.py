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

A line that cannot be read (not JSON, no prompt, a message without text) is skipped and named with
its reason; ``strict`` refuses the file at the first one instead. The card
(:func:`reuse_card`) says how much of the log's prompt tokens repeat earlier content, and how much
of that repeated content sits at positions an exact prefix cache cannot reach.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.errors import DatasetError, KvauditError, excerpt
from kvaudit.core.jsonio import read_bytes


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


def parse_split(spec: str) -> Callable[[str], list[str]] | None:
    """``messages`` -> None (cut by chat message); ``delimiter:S`` / ``regex:P`` -> a text cutter."""
    if spec == "messages":
        return None
    kind, _, arg = spec.partition(":")
    if kind == "delimiter" and arg:
        return lambda text: text.split(arg)
    if kind == "regex" and arg:
        try:
            pat = re.compile(arg)
        except re.error as e:
            raise KvauditError(f"--split regex:{arg}: not a regular expression ({e})") from None
        if pat.groups:
            raise KvauditError(f"--split regex:{arg}: capturing groups would be kept as pieces; use (?:...)")
        return pat.split
    raise KvauditError(f"--split {spec!r}: expected messages, delimiter:STRING or regex:PATTERN")


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


def _request(obj: Any, line: int, cut: Callable[[str], list[str]] | None) -> LogRequest:
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


def read_log(path: str | Path, split: str, *, strict: bool = False) -> tuple[list[LogRequest], list[dict[str, Any]]]:
    """The log's requests and the lines skipped (``{"line", "reason"}``); ``strict`` refuses the
    file at the first bad line with a :class:`DatasetError` naming it."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: file not found")
    cut = parse_split(split)
    try:
        text = read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text (byte {e.start})") from None
    requests, skipped = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise _Skip(f"not JSON ({e.msg} at column {e.colno})") from None
            requests.append(_request(obj, n, cut))
        except (_Skip, RecursionError) as e:
            reason = str(e) if isinstance(e, _Skip) else "nested too deeply"
            if strict:
                raise DatasetError(f"{path}, line {n}: {reason} (refused by --strict; without it the line "
                                   "is skipped)") from None
            skipped.append({"line": n, "reason": excerpt(reason, 200)})
    if not requests:
        raise DatasetError(f"{path}: no request could be read" + (f" ({len(skipped)} lines skipped; first: line "
                                                                   f"{skipped[0]['line']}: {skipped[0]['reason']})"
                                                                   if skipped else ""))
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


def import_log(path: str | Path, split: str, count_tokens: Callable[[str], int], *, keep_text: bool = False,
               strict: bool = False) -> ImportResult:
    """The log as workload lines (the format ``kvaudit simulate`` and ``kvaudit replay`` read)."""
    requests, skipped = read_log(path, split, strict=strict)
    lines = []
    for r in requests:
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
    card = {"source": str(path), "split": split, "requests": len(lines), "skipped_lines": len(skipped),
            "kept_text": keep_text, **reuse_card(lines)}
    return ImportResult(lines, skipped, card)


def iter_lines(result: ImportResult) -> Iterator[str]:
    for line in result.requests:
        yield json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n"
