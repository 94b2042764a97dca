"""The segment store's plan for one request at its admission, shared by the live server
(:mod:`kvaudit.runners.engines.vllm.live`) and the simulator's engine-order model
(:mod:`kvaudit.simulator.segment_cache`), so the two cannot drift apart.

In prompt order, each of the request's entries is waited for (another request is warming it),
pinned (the store holds it) or warmed by the request (it is missing). A pin of an entry that no
request pins yet and each warm-up take its tokens from ``room`` (the budget less what is pinned
and being warmed); a pin of an entry already pinned takes nothing. At the first entry without
room the plan stops: that entry and the rest are the request's own prefill, so no warm-up is
built only for the store to refuse it and no entry is pinned that will not be loaded.
"""

from __future__ import annotations

from collections.abc import Container, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class StorePlan(Generic[K]):
    """What a request does with each entry, in prompt order, up to where the plan stopped."""

    wait: list[K] = field(default_factory=list)
    pin: list[K] = field(default_factory=list)
    warm: list[K] = field(default_factory=list)


def plan_store_load(entries: Iterable[tuple[K, int]], room: int, *, warming: Container[K],
                    held: Container[K], pinned: Container[K]) -> StorePlan[K]:
    """The plan for ``entries`` (each entry once, with its tokens, in prompt order) given the
    store's ``room`` in tokens, the entries other requests are ``warming``, those the store
    ``held`` and those ``pinned`` by requests in flight."""
    plan: StorePlan[K] = StorePlan()
    for k, tokens in entries:
        if k in warming:  # another request is warming it: wait, do not build it twice
            plan.wait.append(k)
            continue
        need = 0 if k in held and k in pinned else tokens
        if need > room:
            break
        room -= need
        (plan.pin if k in held else plan.warm).append(k)
    return plan
