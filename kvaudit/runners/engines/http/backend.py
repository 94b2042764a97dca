"""The HTTP backend: the arms on a serving stack a team deploys, over its OpenAI-compatible API.

``kvaudit run --backend openai --base-url URL --model DIR``: ``DIR`` is a local checkpoint (or
tokenizer) folder of the model the server serves, so kvaudit assembles the prompt ids itself
(:func:`~kvaudit.runners.prompt.assemble`, exactly as in process) and sends **ids, not text**
(:mod:`kvaudit.runners.engines.http.client`). Every arm's record carries what the server reported about
its request in ``ArmResult.engine`` (prompt ids it consumed, cached prompt tokens, model), which
the audit's server checks (:mod:`kvaudit.audit.checks.server`) hold against what the arm was.

Arms, by spec (:mod:`kvaudit.core.arms`), never by name:

no segment source  one full prefill under a fresh ``cache_salt`` (no cache hit is possible), or
                   on the ``--reference-url`` server (caching off) where salts do not isolate.
                   The noise floor's arm runs beside a concurrent filler request. Tenant probes
                   run under a fresh salt (another tenant) right after the request they probe.
``engine_prefix``  the server's prefix cache under one salt for the whole run (one tenant):
                   cold (first arrival), flushed (after ``POST /reset_prefix_cache``: cold
                   again), warm (again right after).
cached segments    ``--reuse-protocol server`` (default): the server's own reuse path. Neutral
                   warm-ups (neutral head + one document, under the run's tenant salt) prime it,
                   then the case is sent under the same salt; what it reused is what it reports
                   as cached. ``--reuse-protocol kvaudit``: a server started with kvaudit's
                   connector (``--kv-transfer-config``); warm-ups save each document's KV and
                   the case loads [head][documents] through ``kv_transfer_params``, re-rotated,
                   exactly as the in-process vLLM backend does (:mod:`kvaudit.runners.engines.vllm.backend`).
                   The identity and no-rotation controls need this protocol: a black box cannot
                   be fed KV built in true context.

Leak probes: vLLM recomputes every prompt that asks for *prompt* log-probabilities (it could not
return them for cached tokens), so candidates are scored by generation instead: for each distinct
candidate prefix, one request of the prompt plus that prefix asks for the log-probabilities of
the candidates' next tokens at the first generated position (vLLM's ``logprob_token_ids``; the
first request alone, the others ``SCORE_IN_FLIGHT`` at a time, for the server to batch), on
the arm's own KV: under ``kvaudit`` the arm's prompt KV is saved by its request and loaded back
by each scoring request (the last one drops it from the store; where the arm fails before that
request is answered, one more request loads and drops it, so a failed case leaves nothing in the
server's budget); under ``server`` the scoring requests share the arm's salt, so the
server reuses what the arm's request left in its cache. A server without ``logprob_token_ids``
records no ``canary_logprobs`` (``info()["candidate_scoring"]`` says so) and the leak-exposure
check says it cannot judge.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvaudit.core.arms import FRESH_ROLES, ArmSpec, get_arm
from kvaudit.core.errors import KvauditError
from kvaudit.core.jsonio import ids_hash
from kvaudit.runners.backend import (
    ArmOutput,
    ArmRequest,
    Backend,
    Decoding,
    build_arm_result,
    capture_source,
    check_concurrent_cases,
    cut_at_eos,
    eos_token_ids,
    logits_from_top,
    model_shape_info,
    noise_filler_ids,
)
from kvaudit.runners.engines.http.client import LOGPROBS, Completion, ServerClient
from kvaudit.runners.engines.http.dialects import LOGPROB_IDS
from kvaudit.runners.prompt import Prompt, Tokenizer, neutral_head_ids
from kvaudit.runners.rope import RopeSpec
from kvaudit.runners.segment_cache import CacheStats

REUSE_PROTOCOLS = ("server", "kvaudit")
# The cache probe's prompt: longer than one cache block of any engine kvaudit knows (vLLM's CPU
# default is 128 tokens; a 96-token probe once found nothing cached on a server that caches):
# a whole block and more for blocks up to 512 tokens, five of the CPU default's. It is prefilled
# twice at every open (1,024 tokens took 2.7 s a request on this 2-core machine's vLLM). A
# server whose blocks are longer shows "nothing cached" and its cache arms are refused, never
# judged on a probe that missed.
PROBE_TOKENS = 640
# Leak-probe scoring requests in flight at once after the first (a probe with 20 candidate names
# asks about 27 prefixes an arm; one after another they were most of a 9-arm audit's requests).
SCORE_IN_FLIGHT = 8

log = logging.getLogger(__name__)


@dataclass
class ClientCache:
    """What the client knows of segment reuse on the server: warm-ups sent and what they found."""

    capacity_bytes: int = 0  # the server's budget is its own; the client does not know it
    stats: CacheStats = field(default_factory=CacheStats)
    saved: dict[str, str | None] = field(default_factory=dict)  # kvaudit protocol: key -> KV fingerprint


def _salt() -> str:
    return uuid.uuid4().hex


def _saved_fingerprints(c: Completion) -> dict[str, str]:
    """key -> KV fingerprint of what kvaudit's connector saved for this request (its response's
    ``kv_transfer_params``; absent where the server's store is not in its engine process)."""
    saved = (c.kv_transfer_params or {}).get("kvaudit_saved") or {}
    return {str(k): str(v[0]) for k, v in saved.items() if isinstance(v, list) and v}


