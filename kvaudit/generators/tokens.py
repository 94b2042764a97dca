"""Counting prompt sizes: whitespace words, or the SmolLM2 tokenizer's ids (``--tokenizer``)."""

from __future__ import annotations

from collections.abc import Callable

from kvaudit.core.errors import KvauditError

TokenCounter = Callable[[str], int]


def count_words(text: str) -> int:
    """Whitespace-separated words: the unit of ``--tokenizer none`` and of chunk sizes."""
    return len(text.split())


def make_token_counter(name: str) -> TokenCounter | None:
    """``none`` -> None (whitespace words); ``smollm2`` -> the model tokenizer's id count."""
    if name == "none":
        return None
    if name != "smollm2":
        raise KvauditError(f"--tokenizer must be none or smollm2, got {name!r}")
    from kvaudit.models import load_tokenizer  # here, not at the top: --tokenizer none stays light

    tok = load_tokenizer("smollm2")
    cache: dict[str, int] = {}

    def count(text: str) -> int:
        n = cache.get(text)
        if n is None:
            n = cache[text] = len(tok(text, add_special_tokens=False).input_ids)
        return n

    return count
