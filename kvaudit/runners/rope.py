"""RoPE re-rotation of cached keys, with the frequencies read from the model itself.

Keys sit in the KV cache after RoPE. Moving a key from position p to p + d multiplies it by
the rotation R(d), because R(p + d) = R(d) R(p) for every frequency-only RoPE variant: the
default, ``linear``, ``llama3`` and ``yarn`` (yarn's attention factor scales cos and sin at
compute time and is already inside the cached key, so the pure rotation must leave it out).
Variants whose frequencies depend on the sequence length (``dynamic``, ``longrope``), partial
rotary, per-layer RoPE, sliding windows and models without RoPE are refused with a clear message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from kvaudit.core.errors import UnsupportedModelError

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True)
class RopeAdmission:
    """What :func:`admit_rope` found in a config it admits."""

    name: str
    rope_type: str
    head_dim: int
    sliding_window: int | None
    params: dict[str, Any]


def admit_rope(config: Any) -> RopeAdmission:
    """The one RoPE admission every backend uses: refuse, with a clear message, any model whose
    cached keys cannot be moved by a pure rotation; otherwise say what was found."""
    name = getattr(config, "name_or_path", "") or getattr(config, "model_type", "?")
    mtype = getattr(config, "model_type", "?")
    if mtype not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{name}: model type {mtype!r} is not supported for segment reuse "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    rp = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    if rp and all(isinstance(v, dict) for v in rp.values()):
        raise UnsupportedModelError(f"{name}: per-layer RoPE parameters are not supported")
    if getattr(config, "no_rope_layers", None):
        raise UnsupportedModelError(f"{name}: layers without RoPE are not supported")
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"{name}: RoPE type {rope_type!r} is not supported (its frequencies depend on the "
            f"sequence length or are unknown); supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    partial = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0))
    if partial not in (None, 1.0):
        raise UnsupportedModelError(f"{name}: partial rotary embeddings are not supported")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    window = None
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        window = int(config.sliding_window)
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types) and window is None:
        raise UnsupportedModelError(f"{name}: mixed attention layer types are not supported")
    return RopeAdmission(name=name, rope_type=rope_type, head_dim=head_dim, sliding_window=window, params=rp)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class RopeSpec:
    inv_freq: torch.Tensor  # float32, [head_dim // 2]
    rope_type: str
    head_dim: int
    sliding_window: int | None = None
    _inv_freq_on: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_model(cls, model: Any) -> RopeSpec:
        """The spec of a loaded model (the transformers backend): frequencies from its rotary embedding."""
        config = model.config
        adm = admit_rope(config)
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        if rotary is None or not hasattr(rotary, "inv_freq"):
            raise UnsupportedModelError(f"{adm.name}: no rotary embedding found; models without RoPE are not supported")
        inv_freq = rotary.inv_freq.detach().float().cpu()
        if inv_freq.numel() * 2 != adm.head_dim:
            raise UnsupportedModelError(f"{adm.name}: partial rotary embeddings are not supported")
        return cls(inv_freq=inv_freq, rope_type=adm.rope_type, head_dim=adm.head_dim, sliding_window=adm.sliding_window)

    @classmethod
    def from_config(cls, config: Any) -> RopeSpec:
        """The spec from a Hugging Face config alone (the vLLM backend and its connector: no weights)."""
        adm = admit_rope(config)
        if adm.rope_type == "default":
            theta = adm.params.get("rope_theta", getattr(config, "rope_theta", None))
            if theta is None:
                raise UnsupportedModelError(f"{adm.name}: the model config names no rope_theta")
            hd = adm.head_dim
            inv_freq = 1.0 / (float(theta) ** (torch.arange(0, hd, 2, dtype=torch.int64).double() / hd))
            inv_freq = inv_freq.float()
        else:
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, _ = ROPE_INIT_FUNCTIONS[adm.rope_type](config, "cpu")
            inv_freq = inv_freq.float()
        return cls(inv_freq=inv_freq, rope_type=adm.rope_type, head_dim=adm.head_dim, sliding_window=adm.sliding_window)

    def cos_sin(self, delta: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        # float64 for the angle so large positions lose no precision before the cast. Computed on
        # the keys' device: a host-to-device copy per segment can stall a GPU stream.
        freqs = float(delta) * self._inv_freq64(torch.device(device))
        emb = torch.cat((freqs, freqs))
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def _inv_freq64(self, device: torch.device) -> torch.Tensor:
        key = str(device)
        if key not in self._inv_freq_on:
            self._inv_freq_on[key] = self.inv_freq.double().to(device)
        return self._inv_freq_on[key]

    def rotate(self, keys: torch.Tensor, delta: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate post-RoPE ``keys`` [..., head_dim] from position p to p + ``delta``.

        With ``out`` (same shape, any strides, e.g. a slice of an assembled cache) the result is
        written there instead of a new tensor, saving the copy a later concatenation would make.
        """
        if delta == 0:
            return keys if out is None else out.copy_(keys)
        cos, sin = self.cos_sin(delta, keys.device, torch.float32)
        if out is None:
            out = torch.empty_like(keys)
        half = keys.shape[-1] // 2
        c, s = cos[:half], sin[:half]
        x1, x2 = keys[..., :half], keys[..., half:]
        # Bit-identical to (k * cos + rotate_half(k) * sin).to(dtype) with k = keys.float(): the
        # products are promoted to float32 and rounded once on store, but with fewer full passes.
        torch.sub(x1 * c, x2 * s, out=out[..., :half])
        torch.add(x2 * c, x1 * s, out=out[..., half:])
        return out
