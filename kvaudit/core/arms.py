"""The arms: data describing where each arm's segment KV comes from, not branches in a loop.

``source`` is where segment KV comes from (``None``: one full prefill of every token;
``"engine_prefix"``: the serving engine's own exact prefix cache); ``rerotate`` says whether
cached keys are moved to their new positions; ``backends`` limits an arm to the backends that
can run it.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.core.errors import KvauditError


@dataclass(frozen=True)
class ArmSpec:
    name: str
    source: str | None  # None | "neutral" | "in_context" | "first_user" | "engine_prefix"
    rerotate: bool = True
    leak_only: bool = False  # run only on cases that carry a canary
    why: str = ""
    backends: tuple[str, ...] | None = None  # None: every backend
    requires: tuple[str, ...] = ()  # arms that must run before this one in the same case


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
        ArmSpec("prefix_cache_cold", "engine_prefix", backends=("vllm",),
                why="vLLM's automatic prefix caching on one cache shared by the whole run, the first time "
                    "this prompt arrives: its cached tokens are what exact prefix reuse finds on this workload"),
        ArmSpec("prefix_cache", "engine_prefix", backends=("vllm",), requires=("prefix_cache_cold",),
                why="the same prompt again right after prefix_cache_cold, warm: exact KV for all but the last "
                    "block; answers that differ from the cold run are the prefix cache's own nondeterminism"),
    )
}
DEFAULT_ARMS = ("recompute", "reuse", "identity")
# recompute first, recompute_again last: the noise floor sees a different position in the sequence.
CANONICAL_ORDER = ("recompute", "reuse", "identity", "reuse_norope", "reuse_first_user",
                   "prefix_cache_cold", "prefix_cache", "recompute_again")


def parse_arms(text: str, backend: str | None = None) -> list[str]:
    """Parse ``--arms a,b,c`` for ``backend``; adds ``recompute`` and the arms the chosen ones
    require, and returns the canonical order."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise KvauditError(f"--arms: unknown arm {unknown[0]!r}; known arms: {', '.join(ARMS)}")
    chosen = set(names) | {"recompute"}
    chosen |= {r for a in list(chosen) for r in ARMS[a].requires}
    if backend is not None:
        check_backend(chosen, backend)
    return [a for a in CANONICAL_ORDER if a in chosen]


def check_backend(arms: set[str] | list[str], backend: str) -> None:
    """Refuse arms the backend cannot run, naming the backend that can."""
    for a in arms:
        spec = ARMS[a]
        if spec.backends is not None and backend not in spec.backends:
            raise KvauditError(f"--arms: arm {a!r} needs --backend {' or '.join(spec.backends)} "
                               f"(it measures that engine's own cache), not {backend}")
