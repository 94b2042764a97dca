"""KV-cache bytes per token from a model's shape: named presets or any Hugging Face config.json.

Bytes per token = 2 (keys and values) x layers x KV heads x head dim x bytes per element.
Multi-head latent attention (DeepSeek-style ``kv_lora_rank``) stores one compressed vector per
layer instead: layers x (kv_lora_rank + qk_rope_head_dim) x bytes per element.

Every layer is counted as full attention, also where a model alternates sliding-window layers
(GPT-OSS): that is what a non-hybrid allocator and a segment store that keeps whole segments pay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvaudit.core.arg_types import parse_size
from kvaudit.core.errors import DatasetError, KvauditError
from kvaudit.core.jsonio import parse_json, read_bytes

DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "half": 2,
    "float8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1,
}


@dataclass(frozen=True)
class KVShape:
    """The part of a model's shape that sets its KV-cache size."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    latent_dim: int = 0  # MLA: kv_lora_rank + qk_rope_head_dim; 0 for ordinary attention

    @property
    def bytes_per_token(self) -> int:
        per = DTYPE_BYTES[self.dtype]
        if self.latent_dim:
            return self.layers * self.latent_dim * per
        return 2 * self.layers * self.kv_heads * self.head_dim * per

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_per_token": self.bytes_per_token}


# Values from each model's published config.json.
PRESETS: dict[str, KVShape] = {
    s.name: s
    for s in (
        KVShape("gpt-oss-120b", layers=36, kv_heads=8, head_dim=64),
        KVShape("gpt-oss-20b", layers=24, kv_heads=8, head_dim=64),
        KVShape("llama-3.1-8b", layers=32, kv_heads=8, head_dim=128),
        KVShape("llama-3.1-70b", layers=80, kv_heads=8, head_dim=128),
        KVShape("qwen2.5-7b", layers=28, kv_heads=4, head_dim=128),
        KVShape("mistral-7b", layers=32, kv_heads=8, head_dim=128),
        KVShape("smollm2-135m", layers=30, kv_heads=3, head_dim=64),
    )
}


# The largest layer count, head count or dimension a config may give: far above any model's, and
# small enough that bytes per token (a product of three of them) stays within int64.
MAX_DIM = 10**6


def _show(v: Any, n: int = 60) -> str:
    """A config value for a message: its repr cut to ``n`` characters (a JSON integer may have
    thousands of digits, a string any length)."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**n:
        return f"an integer of {len(str(abs(v)))} digits"
    r = repr(v)
    return r if len(r) <= n else r[:n] + "..."


def _int_field(cfg: dict, names: tuple[str, ...], where: str, default: int | None = None,
               *, minimum: int = 1) -> int:
    for n in names:
        v = cfg.get(n)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or not minimum <= v <= MAX_DIM:
                want = "a positive integer" if minimum == 1 else f"an integer of at least {minimum}"
                raise KvauditError(f"{where}: field '{n}' must be {want} (at most {MAX_DIM}), "
                                   f"got {_show(v)}")
            return v
    if default is not None:
        return default
    raise KvauditError(f"{where}: missing field '{names[0]}'")


def shape_from_config(cfg: dict[str, Any], name: str, dtype: str | None = None) -> KVShape:
    """Read the KV shape from a Hugging Face ``config.json`` dict (nested ``text_config`` too)."""
    if isinstance(cfg.get("text_config"), dict) and "num_hidden_layers" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    layers = _int_field(cfg, ("num_hidden_layers", "n_layer", "num_layers"), name)
    heads = _int_field(cfg, ("num_attention_heads", "n_head"), name)
    kv_heads = _int_field(cfg, ("num_key_value_heads", "num_kv_heads"), name, default=heads)
    default_dim = None  # head_dim, when the config does not give it: hidden size / heads
    if cfg.get("head_dim") is None and any(cfg.get(k) is not None for k in ("hidden_size", "n_embd")):
        hidden = _int_field(cfg, ("hidden_size", "n_embd"), name)
        if hidden < heads:
            raise KvauditError(f"{name}: field 'hidden_size' ({hidden}) is smaller than the {heads} "
                               "attention heads; give 'head_dim'")
        default_dim = hidden // heads
    head_dim = _int_field(cfg, ("head_dim",), name, default=default_dim)
    latent = 0
    if cfg.get("kv_lora_rank"):
        latent = (_int_field(cfg, ("kv_lora_rank",), name)
                  + _int_field(cfg, ("qk_rope_head_dim",), name, default=0, minimum=0))
    if dtype and dtype not in DTYPE_BYTES:
        raise KvauditError(f"unknown KV dtype {_show(dtype)} (known: {', '.join(sorted(DTYPE_BYTES))})")
    field = next((f for f in ("torch_dtype", "dtype") if cfg.get(f)), "torch_dtype")
    dt = dtype or cfg.get(field) or "bfloat16"
    if not isinstance(dt, str) or dt not in DTYPE_BYTES:
        raise KvauditError(f"{name}: field '{field}': unknown dtype {_show(dt)} "
                           f"(known: {', '.join(sorted(DTYPE_BYTES))})")
    return KVShape(name, layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype=dt,
                   latent_dim=latent)


def resolve_model(spec: str, dtype: str | None = None) -> KVShape:
    """A preset name (case-insensitive), a config.json path, or a folder holding config.json."""
    key = spec.strip().lower()
    if key in PRESETS:
        shape = PRESETS[key]
        if dtype:
            if dtype not in DTYPE_BYTES:
                raise KvauditError(f"unknown KV dtype {dtype!r} (known: {', '.join(sorted(DTYPE_BYTES))})")
            shape = KVShape(shape.name, shape.layers, shape.kv_heads, shape.head_dim, dtype,
                            shape.latent_dim)
        return shape
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise KvauditError(f"--model-config {spec!r}: neither a preset ({', '.join(PRESETS)}) "
                           f"nor an existing config.json")
    try:
        cfg = parse_json(read_bytes(path), str(path))
    except DatasetError as e:
        raise KvauditError(str(e)) from None
    if not isinstance(cfg, dict):
        raise KvauditError(f"{path}: expected a JSON object")
    return shape_from_config(cfg, str(path), dtype)


def parse_capacity(text: str) -> int:
    """``30GB`` -> 30e9 bytes: :func:`kvaudit.core.arg_types.parse_size`, the one size parser."""
    return parse_size(text)


def format_bytes(n: int) -> str:
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            return f"{n / size:g}{unit}"
    return f"{n}B"