@dataclass
class _ArmRun:
    """What one arm's requests gave: the arm's own completion, its time to first token (the load's
    head request included), prompt tokens reused and found cached, warm-up and head times, the
    segments' KV fingerprints, the salt candidate scoring shares, and the server that answered."""

    run: Completion
    ttft: float
    reused: int
    hit: int = 0
    build_s: float = 0.0
    head_s: float = 0.0
    fps: dict[str, str] = field(default_factory=dict)
    score_salt: str | None = None
    served: ServerClient | None = None


class OpenAIBackend(Backend):
    name = "openai"

    def __init__(self, client: ServerClient, hf_tokenizer: Any, model_dir: Path, fingerprint: str, *,
                 decoding: Decoding | None = None, reuse_protocol: str = "server",
                 reference: ServerClient | None = None, dtype: str = "float32",
                 concurrent_cases: int = 1) -> None:
        from transformers import AutoConfig

        if reuse_protocol not in REUSE_PROTOCOLS:
            raise KvauditError(f"--reuse-protocol must be one of {', '.join(REUSE_PROTOCOLS)}, got {reuse_protocol!r}")
        check_concurrent_cases(concurrent_cases)
        self.concurrent_cases = concurrent_cases
        self.groups: Counter[int] = Counter()  # how many cases each arm's requests ran for, together
        self._lock = threading.Lock()  # the client-side cache statistics, updated from several threads
        self._flush_lock = threading.Lock()  # a cache reset and its request, one case at a time
        self._count_lock = threading.Lock()
        self.client = client
        self.reference = reference
        self.tok = Tokenizer(hf_tokenizer)
        self.model_dir = model_dir
        self.fingerprint = fingerprint
        self.decoding = decoding or Decoding()
        self.reuse_protocol = reuse_protocol
        self.dtype = dtype
        self.config = AutoConfig.from_pretrained(model_dir)
        self.rope = RopeSpec.from_config(self.config)
        self.cache = ClientCache()
        self.eos = eos_token_ids(model_dir, hf_tokenizer)
        self.vocab = max(int(self.config.vocab_size), len(hf_tokenizer))
        self.neutral_head = neutral_head_ids(self.tok)
        self.neutral_hash = ids_hash(self.neutral_head)
        # The run's tenant, as two cache chains that must not see each other's KV: the engine-prefix
        # arms' (first arrival means first arrival) and the server's own reuse path's (its warm-ups
        # are shared across cases, as a segment cache is).
        self.prefix_salt = _salt()
        self.reuse_salt = _salt()
        card = client.model_card()
        self.server_card = {k: card.get(k) for k in ("id", "root", "max_model_len", "owned_by")}
        self.server_card["version"] = client.version()  # what a serving-change audit compares
        # vLLM names the context in max_model_len, llama.cpp in meta.n_ctx
        max_len = int(card.get("max_model_len") or (card.get("meta") or {}).get("n_ctx") or 4096)
        self.max_prompt_tokens = max_len - self.decoding.max_new_tokens
        if self.rope.sliding_window:
            self.max_prompt_tokens = min(self.max_prompt_tokens, self.rope.sliding_window)
        self.system_fingerprint: str | None = None
        self.candidate_scoring = "logprob_token_ids at the first generated position, on the arm's own KV"
        self.probe = self._probe_cache()

    # ------------------------------------------------------------------ what the server can do

    def _probe_cache(self) -> dict[str, Any]:
        """What this server shows and how its cache behaves, from requests on one neutral prompt
        long enough to fill a cache block of any engine (up to :data:`PROBE_TOKENS`): salt A, salt A again,
        salt B, and where the dialect has one, a per-request bypass. Refuses, naming what is
        missing, a server whose answers could not be compared (no generated ids, first-token
        log-probabilities not keyed by id) or whose reference could not bypass its cache."""
        ids = self._probe_ids()
        a, b = _salt(), _salt()
        first = self._send(self.client, ids, max_tokens=2, salt=a)
        again = self._send(self.client, ids, max_tokens=1, salt=a)
        other = self._send(self.client, ids, max_tokens=1, salt=b)
        reports = again.cached_tokens is not None
        caching = bool(reports and again.cached_tokens)
        dialect = self.client.dialect
        probe: dict[str, Any] = {
            "dialect": dialect.name,
            "namespace": dialect.namespace if self.client.namespaces else None,
            "reports_cached_tokens": reports,
            "echoes_prompt_ids": first.prompt_ids is not None,
            "generated_ids": bool(first.token_ids),
            "logprobs_keyed_by": first.logprob_keys,
            "caching": caching,
            "salt_isolates": bool(caching and other.cached_tokens == 0),
            "cached_tokens": [first.cached_tokens, again.cached_tokens, other.cached_tokens],
            "prompt_tokens": len(ids),
            "bypass": None,
            "reset": dialect.reset_how,
            "reset_empties": None,  # probed where an arm needs the reset (check_arms)
        }
        where = f"server {self.client.base_url} ({dialect.name})"
        if first.logprob_keys != LOGPROB_IDS:
            keyed = "keyed by text, not token id" if first.logprob_keys else "absent"
            raise KvauditError(f"{where}: its first-token top log-probabilities are {keyed}; kvaudit needs them by "
                               "token id (vLLM: return_tokens_as_token_ids; llama.cpp: logprobs.content[]."
                               "top_logprobs[].id) to compare arms")
        if not reports:
            probe["bypass"] = "unknown: the server reports no cached tokens (server_cache_evidence cannot judge)"
        elif not caching:
            probe["bypass"] = "nothing cached"
        elif probe["salt_isolates"]:
            probe["bypass"] = f"fresh {dialect.namespace}"
        elif dialect.bypass_how:
            bypassed = self._send(self.client, ids, max_tokens=1, salt=a, bypass=True)
            if bypassed.cached_tokens == 0:
                probe["bypass"] = dialect.bypass_how
        if probe["bypass"] is None and self.reference is not None:
            probe["bypass"] = "the reference server (--reference-url)"
        if probe["bypass"] is None:
            raise KvauditError(
                f"{where} caches but does not isolate {self._namespace_words()} (a second namespace found {other.cached_tokens} cached "
                "tokens) and has no per-request cache bypass kvaudit knows: the reference arm cannot bypass its "
                "cache; start a second server with caching off and give it as --reference-url")
        if self.reference is not None:
            ref = self._send(self.reference, ids, max_tokens=1, salt=a)
            ref_again = self._send(self.reference, ids, max_tokens=1, salt=a)
            if ref.logprob_keys != LOGPROB_IDS:
                raise KvauditError(f"reference server {self.reference.base_url} ({self.reference.dialect.name}): "
                                   "its first-token top log-probabilities are not keyed by token id")
            probe["reference_cached_tokens"] = [ref.cached_tokens, ref_again.cached_tokens]
        return probe

    def _namespace_words(self) -> str:
        """What this run separates tenants by, for messages."""
        if self.client.namespaces:
            return self.client.dialect.namespace
        return f"tenants (--no-cache-namespace: no {self.client.dialect.namespace} sent)"

    def _probe_ids(self) -> list[int]:
        """The cache probe's prompt: the neutral head repeated to ``PROBE_TOKENS`` (or the context)."""
        n = max(2, min(PROBE_TOKENS, self.max_prompt_tokens))
        return (self.neutral_head * (1 + n // max(1, len(self.neutral_head))))[:n]

    def _resets_before(self, spec: ArmSpec) -> bool:
        """The arm's request goes right after a cache reset: the flushed arm always, the cold arm
        where salts do not isolate (its first arrival is only first on an emptied cache)."""
        return spec.role == "engine_prefix_flushed" or (spec.role == "engine_prefix" and not self.probe["salt_isolates"])

    def _bypass(self, client: ServerClient) -> bool:
        """Whether a request to ``client`` that must compute every token asks for the dialect's
        per-request bypass (a fresh salt alone does not isolate there)."""
        return client is self.client and self.probe["bypass"] == self.client.dialect.bypass_how

    def _reset_empties(self) -> bool:
        """Probe once that the dialect's cache reset really empties the cache: a prompt, the reset,
        the prompt again (which must find nothing cached)."""
        if self.probe["reset_empties"] is None:
            ids = self._probe_ids()
            salt = _salt()
            self._send(self.client, ids, max_tokens=1, salt=salt)
            with self._flush_lock:
                ok = self.client.reset_cache()
                after = self._send(self.client, ids, max_tokens=1, salt=salt) if ok else None
            self.probe["reset_empties"] = bool(after is not None and after.cached_tokens == 0)
            self.probe["cached_after_reset"] = after.cached_tokens if after is not None else None
        return bool(self.probe["reset_empties"])

    def _cache_hint(self) -> str:
        d, p = self.client.dialect, self.probe
        if not p["reports_cached_tokens"]:
            return (f"reports no cached-token count (usage.prompt_tokens_details.cached_tokens"
                    f"{'; vLLM: --enable-prompt-tokens-details' if d.name in ('vllm', 'openai') else ''})")
        return (f"cached none of a {p['prompt_tokens']}-token prompt sent twice: its prefix cache is off"
                f"{' (vLLM: --enable-prefix-caching)' if d.name in ('vllm', 'openai') else ''}"
                " or caches in blocks longer than the prompt")

    @property
    def prefix_cache_name(self) -> str:  # type: ignore[override]
        return self.client.dialect.prefix_cache

    def check_arms(self, arms: list[str]) -> None:
        """Refuse, before any case runs, arms this server or protocol cannot run, naming the
        capability it lacks (probed at open: :meth:`_probe_cache`)."""
        where = f"{self.client.base_url} ({self.client.dialect.name})"
        isolates = self.probe["salt_isolates"]
        for name in arms:
            spec = get_arm(name)
            if (self.reuse_protocol == "kvaudit" and spec.loads_segment_kv
                    and self.client.dialect.name != "vllm"):
                raise KvauditError(
                    f"--arms: arm {name!r} with --reuse-protocol kvaudit needs a vLLM server started with kvaudit's "
                    f"connector (--kv-transfer-config); {where} is not vLLM")
            if spec.source in ("in_context",) or (spec.source == "neutral" and not spec.rerotate):
                if self.reuse_protocol != "kvaudit":
                    raise KvauditError(
                        f"--arms: arm {name!r} needs --reuse-protocol kvaudit (a server running kvaudit's "
                        "connector): a black-box server cannot be fed segment KV built in true context or "
                        "left unrotated")
            if (self.reuse_protocol == "server" and spec.source in ("neutral", "first_user") and self.probe["caching"]
                    and not isolates):
                raise KvauditError(
                    f"--arms: arm {name!r} measures the server's own reuse of warmed segments, but {where} does not "
                    f"isolate {self._namespace_words()}: what it reports cached could be an exact prefix left by any earlier "
                    "request (this run's other arms, an earlier run, another client), not segment reuse")
            if spec.role in ("engine_prefix", "engine_prefix_warm", "engine_prefix_flushed", "tenant_probe") \
                    and not self.probe["caching"]:
                raise KvauditError(f"--arms: arm {name!r} measures the server's prefix cache, but {where} "
                                   f"{self._cache_hint()}")
            if self._resets_before(spec) and not self._reset_empties():
                why = (f"its cold arm must start from an empty cache, since {self._namespace_words()} does not isolate an earlier "
                       "run's prompts" if spec.role == "engine_prefix" else "it re-runs the prompt on an emptied cache")
                raise KvauditError(
                    f"--arms: arm {name!r} needs the server's cache reset ({why}); {where} "
                    f"{'has no reset kvaudit knows' if not self.client.dialect.reset_how else 'was not emptied by ' + self.client.dialect.reset_how}"
                    f" (a prompt sent after the reset found {self.probe.get('cached_after_reset')} cached tokens)")
            if spec.source == "engine_prefix" and not isolates and self.concurrent_cases > 1:
                raise KvauditError(
                    f"--arms: arm {name!r} on {where}, which does not isolate {self._namespace_words()}, resets the cache before "
                    "its cold request: run it one case at a time (--concurrent-cases 1), or another case's "
                    "request would refill the cache between the reset and the request")

    def info(self) -> dict[str, Any]:
        import torch
        import transformers

        return {
            "backend": self.name,
            "base_url": self.client.base_url,
            "reference_url": self.reference.base_url if self.reference else None,
            "server_model": self.server_card,
            "system_fingerprint": self.system_fingerprint,
            "reuse_protocol": self.reuse_protocol,
            "cache_probe": self.probe,
            "dtype": self.dtype,
            "dtype_source": "as given by --dtype: the server does not report its dtype",
            "threads": None,  # the server's, not ours
            "torch": torch.__version__,  # the client's (tokenizer only)
            "transformers": transformers.__version__,
            "first_logits": f"top-{LOGPROBS} first-token log-probabilities over HTTP",
            "logit_diff_kind": "top_logprobs",
            "logit_diff_top_n": LOGPROBS,
            "candidate_scoring": self.candidate_scoring,
            "batching": {
                "concurrent_cases": self.concurrent_cases,
                "groups": {str(k): v for k, v in sorted(self.groups.items())},
                "how": "each arm runs for a group of concurrent_cases cases at once, one thread per case: each "
                       "case prepares (warm-ups, captures), then every case's request goes to the server "
                       "together, so every arm of a case meets the same concurrency; cache-reset arms "
                       "(prefix_cache_flushed) run their reset and request one case at a time",
                "ttft": "from the request's sending to its first token, with the group's other requests in "
                        "flight" if self.concurrent_cases > 1 else "one request at a time",
            },
            **model_shape_info(self.config, self.rope, self.max_prompt_tokens, self.neutral_hash),
        }

    # ------------------------------------------------------------------ requests

    def _send(self, client: ServerClient, ids: list[int], *, max_tokens: int | None = None,
              salt: str | None = None, transfer: dict[str, Any] | None = None, stream: bool = True,
              bypass: bool = False) -> Completion:
        out = client.complete(ids, max_tokens=max_tokens or self.decoding.max_new_tokens,
                              salt=salt or _salt(), kv_transfer_params=transfer, stop_token_ids=sorted(self.eos),
                              stream=stream, bypass_cache=bypass, top_logprobs=LOGPROBS if self.asks_logprobs else 0)
        self.system_fingerprint = out.extra.get("system_fingerprint", self.system_fingerprint)
        return out

    def _with_filler(self, client: ServerClient, prompt: Prompt) -> Completion:
        """The prompt beside a concurrent filler request, so the server batches it differently."""
        filler = noise_filler_ids(self.neutral_head, prompt)
        bypass = self._bypass(client)
        t = threading.Thread(target=lambda: self._send(client, filler, max_tokens=4, bypass=bypass), daemon=True)
        t.start()
        try:
            return self._send(client, prompt.ids, bypass=bypass)
        finally:
            t.join(timeout=600)

    def _warm_up(self, prompt: Prompt, salt: str | None) -> tuple[list[str], list[int | None], int, float]:
        """Neutral warm-ups (neutral head + one document each); kvaudit protocol: each saves its
        document's KV under a connector key. Returns (keys, cached tokens each warm-up found,
        tokens already saved, seconds spent warming up), this call's own."""
        h = len(self.neutral_head)
        kvaudit = self.reuse_protocol == "kvaudit"
        keys, found, hit, build_s = [], [], 0, 0.0
        for i, uh in enumerate(prompt.segment_hashes):
            unit = prompt.unit_ids(i)
            key = f"seg:{self.fingerprint[:16]}:{self.neutral_hash}:{uh}"
            keys.append(key)
            if kvaudit and key in self.cache.saved:
                with self._lock:
                    self.cache.stats.hits += 1
                    self.cache.stats.hit_tokens += len(unit)
                hit += len(unit)
                continue
            transfer = {"kvaudit": "run", "save": [[key, h, h + len(unit)]]} if kvaudit else None
            # Two tokens: the connector's save report reaches the response one step after the save.
            w = self._send(self.client, self.neutral_head + unit, max_tokens=2, salt=salt, transfer=transfer,
                           stream=False)
            found.append(w.cached_tokens)
            build_s += w.total_s
            with self._lock:
                self.cache.stats.builds += 1
                self.cache.stats.build_s += w.total_s
            if kvaudit:
                self.cache.saved[key] = _saved_fingerprints(w).get(key)
        return keys, found, hit, build_s

    def _load(self, prompt: Prompt, seg_keys: list[str], rerotate: bool, drop: list[str],
              salt: str | None = None, save: list[list[Any]] | None = None) -> tuple[Completion, Completion]:
        """kvaudit protocol: the head prefilled fresh at position 0 by its own request, then the
        prompt with [head][segments] loaded by the connector (the tail computed by the server)."""
        head_key = f"tmp:head:{uuid.uuid4().hex[:12]}"
        head = self._send(self.client, prompt.ids[: prompt.head_len], max_tokens=1,
                          transfer={"kvaudit": "run", "save": [[head_key, 0, prompt.head_len]]})
        plan = [[head_key, 0, False]] + [[k, s, rerotate] for (s, _), k in zip(prompt.spans, seg_keys)]
        transfer: dict[str, Any] = {"kvaudit": "run", "n_load": prompt.tail_start, "plan": plan,
                                    "drop": [head_key, *drop]}
        if save:
            transfer["save"] = save
        run = self._send(self.client, prompt.ids, salt=salt, transfer=transfer)
        return head, run

    def _score(self, prompt: Prompt, candidates: list[str], *, salt: str | None,
               arm_key: str | None, held: set[str] | None = None) -> dict[str, float] | None:
        """Teacher-forced log-probability of each candidate as the whole answer, on the arm's KV
        (``arm_key``: the kvaudit connector entry of its prompt's first n-1 tokens; the last
        request drops it, and takes it out of ``held`` once answered). ``None`` where the server
        cannot return log-probabilities of chosen token ids."""
        n = len(prompt.ids)
        cand_ids = {c: self.tok.encode(c) for c in dict.fromkeys(candidates)}
        need: dict[tuple[int, ...], set[int]] = defaultdict(set)
        for ids in cand_ids.values():
            for j, t in enumerate(ids):
                need[tuple(ids[:j])].add(t)
        got: dict[tuple[int, ...], dict[int, float]] = {}
        prefixes = list(need)
        # Without the arm's own KV to load: one salt for the candidates of this arm and case. The
        # first request computes the prompt under a salt no other request used (a fresh prefill, as
        # the arm's own where no salt is given), and the others find its blocks in the server's
        # prefix cache instead of prefilling the whole prompt again for every candidate prefix.
        # With it, each request loads the arm's KV through the connector under a salt of its own:
        # vLLM's prefix cache must not serve those tokens first.
        shared = salt or (_salt() if arm_key is None else None)

        def ask(i: int) -> Completion:
            transfer = None
            if arm_key is not None:
                transfer = {"kvaudit": "run", "n_load": n - 1, "plan": [[arm_key, 0, False]],
                            "drop": [arm_key] if i == len(prefixes) - 1 else []}
            return self.client.complete(prompt.ids + list(prefixes[i]), max_tokens=1, salt=shared or _salt(),
                                        kv_transfer_params=transfer, logprob_token_ids=sorted(need[prefixes[i]]),
                                        stream=False)

        def scored(i: int, c: Completion) -> bool:
            if arm_key is not None and c.cached_tokens is not None and c.cached_tokens < n - 1:
                raise KvauditError(f"the server loaded {c.cached_tokens} of the arm's {n - 1} prompt tokens when "
                                   "scoring leak-probe candidates: they would be scored on recomputed KV")
            missing = need[prefixes[i]] - set(c.first_lp)
            if missing:
                self.candidate_scoring = (f"unavailable: the server returned no log-probability for the requested "
                                          f"token ids {sorted(missing)[:3]} (logprob_token_ids unsupported?)")
                return False
            got[prefixes[i]] = c.first_lp
            return True

        def dropped() -> None:
            if held is not None and arm_key is not None:
                held.discard(arm_key)

        try:
            first = ask(0)
        except KvauditError as e:
            if "logprob_token_ids" in str(e):
                self.candidate_scoring = f"unavailable: the server refused logprob_token_ids ({e})"
                return None
            raise
        if len(prefixes) == 1:
            dropped()
        if not scored(0, first):
            return None
        # The first request has left the prompt in the server's cache and shown that the server
        # scores; the others are independent, so they go SCORE_IN_FLIGHT at a time and the server
        # batches them. The one that drops the arm's KV goes last, alone.
        middle = range(1, len(prefixes) - 1)
        with ThreadPoolExecutor(max_workers=SCORE_IN_FLIGHT, thread_name_prefix="kvaudit-score") as pool:
            answers = list(zip(middle, pool.map(ask, middle)))
        if len(prefixes) > 1:
            answers.append((len(prefixes) - 1, ask(len(prefixes) - 1)))
            dropped()
        if not all(scored(i, c) for i, c in answers):
            return None
        return {c: sum(got[tuple(ids[:j])][t] for j, t in enumerate(ids)) for c, ids in cand_ids.items()}

    # ------------------------------------------------------------------ arms

    def run_arm(self, prompt: Prompt, spec: ArmSpec, *, capture_prompt: Prompt | None = None,
                candidates: list[str] | None = None) -> ArmOutput:
        with self._count_lock:  # a replay's arrivals send from several threads
            self.groups[1] += 1
        return self._run_arm(prompt, spec, capture_prompt, candidates, lambda: None)

    def run_arms(self, spec: ArmSpec, reqs: list[ArmRequest]) -> list[ArmOutput]:
        """One arm for a group of cases, one thread per case: each prepares, waits until every case
        has, then sends its request with the others in flight (a barrier), then scores its
        candidates."""
        if len(reqs) == 1:
            r = reqs[0]
            return [self.run_arm(r.prompt, spec, capture_prompt=r.capture_prompt, candidates=r.candidates)]
        self.groups[len(reqs)] += 1
        t0, ready = time.perf_counter(), []
        # no case waits forever on one that hangs; the action marks when every case had prepared
        barrier = threading.Barrier(len(reqs), action=lambda: ready.append(time.perf_counter()), timeout=3600)

        def one(r: ArmRequest) -> ArmOutput:
            try:
                return self._run_arm(r.prompt, spec, r.capture_prompt, r.candidates, barrier.wait)
            except BaseException:
                barrier.abort()  # the others stop waiting for a case that will not come
                raise

        with ThreadPoolExecutor(max_workers=len(reqs), thread_name_prefix="kvaudit-case") as pool:
            futures = [pool.submit(one, r) for r in reqs]
            errors = [f.exception() for f in futures]
        failed = [e for e in errors if e is not None]
        if failed:  # the case that failed, not the ones it left waiting at the barrier
            raise next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), failed[0])
        outs = [f.result() for f in futures]
        # The cases prepared side by side: what the group spent building segment KV is the wall
        # time until all were ready, not the sum of each case's own (overlapping) warm-ups.
        built = sum(o.build_s for o in outs)
        if built > 0 and ready:
            for o in outs:
                o.build_s *= (ready[0] - t0) / built
        return outs

    def _computed(self, prompt: Prompt, spec: ArmSpec, engine: dict[str, Any], save: list | None,
                  gate: Callable[[], Any]) -> _ArmRun:
        """An arm with no segment source: every token computed (a fresh salt, the dialect's bypass or
        the reference server), beside a filler where it perturbs the batch; a tenant probe of the
        connector sends the reuse arm's own load plan."""
        fresh = spec.role in FRESH_ROLES
        client = self.reference if (self.reference and fresh) else self.client
        bypass = fresh and self._bypass(client)
        if client is self.reference:
            engine["salt"] = "reference server"
        elif bypass:
            engine["salt"] = "fresh"
            engine["bypass"] = self.client.dialect.bypass_how
        if spec.role == "segment_tenant_probe" and self.reuse_protocol == "kvaudit":
            # Another tenant sends the reuse arm's own load plan: the connector's keys are
            # content hashes anyone can compute; only a tenant-scoped store would refuse them.
            keys, _, _, _ = self._warm_up(prompt, None)
            gate()
            head, run = self._load(prompt, keys, True, [], salt=_salt())
            return _ArmRun(run, head.total_s + run.ttft_s, run.cached_tokens or 0, served=client)
        gate()
        if spec.perturbs_batch:
            run = self._with_filler(client, prompt)
        else:
            run = self._send(client, prompt.ids, transfer={"kvaudit": "run", "save": save} if save else None,
                             bypass=bypass)
        return _ArmRun(run, run.ttft_s, run.cached_tokens or 0, served=client)

    def _prefix_cached(self, prompt: Prompt, spec: ArmSpec, engine: dict[str, Any], gate: Callable[[], Any]) -> _ArmRun:
        """An engine-prefix arm: the prompt under the run's one tenant salt, after a cache reset where
        the arm needs one."""
        engine["salt"] = "tenant"
        gate()
        # Where salts do not isolate, a first arrival is only first after a reset: the cache may
        # hold this prompt from an earlier run or from this run's other arms.
        if self._resets_before(spec):
            with self._flush_lock:  # a reset while another case's request runs would not be a flush
                engine["cache_reset"] = self.client.reset_cache()
                if not engine["cache_reset"]:
                    raise KvauditError(f"server {self.client.base_url} refused its cache reset "
                                       f"({self.client.dialect.reset_how})")
                run = self._send(self.client, prompt.ids, salt=self.prefix_salt)
        else:
            run = self._send(self.client, prompt.ids, salt=self.prefix_salt)
        hit = run.cached_tokens or 0
        return _ArmRun(run, run.ttft_s, hit, hit)

    def _server_reuse(self, prompt: Prompt, spec: ArmSpec, capture_prompt: Prompt | None, engine: dict[str, Any],
                      gate: Callable[[], Any]) -> _ArmRun:
        """The server's own reuse path, primed under the run's tenant salt: neutral warm-ups, or
        (the unsafe capture policy) the first user's own request."""
        engine["salt"] = "tenant"
        src = capture_source(spec, prompt, capture_prompt)
        if src is None:
            _, engine["warmup_cached_tokens"], _, build_s = self._warm_up(prompt, self.reuse_salt)
        else:
            build_s = self._send(self.client, src.ids, salt=self.reuse_salt).total_s
        gate()
        run = self._send(self.client, prompt.ids, salt=self.reuse_salt)
        hit = run.cached_tokens or 0
        return _ArmRun(run, run.ttft_s, hit, hit, build_s=build_s, score_salt=self.reuse_salt)

    def _connector_reuse(self, prompt: Prompt, spec: ArmSpec, capture_prompt: Prompt | None, save: list | None,
                         gate: Callable[[], Any]) -> _ArmRun:
        """Cached segments through kvaudit's connector: neutral warm-ups (or a capture from the first
        user's request) save each document's KV; the prompt loads [head][documents], re-rotated."""
        src = capture_source(spec, prompt, capture_prompt)
        hit = 0
        if src is None:  # neutral warm-ups
            seg_keys, _, hit, build_s = self._warm_up(prompt, None)
            fp_of: dict[str, str | None] = dict(self.cache.saved)
            drop: list[str] = []
        else:
            tag = uuid.uuid4().hex[:12]
            seg_keys = [f"tmp:cap:{tag}:{i}" for i in range(len(src.spans))]
            cap = self._send(self.client, src.ids, max_tokens=2, stream=False, transfer={
                "kvaudit": "run", "save": [[k, s, e] for k, (s, e) in zip(seg_keys, src.spans)]})
            build_s = cap.total_s
            fp_of = dict(_saved_fingerprints(cap))
            drop = list(seg_keys)
        gate()
        head, run = self._load(prompt, seg_keys, bool(spec.rerotate), drop, save=save)
        if run.cached_tokens is not None and run.cached_tokens < prompt.tail_start:
            raise KvauditError(f"arm {spec.name}: the server loaded {run.cached_tokens} tokens through "
                               f"kvaudit's connector, expected {prompt.tail_start}; is it running with "
                               "kvaudit's --kv-transfer-config?")
        fps = {sid: fp for sid, k in zip(prompt.segment_ids, seg_keys) if (fp := fp_of.get(k))}
        return _ArmRun(run, head.total_s + run.ttft_s, prompt.tail_start - prompt.head_len, hit, build_s=build_s,
                       head_s=head.total_s, fps=fps)

    def _run_arm(self, prompt: Prompt, spec: ArmSpec, capture_prompt: Prompt | None,
                 candidates: list[str] | None, gate: Callable[[], Any]) -> ArmOutput:
        """One arm on one case; ``gate()`` is called once the case is prepared, right before its
        request (the barrier of a group, or nothing)."""
        n = len(prompt.ids)
        # Candidates are scored on the arm's own KV: under kvaudit its prompt KV is saved here.
        arm_key = f"tmp:arm:{uuid.uuid4().hex[:12]}" if candidates and self.reuse_protocol == "kvaudit" else None
        save = [[arm_key, 0, n - 1]] if arm_key else None
        engine: dict[str, Any] = {"salt": "fresh"}
        held = {arm_key} if arm_key else set()  # saved by the arm's request, until a scoring request drops it
        try:
            a = self._serve_arm(prompt, spec, capture_prompt, engine, save, gate)
            canary = self._score(prompt, candidates, salt=a.score_salt, arm_key=arm_key, held=held) \
                if candidates else None
        finally:
            for key in held:
                self._drop_quietly(prompt, key)
        run, served = a.run, a.served or self.client
        engine.update({
            "prompt_ids_hash": ids_hash(run.prompt_ids) if run.prompt_ids is not None else None,
            "prompt_tokens": run.prompt_tokens,
            "cached_tokens": run.cached_tokens,
            "model": run.model,
            "finish_reason": run.finish_reason,
        })
        top = sorted(run.first_lp.items(), key=lambda kv: -kv[1])[: self.decoding.top_k_logits]
        if len(top) < 2 and self.asks_logprobs:
            raise KvauditError(f"server {served.base_url} returned {len(top)} first-token log-probabilities "
                               "(kvaudit needs the top-k: logprobs and return_tokens_as_token_ids)")
        res = build_arm_result(spec, prompt, self.tok, self.decoding, answer_ids=cut_at_eos(run.token_ids, self.eos),
                               top=top, ttft_s=a.ttft, decode_s=max(0.0, run.total_s - run.ttft_s),
                               tokens_reused=a.reused, cache_hit_tokens=a.hit, fingerprints=a.fps, canary=canary,
                               engine=engine)
        return ArmOutput(result=res, first_logits=logits_from_top(run.first_lp, self.vocab), build_s=a.build_s,
                         head_s=a.head_s, head_prefilled=a.head_s > 0)

    def _serve_arm(self, prompt: Prompt, spec: ArmSpec, capture_prompt: Prompt | None, engine: dict[str, Any],
                   save: list | None, gate: Callable[[], Any]) -> _ArmRun:
        """The arm's own requests, by its spec (``engine`` collects what they report)."""
        if spec.source is None:
            return self._computed(prompt, spec, engine, save, gate)
        if spec.source == "engine_prefix":
            return self._prefix_cached(prompt, spec, engine, gate)
        if self.reuse_protocol != "kvaudit" and spec.source in ("neutral", "first_user"):
            return self._server_reuse(prompt, spec, capture_prompt, engine, gate)
        return self._connector_reuse(prompt, spec, capture_prompt, save, gate)

    def _drop_quietly(self, prompt: Prompt, key: str) -> None:
        """Load the arm's saved KV into one more request that drops it: the arm failed before a
        scoring request dropped it. Best effort (the arm's own error is the one to report); an
        entry that was never saved, or was already dropped, fails this request and nothing else."""
        try:
            self.client.complete(prompt.ids, max_tokens=1, salt=_salt(), stream=False, kv_transfer_params={
                "kvaudit": "run", "n_load": len(prompt.ids) - 1, "plan": [[key, 0, False]], "drop": [key]})
        except Exception as e:  # noqa: BLE001 - the failure being unwound is the one to raise
            log.warning("could not drop the arm's saved KV %s from the server's store: %s", key, e)

    def reset_caches(self) -> None:
        """New salts for the run's tenant and reuse requests (nothing cached under the old ones is
        theirs where salts isolate), and the server's prefix cache reset where it allows one."""
        self.prefix_salt, self.reuse_salt = _salt(), _salt()
        self.client.reset_cache()

    def close(self) -> None:
        self.client.close()
        if self.reference is not None:
            self.reference.close()


