"""``engines.toml``: the engines of a serving-change run, by role, read and checked before any work.

A serving-change run (docs/serving-changes.md) compares a *candidate* engine configuration with
its *baseline* on identical token ids. The file has two tables::

    [baseline]
    backend = "vllm"            # transformers | vllm | openai (kvaudit.runners.registry)
    model = "smollm2"           # 'smollm2' or a local checkpoint directory
    dtype = "bfloat16"
    max_new_tokens = 64         # optional (default 24)
    [baseline.options]          # the backend's own options, by their opener's names
    max_model_len = 4096

    [candidate]
    backend = "vllm"
    model = "smollm2"
    dtype = "bfloat16"
    change = "fp8 KV cache"     # what the candidate changes, in words (required)
    declares = ["kv_cache_dtype"]  # the configuration keys the change may alter (required)
    [candidate.options]
    kv_cache_dtype = "fp8"

``options`` are the backend's registered options (``threads`` for transformers; ``base_url`` and
the rest for openai) and, for vLLM, any engine argument of ``vllm.LLM`` besides
(``kv_cache_dtype``, ``speculative_config``, ``max_num_batched_tokens``, ``kv_cache_memory_bytes``,
``enable_chunked_prefill``, ...): vLLM validates those when the engine starts. ``declares`` names
keys of the recorded configuration (an option's name, ``dtype``, ``model_fingerprint``,
``max_new_tokens``, ``vllm`` for the engine's version, ...); the audit fails a run whose engines
differ in anything else. The *candidate_off* engine (arm ``candidate_off``) is the candidate's
table with every declared key set back to the baseline's value.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvaudit.core.errors import KvauditError, excerpt
from kvaudit.core.toml_file import read_toml
from kvaudit.core.vocabulary import EngineRole, words

ROLES = words(EngineRole)
_ENGINE_KEYS = {"backend", "model", "dtype", "max_new_tokens", "options"}
_CANDIDATE_KEYS = _ENGINE_KEYS | {"change", "declares"}
DTYPES = ("float32", "bfloat16", "float16")
# Backends whose opener takes engine arguments beyond its registered options (passed to the engine).
PASS_THROUGH = ("vllm",)


@dataclass(frozen=True)
class EngineSpec:
    """One engine of a serving-change run, as its table in the engines file gives it."""

    role: str
    backend: str
    model: str
    dtype: str = "float32"
    max_new_tokens: int = 24
    options: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "model": self.model, "dtype": self.dtype,
                "max_new_tokens": self.max_new_tokens, "options": dict(sorted(self.options.items()))}

    def sha256(self) -> str:
        """A digest of what its table says (a replay on it records this: an edited table is another engine)."""
        return _digest(self.as_dict())


@dataclass(frozen=True)
class EnginesFile:
    """A parsed engines file: the two engines, the change in words and the keys it declares."""

    path: Path
    baseline: EngineSpec
    candidate: EngineSpec
    change: str
    declares: tuple[str, ...]

    def candidate_off(self) -> EngineSpec:
        """The candidate with the change switched off: each declared key the table sets is put back
        to the baseline's value (an option the baseline leaves unset is removed)."""
        spec = self.candidate
        top = {k: getattr(self.baseline, k) for k in ("backend", "model", "dtype", "max_new_tokens")
               if k in self.declares}
        options = dict(spec.options)
        for k in self.declares:
            if k in self.baseline.options:
                options[k] = self.baseline.options[k]
            else:
                options.pop(k, None)
        return replace(spec, role="candidate_off", options=options, **top)

    def sha256(self) -> str:
        """A digest of what the file says (not of its bytes: comments and order do not count)."""
        return _digest({"baseline": self.baseline.as_dict(), "candidate": self.candidate.as_dict(),
                        "change": self.change, "declares": list(self.declares)})


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _engine(path: Path, role: str, table: Any) -> EngineSpec:
    from kvaudit.runners.registry import BACKENDS

    where = f"{path}: [{role}]"
    if not isinstance(table, dict):
        raise KvauditError(f"{path}: '{role}' must be a table ([{role}])")
    allowed = _CANDIDATE_KEYS if role == "candidate" else _ENGINE_KEYS
    unknown = sorted(set(table) - allowed)
    if unknown:
        hint = " (only [candidate] says what it changes)" if set(unknown) & {"change", "declares"} else ""
        raise KvauditError(f"{where}: unknown key {excerpt(unknown[0], 60)!r}{hint}; known keys: "
                           f"{', '.join(sorted(allowed))}")
    backend = table.get("backend")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise KvauditError(f"{where} backend must be one of {', '.join(BACKENDS)}, not "
                           f"{excerpt(repr(backend), 60)}")
    model = table.get("model", "smollm2")
    if not isinstance(model, str) or not model.strip():
        raise KvauditError(f"{where} model must be a non-empty string ('smollm2' or a checkpoint directory)")
    dtype = table.get("dtype", "float32")
    if dtype not in DTYPES:
        raise KvauditError(f"{where} dtype must be one of {', '.join(DTYPES)}, not {excerpt(repr(dtype), 60)}")
    new = table.get("max_new_tokens", 24)
    if isinstance(new, bool) or not isinstance(new, int) or not 1 <= new <= 100_000:
        raise KvauditError(f"{where} max_new_tokens must be a whole number in [1, 100000]")
    options = table.get("options", {})
    if not isinstance(options, dict):
        raise KvauditError(f"{where} options must be a table ([{role}.options])")
    entry = BACKENDS[backend]
    known = {o.param: o for o in entry.options}
    for k, v in options.items():
        if k in ("dtype", "max_new_tokens", "model"):
            raise KvauditError(f"{path}: [{role}.options] {k}: give it in [{role}] itself")
        if k not in known and backend not in PASS_THROUGH:
            raise KvauditError(f"{path}: [{role}.options] unknown option {excerpt(k, 60)!r} for backend "
                               f"{backend}; its options: {', '.join(known) or 'none'}")
        o = known.get(k)
        if o is not None and o.check is not None:
            try:
                o.check(v)
            except KvauditError as e:
                raise KvauditError(f"{path}: [{role}.options] {k}: {e}") from None
    return EngineSpec(role, backend, model.strip(), dtype, new, dict(options))


