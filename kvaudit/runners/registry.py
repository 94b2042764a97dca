"""Backends by name, each with its own CLI options.

``kvaudit run --backend NAME`` opens :data:`BACKENDS` ``[NAME]``: its opener (``target``, ``module:function``,
imported only when chosen, so vLLM is never imported for the transformers backend) is called with
the options every backend takes (:data:`COMMON`) and the backend's own :class:`Option` values. An
option that belongs to another backend is refused with a :class:`~kvaudit.core.errors.KvauditError`
naming it, never silently ignored. Adding a backend: write a class that satisfies
:class:`~kvaudit.runners.backend.Backend` and an opener, and add one :class:`BackendEntry` here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvaudit.core.arms import ArmSpec, get_arm, parse_arms
from kvaudit.core.errors import KvauditError
from kvaudit.core.registry import Entry, Registry
from kvaudit.runners.backend import Backend, check_concurrent_cases

# Keyword arguments every opener takes (from `kvaudit run`'s common options).
COMMON = ("dtype", "max_new_tokens", "cache_bytes")


def option_dest(flag: str) -> str:
    """Where argparse keeps a backend option's value (``--max-model-len`` -> ``opt_max_model_len``)."""
    return "opt_" + flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class Option:
    """One backend-specific CLI option. ``param`` is the opener's keyword; ``value`` set means a
    flag without an argument that passes ``value`` when given."""

    flag: str
    param: str
    default: Any
    help: str
    type: Any = None
    value: Any = None
    check: Callable[[Any], None] | None = None  # raises KvauditError for a bad value, before any work

    @property
    def dest(self) -> str:
        return option_dest(self.flag)


@dataclass(frozen=True)
class BackendEntry(Entry):
    """A backend: ``target`` is its opener (``module:function``), ``options`` its own CLI options,
    ``arms`` the arms beyond the portable ones it runs (a repair family as ``"blend@*"``)."""

    options: tuple[Option, ...] = ()
    arms: tuple[str, ...] = ()

    def runs(self, spec: ArmSpec) -> bool:
        return spec.portable or spec.name in self.arms or f"{spec.repair}@*" in self.arms

    def open(self, model: str, **kwargs: Any) -> Backend:
        return self.load()(model, **kwargs)

    def option_defaults(self) -> dict[str, Any]:
        """Its options' defaults, by their opener's names."""
        return {o.param: o.default for o in self.options}


# One option two backends take (listed once in --help, under the first).
CONCURRENT_CASES = Option("--concurrent-cases", "concurrent_cases", 1,
                          "run each arm for N cases at once, their requests in flight together (default 1; recorded "
                          "in the manifest and the run's identity)", type=int,
                          check=check_concurrent_cases)

BACKENDS: Registry[BackendEntry] = Registry("backend", (
    BackendEntry("transformers", "kvaudit.runners.engines.transformers.backend:open_backend",
                 "Hugging Face transformers, in process (the default)", (
                     Option("--device", "device", "cpu", "torch device (default cpu)", type=str),
                     Option("--threads", "threads", None, "torch CPU threads (recorded in the manifest)",
                            type=int),
                 ), arms=("blend@*", "epic@*")),
    BackendEntry("vllm", "kvaudit.runners.engines.vllm.backend:open_vllm_backend",
                 "vLLM with kvaudit's KV connector (needs .venv-vllm; see docs/vllm.md)", (
                     Option("--tensor-parallel-size", "tensor_parallel_size", 1, "default 1", type=int),
                     Option("--pipeline-parallel-size", "pipeline_parallel_size", 1, "default 1", type=int),
                     Option("--max-model-len", "max_model_len", 4096, "default 4096", type=int),
                     Option("--no-enforce-eager", "enforce_eager", True,
                            "allow CUDA graphs (eager is the default)", value=False),
                     Option("--batch-invariant", "batch_invariant", False, "set VLLM_BATCH_INVARIANT=1",
                            value=True),
                     CONCURRENT_CASES,
                 ), arms=("prefix_cache_cold", "prefix_cache")),
    BackendEntry("openai", "kvaudit.runners.engines.http.backend:open_openai_backend",
                 "any OpenAI-compatible completions server over HTTP (see docs/engines.md)", (
                     Option("--base-url", "base_url", None, "the server, e.g. http://127.0.0.1:8000", type=str),
                     Option("--reference-url", "reference_url", None,
                            "a second server with caching off for the reference arms (where the first "
                            "does not isolate cache_salt)", type=str),
                     Option("--served-model", "served_model", None,
                            "the model name the server serves (default: the first of /v1/models)", type=str),
                     Option("--reuse-protocol", "reuse_protocol", "server",
                            "server (the server's own reuse, primed by neutral warm-ups; default) or kvaudit "
                            "(a server running kvaudit's connector, driven by kv_transfer_params)", type=str),
                     Option("--no-cache-namespace", "cache_namespace", True,
                            "send no cache namespace (cache_salt, SGLang's extra_key) with any request: audit a "
                            "deployment whose clients share one cache (tenant isolation then shows what one "
                            "tenant's prompt gives the next)", value=False),
                     Option("--request-timeout", "timeout_s", 300.0, "seconds per request (default 300)",
                            type=float),
                     CONCURRENT_CASES,
                 ), arms=("prefix_cache_cold", "prefix_cache_flushed", "prefix_cache",
                          "prefix_cache_other_tenant", "reuse_other_tenant")),
))
DEFAULT_BACKEND = "transformers"


