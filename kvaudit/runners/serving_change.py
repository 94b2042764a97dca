"""A serving-change run's engines behind one :class:`~kvaudit.runners.backend.Backend`.

``kvaudit run --engines engines.toml`` opens the baseline, the candidate and, where an arm needs
it, the candidate with its change switched off (:mod:`kvaudit.runners.engines_file`), and hands
the runner one :class:`ServingChangeBackend`: prompts are assembled once, by the baseline's
tokenizer, and each arm runs on the engine its spec names (``ArmSpec.engine``) exactly as the arm
``runs_as`` runs on the baseline (``candidate`` is the candidate engine's ``recompute``). The
runner is unchanged; it never knows there are several engines.

All engines live in this one process and stay open for the whole run, so every arm of a case
meets the same batch and machine conditions. Transformers engines and HTTP servers share a
process freely; in-process vLLM engines share it too, each with its own KV-cache budget
(docs/serving-changes.md says what that costs on a GPU).

What each engine is recorded as (:func:`configuration`) is what the audit's ``engines_differ_only_in_change``
check compares: one flat mapping of model, tokenizer, decoding, prompt limit, versions and every
engine option, so a difference the change did not declare is named by its key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvaudit.core.arms import ArmSpec, get_arm
from kvaudit.core.errors import KvauditError
from kvaudit.runners.backend import ArmOutput, ArmRequest, Backend, BackendInfo
from kvaudit.runners.engines_file import EnginesFile, EngineSpec

# Keys of a backend's info() that describe one engine instance or one run's traffic, not its
# configuration: two engines of one configuration differ in them.
_INSTANCE_KEYS = {"head_steps", "batching", "base_url", "reference_url", "cache_probe", "candidate_scoring",
                  "system_fingerprint", "connector", "head_kv", "first_logits", "dtype_source"}


def tokenizer_fingerprint(tok: Any) -> str:
    """A digest of what builds prompts: the vocabulary, the special tokens and the chat template."""
    hf = getattr(tok, "tok", tok)
    body = {"vocab": sorted(hf.get_vocab().items()), "template": getattr(hf, "chat_template", None),
            "special": sorted(str(t) for t in getattr(hf, "all_special_tokens", []))}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


def configuration(backend: Backend, spec: EngineSpec) -> dict[str, Any]:
    """What an engine is, as one flat mapping (dotted keys for nested values): model and tokenizer
    fingerprints, dtype, decoding, prompt limit, the backend's info (versions, device, threads,
    engine options, what a server reports about itself) and the options the engines file gave."""
    info = {k: v for k, v in dict(backend.info()).items() if k not in _INSTANCE_KEYS}
    out: dict[str, Any] = {}
    _flat("", info, out)
    _flat("options", spec.options, out)
    out.update({"model": spec.model, "model_fingerprint": backend.fingerprint, "dtype": spec.dtype,
                "tokenizer": tokenizer_fingerprint(backend.tok), "max_prompt_tokens": backend.max_prompt_tokens})
    _flat("decoding", backend.decoding.as_dict(), out)
    return dict(sorted(out.items()))


# Two names of one setting: the opener's keyword an engines table may use, and the name the engine
# records it under (vLLM's ``kv_cache_memory_bytes``). Declaring either declares both.
KV_SPACE_NAMES = ("kv_cache_bytes", "kv_cache_memory_bytes")  # the engine's KV space
SAME_SETTING: tuple[tuple[str, str], ...] = (KV_SPACE_NAMES,)


def declared(key: str, declares: tuple[str, ...] | list[str]) -> bool:
    """Whether a declared name covers a recorded configuration key: it is the key, or a part of it
    after the first (``kv_cache_dtype`` covers ``engine.kv_cache_dtype`` and ``options.kv_cache_dtype``;
    ``speculative_config`` covers ``engine.speculative_config.method``), or a dotted path the key
    lies under (``engine.speculative_config``), or the other name of its setting (:data:`SAME_SETTING`).
    A namespace alone (``engine``) covers nothing."""
    parts = key.split(".")
    names = set(declares) | {other for d in declares for pair in SAME_SETTING if d in pair for other in pair}
    return any(d == key or d in parts[1:] or ("." in d and key.startswith(d + ".")) for d in names)


def undeclared(base: dict[str, Any], other: dict[str, Any], declares: tuple[str, ...] | list[str]) -> list[str]:
    """The keys where two recorded configurations differ that no declared name covers (:func:`declared`)."""
    diff = sorted(k for k in set(base) | set(other) if base.get(k) != other.get(k))
    return [k for k in diff if not declared(k, declares)]


def check_compatible(path: Any, base: Backend, other: Backend, role: str) -> None:
    """Refuse, at open, an engine the baseline's prompts cannot be given to: another tokenizer or
    chat template, a shorter prompt limit, another neutral head, or first-token scores of another
    kind (the logit differences would compare unlike things)."""
    what = []
    if tokenizer_fingerprint(base.tok) != tokenizer_fingerprint(other.tok):
        what.append("tokenizer or chat template")
    if other.max_prompt_tokens < base.max_prompt_tokens:
        what.append(f"prompt limit ({other.max_prompt_tokens} tokens, the baseline's {base.max_prompt_tokens}: "
                    "a prompt built for the baseline may not fit)")
    if other.neutral_hash != base.neutral_hash:
        what.append("neutral warm-up head")
    kinds = (base.info()["logit_diff_kind"], other.info()["logit_diff_kind"])
    if kinds[0] != kinds[1]:
        what.append(f"first-token scores ({kinds[1]}; the baseline's {kinds[0]})")
    if what:
        raise KvauditError(f"{path}: the {role} engine differs from the baseline in its {'; '.join(what)}: prompts "
                           "are built once, by the baseline's tokenizer, so both must take the same ids; "
                           "nothing was run")


class ServingChangeBackend(Backend):
    """The baseline, seen by the runner, with the other engines behind it (see the module docstring)."""

    def __init__(self, engines: EnginesFile, backends: dict[str, Backend], specs: dict[str, EngineSpec]):
        base = backends["baseline"]
        self.engines_file = engines
        self.backends = backends
        self.specs = specs
        self.name = base.name
        self.tok = base.tok
        self.fingerprint = base.fingerprint
        self.decoding = base.decoding
        self.neutral_hash = base.neutral_hash
        self.max_prompt_tokens = base.max_prompt_tokens
        self.cache = base.cache
        self.concurrent_cases = base.concurrent_cases
        self.stores_heads = base.stores_heads
        self.heads_saved_after_load = base.heads_saved_after_load
        self.prefix_cache_name = base.prefix_cache_name

    def _target(self, spec: ArmSpec) -> tuple[Backend, ArmSpec]:
        backend = self.backends.get(spec.engine)
        if backend is None:
            raise KvauditError(f"arm {spec.name} runs on the {spec.engine} engine, which this run did not open")
        return backend, get_arm(spec.runs_as) if spec.runs_as else spec

    def info(self) -> BackendInfo:
        return self.backends["baseline"].info()

    def arm_reason(self, spec: ArmSpec) -> str:
        backend, runs_as = self._target(spec)
        return spec.why if spec.runs_as else backend.arm_reason(runs_as)

    def run_arm(self, prompt: Any, spec: ArmSpec, *, capture_prompt: Any = None,
                candidates: list[str] | None = None) -> ArmOutput:
        return self.run_arms(spec, [ArmRequest(prompt, capture_prompt, candidates)])[0]

    def run_arms(self, spec: ArmSpec, requests: list[ArmRequest]) -> list[ArmOutput]:
        backend, runs_as = self._target(spec)
        outs = backend.run_arms(runs_as, requests)
        for o in outs:
            o.result.arm = spec.name
        return outs

    def check_arms(self, arms: list[str]) -> None:
        by_engine: dict[str, list[str]] = {}
        for a in arms:
            spec = get_arm(a)
            by_engine.setdefault(spec.engine, []).append(spec.runs_as or a)
        for engine, names in by_engine.items():
            if engine not in self.backends:
                raise KvauditError(f"arms {', '.join(names)} run on the {engine} engine, which this run did not open")
            self.backends[engine].check_arms(names)

    def configurations(self) -> dict[str, dict[str, Any]]:
        """Each open engine's recorded configuration (:func:`configuration`), by role."""
        return {role: configuration(b, self.specs[role]) for role, b in self.backends.items()}

    def serving_change(self) -> dict[str, Any]:
        e = self.engines_file
        return {"change": e.change, "declares": list(e.declares), "engines_sha256": e.sha256(),
                "configurations": self.configurations(),
                "specs": {role: spec.as_dict() for role, spec in self.specs.items()}}

    def close(self) -> None:
        for b in self.backends.values():
            b.close()


