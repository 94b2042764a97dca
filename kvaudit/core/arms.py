"""The arm registry: data describing each arm, so that no other module names an arm.

``role`` says what an arm is for (:data:`ROLES`); code that needs "the reference" or "the noise
floor" asks for the role (:func:`arm_for`, or the constants below), never for a name.
``source`` is where segment KV comes from (``None``: one full prefill of every token;
``"engine_prefix"``: the serving engine's own exact prefix cache); ``rerotate`` says whether
cached keys are moved to their new positions; ``portable`` is false for an arm only some engines
can run (an engine's own cache, or a repair implemented in one backend): each backend declares
those it runs in :mod:`kvaudit.runners.registry`, and an arm says nothing about backends;
``scores_candidates`` marks the arms whose leak-probe candidates are scored;
``requires`` names arms that must run before it in the same case.

**Parameterised arms.** The repairs of naive reuse are families with a parameter, resolved by
:func:`get_arm` rather than listed: ``blend@R`` (CacheBlend-style: recompute the share ``R`` in
[0, 1] of segment tokens whose KV deviates most from in-context KV at layer
:data:`BLEND_SELECT_LAYER`) and ``epic@K`` (EPIC-style: recompute the first ``K`` >= 0 tokens of
every segment). Both start from the same ids and the same neutral segment KV as ``reuse``
(``repair`` names the family, ``param`` its parameter); ``blend@0``/``epic@0`` must equal
``reuse`` exactly and ``blend@1``/``epic@K`` over whole segments must equal the reference (the
audit's repair controls). ``prompt`` says which prompt an arm consumes: ``"case"`` (the case's
ids, every arm but the oracle pair) or ``"evidence"`` (the ``oracle`` pair: only the case's
evidence segments, :func:`evidence_only`); ``reference`` is the arm it is compared with (the
oracle's own recompute, since it changes the prompt). Every lookup by name outside this module
goes through :func:`get_arm`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from kvaudit.core.errors import KvauditError
from kvaudit.core.vocabulary import ArmRole, ArmSource

ROLES = {
    "reference": "one full prefill of the same ids: what every other arm is compared with",
    "under_test": "the reuse policy a deployment would run",
    "identity_control": "the reuse code path on KV built in true context: must equal the reference",
    "position_control": "reuse without re-rotation: isolates the position error",
    "noise_floor": "the reference again, elsewhere in the batch order: what nondeterminism alone does",
    "leak_capture": "an unsafe capture policy, for leak probes only",
    "engine_prefix": "the serving engine's own exact prefix cache, first arrival",
    "engine_prefix_warm": "the engine's prefix cache again, warm",
    "engine_prefix_flushed": "the engine's prefix cache after a reset, cold again: the engine's own nondeterminism",
    "tenant_probe": "the prompt under another tenant's cache salt: must find nothing cached",
    "segment_tenant_probe": "the case under another tenant's salt after reuse's warm-ups: must reuse nothing",
    "repair": "a repair of naive reuse (selective recompute from the same neutral segment KV)",
    "oracle_reference": "the reference on the evidence-only prompt: what the oracle is compared with",
    "oracle": "reuse on the evidence-only prompt: splits reuse's loss into distractors and missing "
              "cross-attention",
    "candidate": "the candidate engine configuration (a serving change): one full prefill of the same ids there",
    "candidate_noise_floor": "the candidate again, elsewhere in the batch order: the candidate's own A/A noise",
    "candidate_control": "the candidate engine with the change switched off: must equal the reference",
}
# Arms that must compute every prompt token: a server run must show them nothing cached.
FRESH_ROLES = ("reference", "noise_floor", "candidate", "candidate_noise_floor", "candidate_control")
# The engines of a serving-change run (docs/serving-changes.md): every other arm runs on the baseline.
ENGINES = ("baseline", "candidate", "candidate_off")
REPAIRS = ("blend", "epic")  # parameterised families (get_arm)
BLEND_SELECT_LAYER = 1  # blend@R measures KV deviation at this layer (0-based; layer 0 cannot deviate)
PROMPTS = ("case", "evidence")


@dataclass(frozen=True)
class ArmSpec:
    name: str
    source: ArmSource | None  # None: the arm computes every token itself
    role: ArmRole  # every arm says what it is for (ROLES)
    scores_candidates: bool = False  # leak probes: candidate names are scored under this arm
    rerotate: bool = True
    leak_only: bool = False  # run only on cases that carry a canary
    perturbs_batch: bool = False  # run beside a filler request, so the batch differs from the reference's
    why: str = ""
    portable: bool = True  # False: only the backends that declare it run it (kvaudit.runners.registry)
    requires: tuple[str, ...] = ()  # arms that must run before this one in the same case
    repair: str | None = None  # "blend" | "epic": a parameterised repair of reuse (get_arm)
    param: float | None = None  # blend: share of segment tokens recomputed; epic: tokens per segment
    prompt: str = "case"  # "case" | "evidence" (the oracle pair: evidence segments only)
    # Resets the engine's whole cache: in a group of cases run together it goes after the group's
    # other arms, or its reset for one case would wipe what a later arm of another case relies on.
    resets_engine_cache: bool = False
    reference: str = ""  # the arm this one is compared with ("": the reference arm)
    # A serving-change arm runs on another engine (ENGINES) exactly as the arm ``runs_as`` runs on
    # the baseline: the same request path, another engine configuration.
    engine: str = "baseline"
    runs_as: str = ""

    @property
    def loads_segment_kv(self) -> bool:
        """The arm serves segment KV that kvaudit keeps (a warm-up's, a capture's): not a full prefill,
        not the engine's own prefix cache."""
        return self.source not in (None, "engine_prefix")

    @property
    def compared_with(self) -> str:
        """The arm this arm's deltas, flips and logit differences are taken against."""
        return self.reference or REFERENCE_ARM


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
        ArmSpec("recompute_again", None, role="noise_floor", perturbs_batch=True, why="a second independent recompute: the noise floor"),
        ArmSpec("reuse_first_user", "first_user", role="leak_capture", scores_candidates=True, leak_only=True,
                why="segment KV captured from the first user request (unsafe policy), for leak probes"),
        ArmSpec("prefix_cache_cold", "engine_prefix", role="engine_prefix", portable=False,
                why="the serving engine's own exact prefix cache, one cache shared by the whole run, the first time "
                    "this prompt arrives: its cached tokens are what exact prefix reuse finds on this workload"),
        ArmSpec("prefix_cache_flushed", "engine_prefix", role="engine_prefix_flushed", portable=False,
                requires=("prefix_cache_cold",), resets_engine_cache=True,
                why="the same prompt after the server's prefix-cache reset (cold again): an answer that differs "
                    "from prefix_cache_cold is the engine's own nondeterminism, not the cache"),
        ArmSpec("prefix_cache", "engine_prefix", role="engine_prefix_warm", portable=False,
                requires=("prefix_cache_cold",),
                why="the same prompt again right after prefix_cache_cold, warm: exact KV for all but the last "
                    "block; answers that differ from the cold run are the prefix cache's own nondeterminism"),
        ArmSpec("prefix_cache_other_tenant", None, role="tenant_probe", portable=False,
                requires=("prefix_cache",),
                why="the same prompt right after the warm prefix_cache request, under another tenant's cache "
                    "salt: it must find nothing cached (tenant isolation), and its time to first token is "
                    "the miss against which the warm request's hit is timed (the timing side channel)"),
        ArmSpec("reuse_other_tenant", None, role="segment_tenant_probe", portable=False,
                requires=("reuse",),
                why="the case right after the reuse arm's warm-ups, under another tenant's cache salt: it must "
                    "reuse none of the warmed segments (tenant isolation of segment reuse)"),
        ArmSpec("oracle_recompute", None, role="oracle_reference", prompt="evidence",
                why="a full prefill of the evidence-only prompt (the case's distractor segments left out): "
                    "the oracle's reference; against recompute it shows what the distractors do to the model itself"),
        ArmSpec("oracle", "neutral", role="oracle", prompt="evidence", reference="oracle_recompute",
                requires=("oracle_recompute",),
                why="reuse on the evidence-only prompt, compared only with oracle_recompute (it changes the "
                    "prompt): the loss left without distractors is missing cross-attention between the "
                    "evidence segments; the rest of reuse's loss comes with the distractors"),
        ArmSpec("candidate", None, role="candidate", scores_candidates=True, engine="candidate",
                runs_as="recompute",
                why="the candidate engine configuration (kvaudit run --engines): one full prefill of the same "
                    "ids on the engine with the change, compared with the baseline's recompute"),
        ArmSpec("candidate_off", None, role="candidate_control", engine="candidate_off", runs_as="recompute",
                why="the candidate's engine with the declared change set back to the baseline's values: must "
                    "equal recompute, proving the second engine (or version) itself changes nothing"),
        ArmSpec("candidate_again", None, role="candidate_noise_floor", perturbs_batch=True, engine="candidate",
                runs_as="recompute_again", reference="candidate", requires=("candidate",),
                why="the candidate again, elsewhere in the batch order, compared with candidate: the change's own "
                    "A/A noise floor (a nondeterministic change such as speculative decoding needs its own)"),
    )
}


