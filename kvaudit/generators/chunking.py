"""Cutting documents into segments by one recorded rule, so the same text gives the same chunks.

``paragraph`` splits at blank lines and merges consecutive paragraphs while the chunk stays within
``max_words`` (a longer paragraph is cut into word windows); ``words`` cuts fixed windows.
:func:`chunk_corpus` applies the rule to a whole corpus, refusing or counting too-long documents
and counting short and duplicate chunks.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from kvaudit.core.errors import KvauditError
from kvaudit.core.progress import progress_bar
from kvaudit.generators.corpus_files import SourceDoc
from kvaudit.generators.tokens import TokenCounter, count_words

CHUNK_RULES = ("paragraph", "words")
_PARA_SPLIT = re.compile(r"\n\s*\n")


def _windows(words: list[str], size: int) -> list[str]:
    return [" ".join(words[i:i + size]) for i in range(0, len(words), size)]


def chunk_text(text: str, rule: str = "paragraph", max_words: int = 120) -> list[str]:
    """Split a document into chunks by ``rule`` (see :func:`chunk_rule`)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if rule == "words":
        return _windows(text.split(), max_words)
    if rule != "paragraph":
        raise KvauditError(f"unknown chunk rule {rule!r} (use {', '.join(CHUNK_RULES)})")
    pieces: list[str] = []
    for para in _PARA_SPLIT.split(text):
        para = para.strip()
        if not para:
            continue
        words = para.split()
        pieces.extend(_windows(words, max_words) if len(words) > max_words else [para])
    chunks: list[str] = []
    size = 0
    for piece in pieces:
        n = count_words(piece)
        if chunks and size + n <= max_words:
            chunks[-1] += "\n\n" + piece
            size += n
        else:
            chunks.append(piece)
            size = n
    return chunks


def chunk_rule(rule: str, max_words: int, min_words: int) -> dict[str, Any]:
    """The chunking rule as recorded in ``dataset.json``."""
    desc = {
        "paragraph": "split at blank lines; merge consecutive paragraphs while the chunk stays "
                     "within max_words; a longer paragraph is cut into max_words word windows "
                     "(joined by single spaces)",
        "words": "consecutive windows of max_words whitespace-separated words, joined by single spaces",
    }[rule]
    return {"rule": rule, "max_words": max_words, "min_words": min_words, "description": desc,
            "unit": "whitespace words (independent of --tokenizer)"}



def chunk_corpus(docs: list[SourceDoc], *, rule: str, max_words: int, min_words: int,
                 max_doc_tokens: int, on_long: str, count_tokens: TokenCounter | None,
                 skipped: Counter, progress: bool = False) -> tuple[list[str], list[str], int]:
    """Distinct chunks, their source ids, and how many documents were used.

    A document over ``max_doc_tokens`` (counted by ``count_tokens``, else in words) is an error
    naming it (or skipped and counted with ``on_long="skip"``); short and duplicate chunks are counted in ``skipped``.
    """
    count = count_tokens or count_words
    unit = "tokens" if count_tokens else "words"
    chunks: list[str] = []
    sources: list[str] = []
    seen: set[str] = set()
    used = 0
    for d in progress_bar(docs, desc="chunking documents", unit="doc", enabled=progress):
        n = count(d.text)
        if n > max_doc_tokens:
            if on_long == "error":
                raise KvauditError(f"{d.source}: document has {n} {unit}, over --max-doc-tokens "
                                   f"{max_doc_tokens} (raise it, or pass --on-long skip)")
            skipped["too_long_documents"] += 1
            continue
        used += 1
        for c in chunk_text(d.text, rule, max_words):
            if count_words(c) < min_words:
                skipped["short_chunks"] += 1
            elif c in seen:
                skipped["duplicate_chunks"] += 1
            else:
                seen.add(c)
                chunks.append(c)
                sources.append(d.source)
    return chunks, sources, used
