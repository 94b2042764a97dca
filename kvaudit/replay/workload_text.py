"""A workload's requests as prompts: each piece's text, then one :class:`Case` per request.

A workload line names its pieces by content id and token count (docs/simulator.md). An imported
log kept with ``--keep-text`` carries each piece's ``text``; that text is served as is. A
generated workload has no text: each content id gets deterministic synthetic text with exactly the
piece's token count under the model's tokenizer (same id, same text, same tokens), made of words
that are one token each with their leading space, so a piece tokenized on its own (as
:func:`kvaudit.runners.prompt.assemble` tokenizes it) has exactly that many tokens.

A request becomes a :class:`Case`: its prefix pieces are the case's prefix (the user turn's start,
after the chat template's head; ended with a newline, as a dataset's prefix is), its documents the case's segments, its question pieces the
question; the prompt is assembled exactly as ``kvaudit run`` assembles it.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.dataset_format import Case, Segment
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import iter_jsonl
from kvaudit.core.trace import read_trace

_WORD = re.compile(r" [a-z]{3,9}")


@dataclass(frozen=True)
class Piece:
    kind: str
    id: str
    tokens: int
    text: str | None = None


@dataclass(frozen=True)
class WorkloadRequest:
    index: int
    id: str
    timestamp: float | None
    pieces: tuple[Piece, ...]


def longest_request_tokens(requests: list[WorkloadRequest]) -> int:
    """The most tokens a request of the workload may take as a prompt: its pieces, a delimiter per
    piece, and 64 for the chat template around them. ``kvaudit replay`` and the GPU benchmark size
    the engine's context and KV space by this."""
    return max(sum(p.tokens + 1 for p in r.pieces) for r in requests) + 64


def read_workload(path: str | Path) -> list[WorkloadRequest]:
    """The workload's requests in file order. The file is validated by the simulator's reader first
    (:func:`kvaudit.core.trace.read_trace`: errors name the file, line and field); a piece's
    ``text``, where present, must be a string."""
    path = Path(path)
    read_trace(path)
    out = []
    for n, obj in iter_jsonl(path):
        pieces = []
        for j, p in enumerate(obj["pieces"]):
            text = p.get("text")
            if text is not None and not isinstance(text, str):
                raise DatasetError(f"{path}, line {n}: field 'pieces[{j}].text' must be a string")
            pieces.append(Piece(p["kind"], str(p["id"]), int(p["tokens"]), text))
        ts = obj.get("timestamp")
        ts = float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and ts == ts else None
        out.append(WorkloadRequest(len(out), str(obj.get("id", f"r{len(out)}")), ts, tuple(pieces)))
    return out


class SyntheticText:
    """Deterministic text of an exact token count per content id, for one tokenizer."""

    def __init__(self, hf_tokenizer: Any, n_words: int = 4096) -> None:
        self.tok = hf_tokenizer
        vocab = hf_tokenizer.get_vocab()
        words: list[str] = []
        for token_id in sorted(vocab.values()):
            text = hf_tokenizer.decode([token_id])
            if _WORD.fullmatch(text) and self._encode(text) == [token_id]:
                words.append(text)
                if len(words) >= n_words:
                    break
        if len(words) < 256:
            raise KvauditError("the tokenizer has too few single-token words for synthetic workload text "
                               f"({len(words)}); replay a workload that carries its text (--keep-text)")
        self.words = words

    def _encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def text(self, content_id: str, n_tokens: int) -> str:
        seed = int.from_bytes(hashlib.sha256(content_id.encode("utf-8")).digest()[:8], "big")
        rng = random.Random(seed)
        text = "".join(rng.choice(self.words) for _ in range(n_tokens))
        got = len(self._encode(text))
        if got != n_tokens:  # a tokenizer that merges across spaces: say so rather than serve other counts
            raise KvauditError(f"synthetic text for {content_id!r}: {got} tokens, wanted {n_tokens}; this "
                               "tokenizer does not keep space-separated words apart")
        return text


def request_cases(requests: list[WorkloadRequest], synth: SyntheticText | None) -> Iterator[tuple[Case, dict[str, Segment]]]:
    """One case per request, with the segments it needs (texts made once per content id)."""
    texts: dict[str, str] = {}

    def text_of(p: Piece) -> str:
        if p.text is not None:
            return p.text
        if synth is None:
            raise KvauditError(f"piece {p.id!r} carries no text and no tokenizer was given to make it")
        if p.id not in texts:
            texts[p.id] = synth.text(p.id, p.tokens)
        return texts[p.id]

    for r in requests:
        prefix = "".join(text_of(p) for p in r.pieces if p.kind == "prefix")
        if prefix and not prefix.endswith("\n"):
            prefix += "\n"  # a case's prefix is whole lines (the dataset format's rule)
        docs = [p for p in r.pieces if p.kind == "document"]
        question = "".join(text_of(p) for p in r.pieces if p.kind == "question").strip() or "?"
        segments = {p.id: Segment(id=p.id, text=text_of(p)) for p in docs}
        case = Case(id=r.id, task="replay", segment_ids=[p.id for p in docs], question=question,
                    answers=[""], prefix=prefix)
        yield case, segments