_PARAM = re.compile(r"^(blend|epic)@(.+)$")


def _repair_spec(family: str, raw: str, name: str) -> ArmSpec:
    if family == "blend":
        try:
            share = float(raw)
        except ValueError:
            share = math.nan
        if not (math.isfinite(share) and 0.0 <= share <= 1.0):
            raise KvauditError(f"arm {name!r}: blend@R needs a share R in [0, 1] (e.g. blend@0.15)")
        canonical = f"blend@{share:g}"
        what = (" (control: must equal reuse exactly)" if share == 0 else
                " (control: must equal recompute)" if share == 1 else "")
        why = (f"CacheBlend-style selective recompute: KV computed in context for the first "
               f"{BLEND_SELECT_LAYER + 1} layers is compared with the reused KV, and the {share:.0%} of "
               f"segment tokens that deviate most at layer {BLEND_SELECT_LAYER} are recomputed in every "
               f"layer; the rest is reused{what}")
        return ArmSpec(canonical, "neutral", role="repair", repair="blend", param=share,
                       portable=False, why=why)
    if not raw.isdigit():
        raise KvauditError(f"arm {name!r}: epic@K needs a whole number of tokens K >= 0 (e.g. epic@16)")
    k = int(raw)
    what = (" (control: must equal reuse exactly)" if k == 0 else
            "; over whole segments it is a control that must equal recompute")
    why = (f"EPIC-style: the first {k} tokens of every segment recomputed in context (every layer), "
           f"the rest reused{what}")
    return ArmSpec(f"epic@{k}", "neutral", role="repair", repair="epic", param=float(k),
                   portable=False, why=why)