def add_backend_arguments(p: argparse.ArgumentParser, default: str | None = DEFAULT_BACKEND) -> None:
    """``--backend`` and one argument group of options per registered backend (``default`` None:
    the caller fills in :data:`DEFAULT_BACKEND`, telling a flag given apart from one left out)."""
    p.add_argument("--backend", default=default, choices=list(BACKENDS),
                   help="; ".join(f"{b.name}: {b.help}" for b in BACKENDS.values()))
    seen: dict[str, list[str]] = {}
    for b in BACKENDS.values():
        for o in b.options:
            seen.setdefault(o.flag, []).append(b.name)
    added: set[str] = set()
    for b in BACKENDS.values():
        if not b.options:
            continue
        g = p.add_argument_group(f"{b.name} options (with --backend {b.name}; recorded in the manifest)")
        for o in b.options:
            if o.flag in added:  # an option several backends take is listed once, under the first
                continue
            added.add(o.flag)
            if len(seen[o.flag]) > 1:
                o = replace(o, help=f"{o.help} (--backend {', '.join(seen[o.flag])})")
            # default None: an option given on the command line is told apart from one left out
            if o.value is not None:
                g.add_argument(o.flag, dest=o.dest, action="store_const", const=o.value, default=None, help=o.help)
            else:
                g.add_argument(o.flag, dest=o.dest, type=o.type, default=None, help=o.help)


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The chosen backend's option values (defaults filled in); refuses another backend's options."""
    chosen = BACKENDS[args.backend]
    for b in BACKENDS.values():
        if b.name == chosen.name:
            continue
        mine = {o.flag for o in chosen.options}
        for o in b.options:
            if o.flag not in mine and getattr(args, o.dest, None) is not None:
                raise KvauditError(f"{o.flag} is an option of --backend {b.name}; --backend {chosen.name} "
                                   "does not take it")
    out = {}
    for o in chosen.options:
        v = getattr(args, o.dest, None)
        if v is not None and o.check is not None:
            o.check(v)
        out[o.param] = o.default if v is None else v
    return out


def engine_flags_given(args: argparse.Namespace, single_engine: dict[str, str]) -> list[str]:
    """The engine flags given on the command line: ``single_engine`` (attribute -> flag) and every
    backend's options (refused beside an engines file, which sets them all)."""
    given = [flag for key, flag in single_engine.items() if getattr(args, key) is not None]
    return given + [o.flag for b in BACKENDS.values() for o in b.options if getattr(args, o.dest, None) is not None]


def given_option(args: argparse.Namespace, flag: str) -> Any:
    """The value of backend option ``flag`` as given on the command line; None where left out."""
    return getattr(args, option_dest(flag), None)


def open_from_args(args: argparse.Namespace, **common: Any) -> Backend:
    """Open the backend ``args.backend`` names with ``common`` (:data:`COMMON`) and its own options."""
    missing = [k for k in COMMON if k not in common]
    if missing:
        raise TypeError(f"open_from_args needs {', '.join(missing)}")
    return BACKENDS[args.backend].open(args.model, **common, **backend_options(args))


def check_arms_run_on(arms: list[str] | set[str], backend: str) -> None:
    """Refuse arms ``backend`` does not run (a backend outside the registry runs the portable
    ones), naming the backends that do."""
    entry = BACKENDS.get(backend)
    for a in arms:
        spec = get_arm(a)
        if entry.runs(spec) if entry is not None else spec.portable:
            continue
        able = [b.name for b in BACKENDS.values() if b.runs(spec)]
        what = "its selective recompute is implemented there only" if spec.repair else "it measures that engine's own cache"
        raise KvauditError(f"--arms: arm {a!r} needs --backend {' or '.join(able)} ({what}), not {backend}")


def arms_for(text: str, backend: str) -> list[str]:
    """``--arms`` parsed (:func:`kvaudit.core.arms.parse_arms`) and checked for ``backend``."""
    arms = parse_arms(text)
    check_arms_run_on(arms, backend)
    return arms
