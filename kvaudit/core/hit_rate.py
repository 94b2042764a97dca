"""THE token hit rate of kvaudit, shared by the simulator, the runner and the report.

Definition::

    token hit rate = (sum over requests of hit tokens) / (sum over requests of prompt tokens)

A request's *hit tokens* are the prompt tokens whose KV the request loaded from a cache instead
of prefilling them in its own forward. The simulator counts a hit only when the cache held the
KV when the request arrived: tokens that a warm-up forward computed *because* this request missed
are misses (counted as ``warmup_tokens``). The rate is token-weighted over the whole set of
requests: it is not a mean of per-request ratios, so long prompts weigh more, exactly as they do
in prefill time.

A run directory records the same quantities per case: ``ArmResult.cache_hit_tokens`` (reused
tokens whose KV was already in the run's segment cache when the case arrived: hit tokens) and
``PairRecord.n_prompt_tokens``; :func:`run_hit_rate` turns them into this rate so simulated and
measured rates can sit side by side in one report. ``ArmResult.tokens_reused`` also counts the
segments warmed up for the case itself; :func:`run_segment_hit_rate` uses it for the
chunk-aligned rate (segment tokens loaded from the store / segment tokens), which shows
segments silently recomputed. Both default to the arm under test (:data:`UNDER_TEST_ARM`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from kvaudit.core.arms import UNDER_TEST_ARM

DEFINITION = ("token hit rate = sum of hit tokens / sum of prompt tokens over all requests; "
              "a hit token's KV was in the cache when the request arrived")


@dataclass(frozen=True)
class HitRate:
    hit_tokens: int
    prompt_tokens: int
    requests: int

    @property
    def rate(self) -> float | None:
        """The token hit rate, or None when there were no prompt tokens."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_dict(self) -> dict:
        return {"token_hit_rate": self.rate, "hit_tokens": self.hit_tokens,
                "prompt_tokens": self.prompt_tokens, "requests": self.requests}


def token_hit_rate(hit_tokens: Iterable[int] | np.ndarray, prompt_tokens: Iterable[int] | np.ndarray) -> HitRate:
    """Aggregate per-request hit and prompt token counts into the token hit rate."""
    hits = np.asarray(hit_tokens if isinstance(hit_tokens, np.ndarray) else list(hit_tokens), np.int64)
    prompt = np.asarray(prompt_tokens if isinstance(prompt_tokens, np.ndarray) else list(prompt_tokens),
                        np.int64)
    if hits.shape != prompt.shape:
        raise ValueError(f"{hits.shape[0]} hit counts for {prompt.shape[0]} requests")
    if np.any(hits > prompt) or np.any(hits < 0):
        raise ValueError("hit tokens must lie between 0 and the request's prompt tokens")
    return HitRate(int(hits.sum()), int(prompt.sum()), int(len(prompt)))


def windowed(hits: np.ndarray, prompt: np.ndarray, n_windows: int) -> list[dict]:
    """The token hit rate over consecutive windows of requests (hit rate over time)."""
    n = len(prompt)
    edges = np.unique(np.linspace(0, n, min(n_windows, n) + 1).round().astype(np.int64))
    out = []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        hr = token_hit_rate(hits[a:b], prompt[a:b])
        out.append({"start": int(a), "end": int(b), "token_hit_rate": hr.rate})
    return out


def run_hit_rate(pairs: Iterable, arm: str = UNDER_TEST_ARM) -> HitRate:
    """The token hit rate of one arm of a run (``kvaudit.core.run_format.PairRecord`` list).

    Hits are ``ArmResult.cache_hit_tokens``: reused tokens whose KV was already in the run's
    segment cache when the case arrived, the simulator's definition, so the two compare. An
    engine prefix-cache arm reports its cached tokens there (fewer than the prompt's).

    Raises ``ValueError`` naming the case and the field when a record claims more hits than its
    prompt has tokens, or fewer than 0: a corrupt count is an error, never clamped into a rate.
    """
    hits, prompt = [], []
    for p in pairs:
        if arm in p.arms:
            h, n = int(p.arms[arm].cache_hit_tokens), int(p.n_prompt_tokens)
            if not 0 <= h <= n:
                raise ValueError(f"case {getattr(p, 'case_id', '?')!r}: cache_hit_tokens {h} "
                                 f"outside 0..n_prompt_tokens ({n})")
            hits.append(h)
            prompt.append(n)
    return token_hit_rate(np.array(hits, np.int64), np.array(prompt, np.int64))


def run_segment_hit_rate(pairs: Iterable, arm: str = UNDER_TEST_ARM) -> HitRate:
    """Chunk-aligned hit rate: tokens loaded from the segment store / tokens inside segments.

    A working reuse arm loads every segment, so this is 1.0; anything lower means segments were
    silently recomputed (the "prompt tokens" of the returned HitRate are segment tokens here).
    Not defined for an engine prefix-cache arm, whose cached prefix also covers the template
    head and can exceed the segment tokens (the report does not ask for it).

    Raises ``ValueError`` naming the case and the field when a record claims more reused tokens
    than its segments hold, or fewer than 0.
    """
    hits, seg = [], []
    for p in pairs:
        if arm in p.arms:
            n = sum(int(e) - int(s) for s, e in p.segment_spans)
            h = int(p.arms[arm].tokens_reused)
            if not 0 <= h <= n:
                raise ValueError(f"case {getattr(p, 'case_id', '?')!r}: tokens_reused {h} "
                                 f"outside 0..segment tokens ({n})")
            hits.append(h)
            seg.append(n)
    return token_hit_rate(np.array(hits, np.int64), np.array(seg, np.int64))
