"""The Backend base class: everything the runner needs from an engine, and nothing more.

In the manner of lm-evaluation-harness's ``LM``: the runner (:mod:`kvaudit.runners.runner`) talks
to a backend only through :class:`Backend`, a small abstract base; it never looks inside one. A
backend implements :meth:`Backend.info` and :meth:`Backend.run_arm`; the rest has defaults. A backend runs one arm
(:class:`~kvaudit.core.arms.ArmSpec`) on one assembled :class:`~kvaudit.runners.prompt.Prompt` and
returns an :class:`ArmOutput` whose :class:`~kvaudit.core.run_format.ArmResult` is built by
:func:`build_arm_result`, the one builder every backend uses. The types shared by backends live
here, so no backend imports another. Backends are registered by name in
:mod:`kvaudit.runners.registry`, each with its own CLI options.

An engine that batches requests overrides :meth:`Backend.run_arms` (one arm for several cases at
once; the default runs them one by one) and sets ``concurrent_cases`` (default 1: how many cases
the runner hands it together). An engine that cannot run some arms in its configuration refuses
them in :meth:`Backend.check_arms`, before any case runs.

``info()`` (:class:`BackendInfo`) is recorded as the manifest's ``backend`` entry; its
``logit_diff_kind`` key says what the records' ``logit_diff_vs_recompute`` measures on this
backend (:data:`LOGIT_DIFF_KINDS`), so an audit or report compares like with like.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.core.run_format import ArmResult

if TYPE_CHECKING:
    import torch

    from kvaudit.core.arms import ArmSpec
    from kvaudit.runners.prompt import Prompt, Tokenizer
    from kvaudit.runners.rope import RopeSpec
    from kvaudit.runners.segment_cache import CacheStats

# What ``logit_diff_vs_recompute`` measures, by the value of ``info()["logit_diff_kind"]``.
LOGIT_DIFF_KINDS = {
    "logits": "max |first-token logit difference| over the whole vocabulary",
    "top_logprobs": "max |first-token log-probability difference| over the union of both arms' top "
                    "tokens (the backend returns only its top log-probabilities; the rest sit at their floor)",
}


@dataclass(frozen=True)
class Decoding:
    max_new_tokens: int = 24
    strategy: str = "greedy"
    top_k_logits: int = 5

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ArmOutput:
    result: ArmResult
    first_logits: torch.Tensor  # what ``logit_diff_vs_recompute`` is computed from (see logit_diff_kind)
    build_s: float  # segment KV built for this arm (one-time caching cost, not in TTFT)
    head_s: float = 0.0  # cached-segment arms on an engine that prefills the head as its own request
    # The head's KV was prefilled for this request (a head not held before), whether by a request of
    # its own first (``head_s`` > 0) or in the same engine step as this one (vLLM in-process).
    head_prefilled: bool = False
    # A repair arm's account (positions recomputed, counts, selection and recompute seconds): the
    # runner records it as the arm's ArmResult.repair.
    detail: dict[str, Any] | None = None
    # The engine's own time to first token for the arm's main request, where it keeps one (vLLM
    # opened with request stats): beside the client's ``result.ttft_s``, the client's overhead.
    engine_ttft_s: float | None = None


@dataclass(frozen=True)
class ArmRequest:
    """One case's inputs to one arm: what :meth:`Backend.run_arm` takes besides the spec."""

    prompt: Prompt
    capture_prompt: Prompt | None = None
    candidates: list[str] | None = None


class SegmentCacheView(Protocol):
    """What the runner reads of a backend's segment cache: its budget and hit statistics."""

    capacity_bytes: int
    stats: CacheStats


class _RequiredInfo(TypedDict):
    backend: str  # the registry name
    dtype: str
    threads: int | None
    torch: str | None
    logit_diff_kind: str  # a key of LOGIT_DIFF_KINDS


class BackendInfo(_RequiredInfo, total=False):
    """``Backend.info()``: the keys every backend records (required) and any of its own."""

    transformers: str | None


REQUIRED_INFO = tuple(sorted(BackendInfo.__required_keys__))


def check_info(info: dict[str, Any]) -> BackendInfo:
    """``info`` when it has every required key and a known ``logit_diff_kind``, else a
    :class:`KvauditError` naming what is missing (a backend's defect, caught before a run)."""
    missing = [k for k in REQUIRED_INFO if k not in info]
    if missing:
        raise KvauditError(f"backend {info.get('backend', '?')!r}: info() lacks {', '.join(missing)}")
    if info["logit_diff_kind"] not in LOGIT_DIFF_KINDS:
        raise KvauditError(f"backend {info['backend']!r}: info()['logit_diff_kind'] must be one of "
                           f"{', '.join(LOGIT_DIFF_KINDS)}, got {info['logit_diff_kind']!r}")
    return info  # type: ignore[return-value]