def read_engines(path: Path) -> EnginesFile:
    """Read and check an engines file; a :class:`KvauditError` naming the file and the key for
    anything wrong, before any engine starts."""
    data = read_toml(path, "engines file")
    unknown = sorted(set(data) - set(ROLES))
    if unknown:
        raise KvauditError(f"{path}: unknown table {excerpt(unknown[0], 60)!r}; an engines file has "
                           "[baseline] and [candidate]")
    for role in ROLES:
        if role not in data:
            raise KvauditError(f"{path}: no [{role}] table (a serving-change run needs a baseline and a candidate)")
    baseline = _engine(path, "baseline", data["baseline"])
    candidate = _engine(path, "candidate", data["candidate"])
    cand = data["candidate"]
    change = cand.get("change")
    if not isinstance(change, str) or not change.strip():
        raise KvauditError(f"{path}: [candidate] change must say what the candidate changes "
                           "(e.g. change = \"fp8 KV cache\")")
    declares = cand.get("declares")
    if (not isinstance(declares, list) or not declares
            or not all(isinstance(k, str) and k.strip() for k in declares)):
        raise KvauditError(f"{path}: [candidate] declares must list the configuration keys the change alters "
                           "(e.g. declares = [\"kv_cache_dtype\"]); every other difference fails the audit")
    if baseline.as_dict() == candidate.as_dict():
        raise KvauditError(f"{path}: [baseline] and [candidate] are the same configuration: nothing to audit "
                           "(for the A/A noise floor alone, run the baseline with --arms including "
                           "recompute_again)")
    return EnginesFile(path, baseline, candidate, change.strip(), tuple(k.strip() for k in declares))