def check_one_connector(path: Any, specs: dict[str, EngineSpec], arms: list[str]) -> None:
    """Refuse, before any engine starts, what vLLM's one KV connector a process cannot serve when a
    run opens several in-process vLLM engines: tables where some have kvaudit's connector and some
    not (an engine started without it beside one with it fails its first step inside vLLM), and
    arms that load KV through it (the connector serves the KV cache of the engine opened last:
    measured, a reuse arm on the baseline then answered from the candidate's cache, "The film
    grossziplaid", where alone it answers as recompute does)."""
    vllm = {role: spec.options.get("segment_connector", True) is not False
            for role, spec in specs.items() if spec.backend == "vllm"}
    if len(vllm) < 2:
        return
    if len(set(vllm.values())) > 1:
        without = [role for role, on in vllm.items() if not on]
        raise KvauditError(f"{path}: the {' and '.join(without)} table(s) set segment_connector = false and the "
                           "others do not: in-process vLLM engines of one run share the process's KV connector, "
                           "so all of them run with it or all without (set segment_connector = false in every "
                           "vllm table; the segment-reuse arms are then refused)")
    loading = [a for a in arms if get_arm(a).loads_segment_kv]
    if loading:
        raise KvauditError(f"--arms {', '.join(loading)} with {path}: these arms load KV through kvaudit's "
                           f"connector, and the run's {len(vllm)} in-process vLLM engines share one per process; "
                           "audit KV reuse in a run of its own (kvaudit run --backend vllm, without --engines), "
                           "or serve an engine over HTTP (backend = \"openai\")")


