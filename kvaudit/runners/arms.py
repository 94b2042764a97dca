"""The arms: data describing where each arm's segment KV comes from, not branches in a loop.

``source`` is where segment KV comes from (``None``: one full prefill of every token);
``rerotate`` says whether cached keys are moved to their new positions.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.errors import KvauditError


@dataclass(frozen=True)
class ArmSpec:
    name: str
    source: str | None  # None | "neutral" | "in_context" | "first_user"
    rerotate: bool = True
    leak_only: bool = False  # run only on cases that carry a canary
    why: str = ""


ARMS: dict[str, ArmSpec] = {
    a.name: a
    for a in (
        ArmSpec("recompute", None, why="the reference: one full prefill of the same ids"),
        ArmSpec("reuse", "neutral", why="segment KV from neutral warm-up, keys re-rotated (the policy under test)"),
        ArmSpec("identity", "in_context",
                why="segment KV built in its true context and position, then put through the reuse path: "
                    "must equal recompute, proving the reuse code"),
        ArmSpec("reuse_norope", "neutral", rerotate=False,
                why="reuse without re-rotation: isolates the position error"),
        ArmSpec("recompute_again", None, why="a second independent recompute: the noise floor"),
        ArmSpec("reuse_first_user", "first_user", leak_only=True,
                why="segment KV captured from the first user request (unsafe policy), for leak probes"),
    )
}
DEFAULT_ARMS = ("recompute", "reuse", "identity")
# recompute first, recompute_again last: the noise floor sees a different position in the sequence.
CANONICAL_ORDER = ("recompute", "reuse", "identity", "reuse_norope", "reuse_first_user", "recompute_again")


def parse_arms(text: str) -> list[str]:
    """Parse ``--arms a,b,c``; always includes ``recompute`` and returns the canonical order."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise KvauditError(f"--arms: unknown arm {unknown[0]!r}; known arms: {', '.join(ARMS)}")
    chosen = set(names) | {"recompute"}
    return [a for a in CANONICAL_ORDER if a in chosen]