class Backend(ABC):
    """The engine as the runner sees it."""

    name: str  # the registry name (its entry there declares the non-portable arms it runs)
    tok: Tokenizer  # the model's tokenizer, used by prompt assembly
    fingerprint: str  # the model weights' fingerprint
    decoding: Decoding
    neutral_hash: str  # ids hash of the neutral warm-up head segment KV is built after
    max_prompt_tokens: int  # prompts are truncated to this once, before every arm
    cache: SegmentCacheView
    concurrent_cases: int = 1  # cases handed to run_arms together
    # True where the head's KV is kept in the segment store by its ids and loaded when held (vLLM's
    # connector loads only a prompt prefix, so the head is stored like a prefix-cache entry): its
    # hits are store hits, and it shares the store's budget (``kvaudit replay``, the simulator).
    stores_heads: bool = False
    # True where a new head is stored after the request that loads it has loaded its documents (vLLM
    # in-process: the head goes in that request's engine step and is saved at its end), not before.
    heads_saved_after_load: bool = False
    prefix_cache_name: str = "the engine's own prefix cache"  # what the engine-prefix arms measure, in its words
    # False for an engine opened for a replay: its requests ask for tokens and times only, no
    # first-token log-probabilities (a replay reads none; asking costs a loaded server requests a
    # second and puts the sampler's work between its first-token stamp and the client's). Arms
    # then carry no top-k and no margin: never set it on an engine an audit runs on.
    asks_logprobs: bool = True

    def arm_reason(self, spec: ArmSpec) -> str:
        """Why an arm runs, as the manifest records it: its spec's reason, and for the arms that
        measure the engine's own cache, which mechanism that is on this engine."""
        if spec.source == "engine_prefix" or spec.role == "tenant_probe":
            return f"{spec.why} (here: {self.prefix_cache_name})"
        return spec.why

    @abstractmethod
    def info(self) -> BackendInfo:
        """The manifest's ``backend`` entry: the :class:`BackendInfo` keys and
        :func:`model_shape_info`."""

    @abstractmethod
    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        """Run one arm on ``prompt``; ``capture_prompt`` is the leak-capture request (cases with a
        canary), ``candidates`` the leak-probe answers to score on the arm's own KV."""

    def run_arms(self, spec: ArmSpec, requests: list[ArmRequest]) -> list[ArmOutput]:
        """One arm for several cases (an engine that batches runs them together)."""
        return [self.run_arm(r.prompt, spec, capture_prompt=r.capture_prompt, candidates=r.candidates)
                for r in requests]

    def close(self) -> None:
        """Release what the engine holds (default: nothing; the process's end releases the rest)."""
        return None

    def bytes_per_token(self) -> int | None:
        """KV bytes one token takes in the engine's own cache, as the engine allocates it; None
        where the engine does not say (the model's shape gives it: :mod:`kvaudit.simulator.kv_bytes`)."""
        return None

    def kv_cache_tokens(self) -> int | None:
        """Tokens the engine's whole KV space holds; None where kvaudit cannot see it (a server)."""
        return None

    def store_budget_bytes(self, budget: int) -> int:
        """Bytes kvaudit's segment store keeps per worker when the run's budget is ``budget``
        (the budget itself on one worker; an engine that splits its store says its share)."""
        return budget

    def reset_caches(self) -> None:
        """Start cold, as a fresh engine does: what the engine and kvaudit's store cached before is
        not served again (each load of a replay sweep). Default: refused."""
        raise KvauditError(f"backend {self.name!r} cannot empty its caches between the loads of a sweep")

    def serving_change(self) -> dict[str, Any] | None:
        """A serving-change run's record for the manifest (:class:`~kvaudit.core.manifest.ServingChange`
        fields); ``None`` for one engine (the default)."""
        return None

    def check_arms(self, arms: list[str]) -> None:
        """Refuse, before any case runs, arms this engine's configuration cannot run (by default:
        none; :func:`kvaudit.runners.registry.check_arms_run_on` has already refused arms of other engines)."""
        return None


def capture_source(spec: ArmSpec, prompt: Prompt, capture_prompt: Prompt | None) -> Prompt | None:
    """The prompt an arm's segment KV is captured from, the one dispatch on ``spec.source`` every
    engine shares: ``None`` for ``neutral`` (KV from neutral warm-ups, the store's), the case's own
    prompt for ``in_context``, the leak-capture request for ``first_user`` (which must hold the
    case's segments). Any other source is an error here: the engines handle ``None`` (recompute)
    and ``engine_prefix`` before asking."""
    if spec.source == "neutral":
        return None
    if spec.source == "in_context":
        return prompt
    if spec.source == "first_user":
        if capture_prompt is None:
            raise KvauditError(f"arm {spec.name} needs a capture request (a leak-probe canary)")
        if capture_prompt.segment_hashes != prompt.segment_hashes:
            raise KvauditError(f"arm {spec.name}: the capture request holds different segments")
        return capture_prompt
    raise KvauditError(f"unknown segment source {spec.source!r}")