def open_engines(engines: EnginesFile, arms: list[str], cache_bytes: int) -> ServingChangeBackend:
    """Open the engines ``arms`` need (the baseline always; the candidate for ``candidate`` and
    ``candidate_again``; the change switched off for ``candidate_off``), refusing an engine whose
    prompts would differ (:func:`check_compatible`)."""
    from kvaudit.runners.registry import BACKENDS

    specs = {"baseline": engines.baseline}
    needed = {get_arm(a).engine for a in arms}
    if "candidate" in needed:
        specs["candidate"] = engines.candidate
    if "candidate_off" in needed:
        specs["candidate_off"] = engines.candidate_off()
    check_one_connector(engines.path, specs, arms)
    backends: dict[str, Backend] = {}
    for role, spec in specs.items():
        entry = BACKENDS[spec.backend]
        defaults = entry.option_defaults()
        try:
            backends[role] = entry.open(spec.model, dtype=spec.dtype, max_new_tokens=spec.max_new_tokens,
                                        cache_bytes=cache_bytes, **{**defaults, **spec.options})
        except KvauditError as e:
            raise KvauditError(f"{engines.path}: the {role} engine: {e}") from None
        except (TypeError, ValueError) as e:  # an engine argument the engine refuses
            raise KvauditError(f"{engines.path}: the {role} engine ({spec.backend}) refused its options: "
                               f"{str(e)[:300]}") from None
        if role != "baseline":
            check_compatible(engines.path, backends["baseline"], backends[role], role)
    return ServingChangeBackend(engines, backends, specs)