def get_arm(name: str) -> ArmSpec:
    """The spec of arm ``name``: a registry entry or a parameterised repair (``blend@R``,
    ``epic@K``); a :class:`KvauditError` naming the known arms for anything else."""
    spec = ARMS.get(name)
    if spec is not None:
        return spec
    m = _PARAM.match(name) if isinstance(name, str) else None
    if m is None:
        raise KvauditError(f"unknown arm {name!r}; known arms: {', '.join(ARMS)}, "
                           "blend@R (R in [0, 1]) and epic@K (K >= 0 tokens)")
    return _repair_spec(m.group(1), m.group(2), name)


def known_arm(name: str) -> bool:
    """Whether ``name`` is an arm :func:`get_arm` resolves."""
    try:
        get_arm(name)
    except KvauditError:
        return False
    return True


def reference_of(name: str) -> str:
    """The arm ``name`` is compared with (the reference arm for a name that is not an arm)."""
    return get_arm(name).compared_with if known_arm(name) else REFERENCE_ARM


def is_repair(name: str) -> bool:
    return known_arm(name) and get_arm(name).repair is not None


def evidence_only(segment_ids: list[str], evidence: list[str], has_canary: bool) -> list[str]:
    """The segments of the oracle's evidence-only prompt, in prompt order: the case's kept
    segments that are evidence. Empty (the oracle pair does not run) for a leak probe or a case
    naming no kept evidence."""
    if has_canary:
        return []
    ev = set(evidence)
    return [s for s in segment_ids if s in ev]


def repair_count(spec: ArmSpec, spans: list[tuple[int, int]] | list[list[int]]) -> int:
    """How many segment tokens a repair arm recomputes on a prompt with these segment spans (0
    for an arm that is not a repair): ``epic@K`` the first K of each segment, ``blend@R`` the
    share R of all segment tokens, rounded half up."""
    if spec.repair == "epic":
        k = int(spec.param or 0)
        return sum(min(k, int(e) - int(s)) for s, e in spans)
    if spec.repair == "blend":
        n = sum(int(e) - int(s) for s, e in spans)
        return min(n, int(math.floor((spec.param or 0.0) * n + 0.5)))
    return 0


def arm_for(role: str) -> str:
    """The name of the one arm with ``role``."""
    if role not in ROLES:
        raise KeyError(f"unknown arm role {role!r}")
    names = [a.name for a in ARMS.values() if a.role == role]
    if len(names) != 1:
        raise ValueError(f"arm role {role!r} must belong to exactly one arm, not {names}: the code asks "
                         "for an arm by its role (give a new arm a role of its own, with a line in ROLES)")
    return names[0]


