"""The Backend protocol: everything the runner needs from an engine, and nothing more.

In the manner of lm-evaluation-harness's ``LM``: the runner (:mod:`kvaudit.runners.runner`) talks
to a backend only through :class:`Backend`; it never looks inside one. A backend runs one arm
(:class:`~kvaudit.core.arms.ArmSpec`) on one assembled :class:`~kvaudit.runners.prompt.Prompt` and
returns an :class:`ArmOutput` whose :class:`~kvaudit.core.run_format.ArmResult` is built by
:func:`build_arm_result`, the one builder every backend uses. The types shared by backends live
here, so no backend imports another. Backends are registered by name in
:mod:`kvaudit.runners.registry`, each with its own CLI options.

An engine that batches requests may also run one arm for several cases at once: ``run_arms``
(optional) takes a list of :class:`ArmRequest`, and ``concurrent_cases`` (optional, default 1) says
how many cases the runner hands it together. :func:`run_arms` is how the runner calls either kind.

``info()`` is recorded as the manifest's ``backend`` entry; its ``logit_diff_kind`` key says what
the records' ``logit_diff_vs_recompute`` measures on this backend (:data:`LOGIT_DIFF_KINDS`), so
an audit or report compares like with like.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

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
    # A repair arm's account (positions recomputed, counts, selection and recompute seconds): the
    # runner records it as the arm's ArmResult.repair.
    detail: dict[str, Any] | None = None


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


@runtime_checkable
class Backend(Protocol):
    """The engine as the runner sees it."""

    name: str  # the registry name (``ArmSpec.backends`` refers to it)
    tok: Tokenizer  # the model's tokenizer, used by prompt assembly
    fingerprint: str  # the model weights' fingerprint
    decoding: Decoding
    neutral_hash: str  # ids hash of the neutral warm-up head segment KV is built after
    max_prompt_tokens: int  # prompts are truncated to this once, before every arm
    cache: SegmentCacheView

    def info(self) -> dict[str, Any]:
        """The manifest's ``backend`` entry: at least ``backend``, ``dtype``, ``threads``, ``torch``,
        ``logit_diff_kind`` (a key of :data:`LOGIT_DIFF_KINDS`) and :func:`model_shape_info`."""
        ...

    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        """Run one arm on ``prompt``; ``capture_prompt`` is the leak-capture request (cases with a
        canary), ``candidates`` the leak-probe answers to score on the arm's own KV."""
        ...


def run_arms(backend: Backend, spec: ArmSpec, requests: list[ArmRequest]) -> list[ArmOutput]:
    """One arm for several cases: in one batch where the backend has ``run_arms``, else one by one."""
    batched = getattr(backend, "run_arms", None)
    if batched is not None:
        return list(batched(spec, requests))
    return [backend.run_arm(r.prompt, spec, capture_prompt=r.capture_prompt, candidates=r.candidates)
            for r in requests]


def noise_filler_ids(neutral_head: list[int], prompt: Prompt) -> list[int]:
    """The filler request the noise-floor arm runs beside (another batch shape): the neutral head
    and the first 256 segment tokens of the case."""
    return neutral_head + prompt.ids[prompt.head_len: prompt.tail_start][:256]


def check_concurrent_cases(n: Any) -> None:
    """Refuse a group size that is not a positive integer (before an engine starts or a server is asked)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise KvauditError(f"--concurrent-cases must be a positive integer, got {n!r}")


def concurrent_cases(backend: Backend) -> int:
    """How many cases the runner hands the backend at once (1 unless it batches)."""
    return int(getattr(backend, "concurrent_cases", 1) or 1) if hasattr(backend, "run_arms") else 1


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
