"""The arm registry: data describing each arm, so that no other module names an arm.

``role`` says what an arm is for (:data:`ROLES`); code that needs "the reference" or "the noise
floor" asks for the role (:func:`arm_for`, or the constants below), never for a name.
``source`` is where segment KV comes from (``None``: one full prefill of every token;
``"engine_prefix"``: the serving engine's own exact prefix cache); ``rerotate`` says whether
cached keys are moved to their new positions; ``backends`` limits an arm to the backends that
can run it; ``scores_candidates`` marks the arms whose leak-probe candidates are scored;
``requires`` names arms that must run before it in the same case.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvaudit.core.errors import KvauditError

ROLES = {
    "reference": "one full prefill of the same ids: what every other arm is compared with",
    "under_test": "the reuse policy a deployment would run",
    "identity_control": "the reuse code path on KV built in true context: must equal the reference",
    "position_control": "reuse without re-rotation: isolates the position error",
    "noise_floor": "the reference again, elsewhere in the batch order: what nondeterminism alone does",
    "leak_capture": "an unsafe capture policy, for leak probes only",
    "engine_prefix": "the serving engine's own exact prefix cache, first arrival",
    "engine_prefix_warm": "the engine's prefix cache again, warm",
}


@dataclass(frozen=True)
class ArmSpec:
    name: str
    source: str | None  # None | "neutral" | "in_context" | "first_user" | "engine_prefix"
    role: str = ""
    scores_candidates: bool = False  # leak probes: candidate names are scored under this arm
    rerotate: bool = True
    leak_only: bool = False  # run only on cases that carry a canary
    why: str = ""
    backends: tuple[str, ...] | None = None  # None: every backend
    requires: tuple[str, ...] = ()  # arms that must run before this one in the same case


ARMS: dict[str, ArmSpec] = {
    a.name: a
    for a in (
        ArmSpec("recompute", None, role="reference", scores_candidates=True, why="the reference: one full prefill of the same ids"),
        ArmSpec("reuse", "neutral", role="under_test", scores_candidates=True, why="segment KV from neutral warm-up, keys re-rotated (the policy under test)"),
        ArmSpec("identity", "in_context", role="identity_control",
                why="segment KV built in its true context and position, then put through the reuse path: "
                    "must equal recompute, proving the reuse code"),
        ArmSpec("reuse_norope", "neutral", role="position_control", rerotate=False,
                why="reuse without re-rotation: isolates the position error"),
        ArmSpec("recompute_again", None, role="noise_floor", why="a second independent recompute: the noise floor"),
        ArmSpec("reuse_first_user", "first_user", role="leak_capture", scores_candidates=True, leak_only=True,
                why="segment KV captured from the first user request (unsafe policy), for leak probes"),
        ArmSpec("prefix_cache_cold", "engine_prefix", role="engine_prefix", backends=("vllm",),
                why="vLLM's automatic prefix caching on one cache shared by the whole run, the first time "
                    "this prompt arrives: its cached tokens are what exact prefix reuse finds on this workload"),
        ArmSpec("prefix_cache", "engine_prefix", role="engine_prefix_warm", backends=("vllm",),
                requires=("prefix_cache_cold",),
                why="the same prompt again right after prefix_cache_cold, warm: exact KV for all but the last "
                    "block; answers that differ from the cold run are the prefix cache's own nondeterminism"),
    )
}


def arm_for(role: str) -> str:
    """The name of the one arm with ``role``."""
    if role not in ROLES:
        raise KeyError(f"unknown arm role {role!r}")
    (name,) = [a.name for a in ARMS.values() if a.role == role]
    return name


def arms_where(**flags: object) -> tuple[str, ...]:
    """Arms whose spec fields equal ``flags`` (e.g. ``scores_candidates=True``), registry order."""
    return tuple(a.name for a in ARMS.values() if all(getattr(a, k) == v for k, v in flags.items()))


REFERENCE_ARM = arm_for("reference")
UNDER_TEST_ARM = arm_for("under_test")  # the default arm a policy judges
IDENTITY_ARM = arm_for("identity_control")
NOISE_ARM = arm_for("noise_floor")
LEAK_CAPTURE_ARM = arm_for("leak_capture")
DEFAULT_ARMS = (REFERENCE_ARM, UNDER_TEST_ARM, IDENTITY_ARM)
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
    chosen = set(names) | {REFERENCE_ARM}
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