def noise_filler_ids(neutral_head: list[int], prompt: Prompt) -> list[int]:
    """The filler request the noise-floor arm runs beside (another batch shape): the neutral head
    and the first 256 segment tokens of the case."""
    return neutral_head + prompt.ids[prompt.head_len: prompt.tail_start][:256]


def check_concurrent_cases(n: Any) -> None:
    """Refuse a group size that is not a positive integer (before an engine starts or a server is asked)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KvauditError(f"--concurrent-cases must be a positive integer, got {n!r}")


def logit_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """``logit_diff_vs_recompute`` between two arms' ``first_logits`` (its meaning: ``logit_diff_kind``)."""
    return float((a - b).abs().max())


def model_shape_info(cfg: Any, rope: RopeSpec, max_prompt_tokens: int, neutral_hash: str) -> dict[str, Any]:
    """The model-shape part of a backend's manifest info, the same for every backend."""
    return {
        "rope_type": rope.rope_type,
        "model_type": cfg.model_type,
        "num_layers": cfg.num_hidden_layers,
        "num_kv_heads": getattr(cfg, "num_key_value_heads", cfg.num_attention_heads),
        "head_dim": rope.head_dim,
        "max_prompt_tokens": max_prompt_tokens,
        "neutral_head_hash": neutral_hash,
    }


def build_arm_result(spec: ArmSpec, prompt: Prompt, tok: Tokenizer, decoding: Decoding, *,
                     answer_ids: list[int], top: list[tuple[int, float]], ttft_s: float, decode_s: float,
                     tokens_reused: int, cache_hit_tokens: int, fingerprints: dict[str, str],
                     canary: dict[str, float] | None, engine: dict[str, Any] | None = None) -> ArmResult:
    """The one :class:`ArmResult` builder: ``top`` is the first token's best (id, score) pairs, best
    first (logits or log-probabilities: the margin, top-1 minus top-2, is the same either way)."""
    vals = [float(v) for _, v in top]
    return ArmResult(
        arm=spec.name,
        answer=tok.tok.decode(answer_ids, skip_special_tokens=True).strip(),
        answer_ids=answer_ids,
        top_k=[(int(i), round(v, 5)) for (i, _), v in zip(top, vals)],
        margin=vals[0] - vals[1] if len(vals) > 1 else 0.0,
        ttft_s=ttft_s,
        decode_s=decode_s,
        tokens_reused=tokens_reused,
        tokens_computed=len(prompt.ids) - tokens_reused,
        cache_hit_tokens=cache_hit_tokens,
        ids_hash=ids_hash(prompt.ids),
        segment_hashes=[ids_hash(prompt.unit_ids(i)) for i in range(len(prompt.spans))],
        truncation=dict(prompt.truncation),
        decoding=decoding.as_dict(),
        segment_kv_fingerprints=fingerprints,
        canary_logprobs=canary,
        engine=engine,
    )


# --------------------------------------------------------------------------- engines that return
# log-probabilities, not logits (vLLM in process, any server over HTTP)


def eos_token_ids(model_dir: Any, hf_tokenizer: Any) -> set[int]:
    """Every id that ends an answer: the generation config's EOS ids and the tokenizer's."""
    from transformers import GenerationConfig

    eos: set[int] = set()
    try:
        gen_eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
        eos |= {int(e) for e in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if e is not None}
    except OSError:
        pass
    if hf_tokenizer.eos_token_id is not None:
        eos.add(int(hf_tokenizer.eos_token_id))
    return eos


def cut_at_eos(ids: list[int], eos: set[int]) -> list[int]:
    """The answer's ids: everything before the first EOS id."""
    out = []
    for t in ids:
        if t in eos:
            break
        out.append(t)
    return out


def logits_from_top(first_lp: dict[int, float], vocab: int) -> torch.Tensor:
    """``first_logits`` for a backend that returns only the top log-probabilities: every other
    token sits at the lowest of them (``logit_diff_kind == "top_logprobs"``)."""
    import torch

    floor = min(first_lp.values()) if first_lp else 0.0
    out = torch.full((vocab,), floor, dtype=torch.float32)
    for k, v in first_lp.items():
        if 0 <= k < vocab:
            out[k] = v
    return out
