"""Prompt assembly: the one function that turns a case into the token ids every arm consumes.

Layout (one chat turn, rendered with the model's own chat template)::

    [head]      template start, system message, user-turn start, case.prefix
    [segment 1] segment text tokenized on its own + delimiter ids
    ...
    [segment n] segment text tokenized on its own + delimiter ids
    [tail]      "Question: {question}", user-turn end, assistant-turn start

Each piece is tokenized separately and the ids are concatenated, so a segment's ids never
depend on its neighbours, its span is exact, and a segment's cached unit (its ids plus the
delimiter) is the same wherever it appears. Truncation, if needed, drops whole trailing segments
and is decided here once, so no arm can truncate differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from kvaudit.core.dataset_format import Case, Segment
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash

DELIMITER = "\n\n"
NEUTRAL_SYSTEM = "You are a helpful assistant."
_SENTINEL = "\u2063KVAUDIT_USER_CONTENT\u2063"


@dataclass
class Prompt:
    ids: list[int]
    head_len: int
    spans: list[tuple[int, int]]  # per kept segment: [start, end) including its delimiter
    segment_ids: list[str]
    segment_hashes: list[str]  # hash of each segment unit's ids (text ids + delimiter ids)
    ids_hash: str
    truncation: dict[str, Any] = field(default_factory=dict)

    @property
    def tail_start(self) -> int:
        return self.spans[-1][1] if self.spans else self.head_len

    def unit_ids(self, i: int) -> list[int]:
        s, e = self.spans[i]
        return self.ids[s:e]


class Tokenizer:
    """Wraps a transformers tokenizer with the template split and per-piece caching."""

    def __init__(self, hf_tokenizer: Any):
        self.tok = hf_tokenizer
        self.delimiter_ids = self.encode(DELIMITER)
        self._template_cache: dict[str, tuple[str, str]] = {}

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def template_parts(self, system: str) -> tuple[str, str]:
        """Chat-template text before and after the user content, for a given system message."""
        if system not in self._template_cache:
            msgs = [{"role": "system", "content": system}, {"role": "user", "content": _SENTINEL}]
            text = self.tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            if text.count(_SENTINEL) != 1:
                raise KvauditError("The model's chat template does not place the user message once.")
            before, after = text.split(_SENTINEL)
            self._template_cache[system] = (before, after)
        return self._template_cache[system]

    def head_ids(self, system: str, prefix: str) -> list[int]:
        before, _ = self.template_parts(system)
        return self.encode(before + prefix)

    def tail_ids(self, system: str, question: str) -> list[int]:
        _, after = self.template_parts(system)
        return self.encode(f"Question: {question}{after}")

    def unit_ids(self, text: str) -> list[int]:
        return _cached_unit(self, text)


@lru_cache(maxsize=100_000)
def _cached_unit(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text) + tok.delimiter_ids


def assemble(case: Case, segments: dict[str, Segment], tok: Tokenizer, max_tokens: int,
             prefix: str | None = None) -> Prompt:
    """Canonical ids for ``case`` (``prefix`` overrides ``case.prefix``, e.g. a leak capture)."""
    head = tok.head_ids(case.system, case.prefix if prefix is None else prefix)
    tail = tok.tail_ids(case.system, case.question)
    units = [tok.unit_ids(segments[sid].text) for sid in case.segment_ids]
    kept = len(units)
    total = len(head) + sum(len(u) for u in units) + len(tail)
    while total > max_tokens and kept > 1:
        kept -= 1
        total -= len(units[kept])
    if total > max_tokens:
        raise KvauditError(
            f"case {case.id!r}: prompt needs {total} tokens even with one document, "
            f"over the limit of {max_tokens}"
        )
    ids = list(head)
    spans = []
    for u in units[:kept]:
        spans.append((len(ids), len(ids) + len(u)))
        ids.extend(u)
    ids.extend(tail)
    truncation = {
        "max_tokens": max_tokens,
        "truncated": kept < len(units),
        "dropped_segments": list(case.segment_ids[kept:]),
        "rule": "drop trailing whole segments",
    }
    return Prompt(
        ids=ids,
        head_len=len(head),
        spans=spans,
        segment_ids=list(case.segment_ids[:kept]),
        segment_hashes=[ids_hash(u) for u in units[:kept]],
        ids_hash=ids_hash(ids),
        truncation=truncation,
    )


def shortest_prompt_tokens(case: Case, segments: dict[str, Segment], tok: Tokenizer,
                           prefix: str | None = None) -> int:
    """Tokens of the shortest prompt :func:`assemble` can make for ``case``: its head, its first
    document (truncation keeps at least one) and its tail. Over the model's limit, no prompt of
    the case fits: tokenization only, so a run can find such cases before it starts."""
    head = tok.head_ids(case.system, case.prefix if prefix is None else prefix)
    first = tok.unit_ids(segments[case.segment_ids[0]].text) if case.segment_ids else []
    return len(head) + len(first) + len(tok.tail_ids(case.system, case.question))


def full_prompt_tokens(case: Case, segments: dict[str, Segment], tok: Tokenizer) -> int:
    """Tokens of ``case``'s prompt with every document (what :func:`assemble` makes when nothing
    has to be dropped): tokenization only."""
    units = sum(len(tok.unit_ids(segments[sid].text)) for sid in case.segment_ids)
    return len(tok.head_ids(case.system, case.prefix)) + units + len(tok.tail_ids(case.system, case.question))


def neutral_head_ids(tok: Tokenizer) -> list[int]:
    """The fixed head every neutral warm-up puts before a segment."""
    return tok.head_ids(NEUTRAL_SYSTEM, "")