def open_openai_backend(model: str = "smollm2", *, dtype: str = "float32", max_new_tokens: int = 24,
                        cache_bytes: int = 0, base_url: str | None = None, reference_url: str | None = None,
                        served_model: str | None = None, reuse_protocol: str = "server",
                        timeout_s: float = 300.0, concurrent_cases: int = 1,
                        cache_namespace: bool = True) -> OpenAIBackend:
    """Connect to the server at ``base_url``; ``model`` is the local checkpoint or tokenizer
    folder of the model it serves (ids are assembled here)."""
    import os

    from transformers import AutoTokenizer

    from kvaudit.models import model_fingerprint, resolve_model_dir

    if not base_url:
        raise KvauditError("--backend openai needs --base-url (the server, e.g. http://127.0.0.1:8000)")
    path = resolve_model_dir(model)
    api_key = os.environ.get("KVAUDIT_API_KEY") or os.environ.get("OPENAI_API_KEY")
    client = ServerClient(base_url, model=served_model, timeout_s=timeout_s, api_key=api_key,
                          namespaces=cache_namespace)
    reference = ServerClient(reference_url, model=served_model, timeout_s=timeout_s, api_key=api_key) \
        if reference_url else None
    return OpenAIBackend(client, AutoTokenizer.from_pretrained(path), path, model_fingerprint(path),
                         decoding=Decoding(max_new_tokens=max_new_tokens), reuse_protocol=reuse_protocol,
                         reference=reference, dtype=dtype, concurrent_cases=concurrent_cases)