def _check_registry() -> None:
    """Every arm's role is described in ROLES and every arm has a place in CANONICAL_ORDER."""
    for a in ARMS.values():
        if a.role not in ROLES:
            raise ValueError(f"arm {a.name!r}: role {a.role!r} has no line in ROLES")
        if a.name not in CANONICAL_ORDER:
            raise ValueError(f"arm {a.name!r} has no place in CANONICAL_ORDER")


def arms_where(**flags: object) -> tuple[str, ...]:
    """Arms whose spec fields equal ``flags`` (e.g. ``scores_candidates=True``), registry order."""
    return tuple(a.name for a in ARMS.values() if all(getattr(a, k) == v for k, v in flags.items()))


REFERENCE_ARM = arm_for("reference")
UNDER_TEST_ARM = arm_for("under_test")  # the default arm a policy judges
IDENTITY_ARM = arm_for("identity_control")
NOISE_ARM = arm_for("noise_floor")
LEAK_CAPTURE_ARM = arm_for("leak_capture")
ORACLE_ARM = arm_for("oracle")
ORACLE_REFERENCE_ARM = arm_for("oracle_reference")
DEFAULT_ARMS = (REFERENCE_ARM, UNDER_TEST_ARM, IDENTITY_ARM)
# recompute first, recompute_again last: the noise floor sees a different position in the sequence.
# Parameterised repairs sort right after reuse (blend by share, then epic by tokens).
CANONICAL_ORDER = ("recompute", "reuse", "reuse_other_tenant", "identity", "reuse_norope", "reuse_first_user",
                   "prefix_cache_cold", "prefix_cache_flushed", "prefix_cache", "prefix_cache_other_tenant",
                   "oracle_recompute", "oracle", "candidate", "candidate_off", "candidate_again",
                   "recompute_again")
_check_registry()
# The arms a routing frontier compares: the policy under test and its repairs.
FRONTIER_ROLES = ("under_test", "repair")
# The roles of the arms a gate policy may judge (its ``arm``): what a deployment would run. Every
# other arm is the reference, a control (equal to the reference by construction, or isolating one
# cause), a probe or a diagnostic: a policy that judged one would pass whatever reuse does.
GATED_ROLES = ("under_test", "repair", "engine_prefix", "engine_prefix_warm", "candidate")
# The arms of a serving-change run (kvaudit run --engines), and its default arm set.
SERVING_CHANGE_ARMS = tuple(a.name for a in ARMS.values() if a.engine != "baseline")
SERVING_CHANGE_DEFAULT_ARMS = ("recompute", "candidate", "candidate_again", "recompute_again")


def is_gated(spec: ArmSpec) -> bool:
    """Whether a gate policy may judge arm ``spec``: its role is in :data:`GATED_ROLES` and its
    parameter does not make it a control (``blend@1`` recomputes every segment token: it equals
    the reference by construction)."""
    return spec.role in GATED_ROLES and not (spec.repair == "blend" and spec.param == 1.0)


def gated_arms() -> list[str]:
    """The arms a gate policy may judge, for messages: the registry's, then the repair families."""
    return [a.name for a in ARMS.values() if is_gated(a)] + ["blend@R (R in [0, 1))", "epic@K (K >= 0)"]
# The repairs' frontier sweep (`kvaudit demo --repairs`, docs/repairs.md): the reference, reuse, its
# controls, both repair families at a few settings with their controls at each end, and the oracle pair.
REPAIR_SWEEP = ("recompute", "reuse", "identity", "recompute_again", "blend@0", "blend@0.15", "blend@0.3",
                "blend@1", "epic@0", "epic@16", "epic@64", "oracle")


def order_key(name: str) -> tuple[float, int, float]:
    """Sort key of the canonical order, parameterised repairs included."""
    spec = get_arm(name)
    if spec.repair is not None:
        return (CANONICAL_ORDER.index(UNDER_TEST_ARM) + 0.5, REPAIRS.index(spec.repair), spec.param or 0.0)
    return (float(CANONICAL_ORDER.index(name)), 0, 0.0)


def parse_arms(text: str) -> list[str]:
    """Parse ``--arms a,b,c``; adds ``recompute`` and the arms the chosen ones require, and
    returns the canonical order. Which backend can run them is the backend registry's to say
    (:func:`kvaudit.runners.registry.arms_for`)."""
    names = [a.strip() for a in text.split(",") if a.strip()]
    try:
        specs = [get_arm(a) for a in names]
    except KvauditError as e:
        raise KvauditError(f"--arms: {e}") from None
    chosen = {s.name for s in specs} | {REFERENCE_ARM}
    chosen |= {r for a in list(chosen) for r in get_arm(a).requires}
    return sorted(chosen, key=order_key)
