"""Engine dialects: how each serving engine's OpenAI-compatible server is asked and read, one place each.

Servers that all answer ``/v1/completions`` differ where an audit depends on them: where the
generated token ids and the first token's top log-probabilities sit in a response (vLLM:
``choices[].token_ids`` and ``logprobs.top_logprobs[0]`` keyed ``"token_id:N"``; llama.cpp:
``logprobs.content[]`` with ``id`` and ``top_logprobs[{id, logprob}]``), how one request bypasses
the cache (vLLM: a fresh ``cache_salt``, which it isolates; llama.cpp: ``cache_prompt: false``),
how the whole cache is emptied (vLLM: ``POST /reset_prefix_cache``; llama.cpp: erase every slot),
and what the cache is called in a report. A dialect declares these; what the server really does
(salts isolate, cached tokens reported, the reset empties the cache) is probed at open by the
backend and recorded in the manifest, never assumed from the dialect.

SGLang is asked on its native ``/generate`` instead (its OpenAI endpoints key first-token
log-probabilities by text): ``input_ids`` in; ``output_ids`` and ``meta_info`` out, with
``cached_tokens`` and the top log-probabilities as ``(logprob, token id, text)`` tuples; a cache
namespace per request (``extra_key``: radix keys of different namespaces never share nodes);
``logprob_start_len: 0`` to compute every prompt token (SGLang caps its prefix match at the
log-probability start); ``POST /flush_cache`` to empty the radix tree. Its stream is cumulative
by default (each chunk carries every id so far) or incremental (``--incremental-streaming-output``):
both are read, told apart by ``meta_info.completion_tokens``.

The dialect is chosen by what ``/v1/models`` says owns the model (vLLM ``"vllm"``, llama.cpp
``"llamacpp"``, SGLang ``"sglang"``); any other server is read as vLLM's OpenAI shape
(``openai``), and the probe refuses it where that reading finds no token ids.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import httpx

from kvaudit.core.errors import KvauditError

if TYPE_CHECKING:
    from kvaudit.runners.engines.http.client import _Response

LOGPROBS = 20  # top log-probabilities asked for (vLLM's default --max-logprobs)

# What a response's first-token log-probabilities are keyed by.
LOGPROB_IDS = "token ids"
LOGPROB_TEXT = "text"  # e.g. SGLang's OpenAI server: unusable, a text can be several ids


def _token_id(key: str) -> int | None:
    if key.startswith("token_id:"):
        try:
            return int(key.split(":", 1)[1])
        except ValueError:
            return None
    return None


class Dialect:
    """An OpenAI-compatible server read as vLLM's response shape, with no cache controls known."""

    name = "openai"
    path = "/v1/completions"  # where a completion is asked for
    version_path = "/version"  # a GET answering {"version": ...} (vLLM); llama.cpp has none
    namespace = "cache_salt"  # the request field that names its cache namespace (a tenant)
    prefix_cache = "the server's own prefix cache"
    cache_flags = "prefix caching on, cached tokens reported in usage.prompt_tokens_details"
    reset_how: str | None = None  # how the whole cache is emptied; None: no way known
    bypass_how: str | None = None  # how one request bypasses the cache; None: a fresh cache_salt only
    logprobs_for_ids = 0  # top log-probabilities a request must ask for its generated ids to be shown

    def request(self, model: str, ids: list[int], *, max_tokens: int, salt: str | None,
                kv_transfer_params: dict[str, Any] | None, stop_token_ids: list[int] | None, stream: bool,
                logprob_token_ids: list[int] | None, bypass_cache: bool, top_logprobs: int = LOGPROBS) -> dict[str, Any]:
        """The body of one greedy completion of ``ids``: the first token's ``top_logprobs`` best
        log-probabilities by id (none asked where 0, a replay's requests), the generated and prompt
        ids shown, cached tokens reported."""
        body: dict[str, Any] = {
            "model": model, "prompt": list(ids), "max_tokens": max_tokens, "temperature": 0.0,
            "return_token_ids": True, "return_tokens_as_token_ids": True, "skip_special_tokens": True,
            "stream": stream,
        }
        top_logprobs = max(top_logprobs, self.logprobs_for_ids)
        if top_logprobs:
            body["logprobs"] = top_logprobs
        if stream:
            body["stream_options"] = {"include_usage": True}
        if logprob_token_ids:  # vLLM: the log-probabilities of exactly these ids at the first position
            body["logprob_token_ids"] = sorted(set(logprob_token_ids))
        if salt is not None:
            body["cache_salt"] = salt
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        if stop_token_ids:
            body["stop_token_ids"] = sorted(stop_token_ids)
        return self.body(body, bypass_cache=bypass_cache)

    def body(self, body: dict[str, Any], *, bypass_cache: bool) -> dict[str, Any]:
        """The request body with this engine's own fields (``bypass_cache``: compute every token)."""
        return body

    def absorb(self, r: _Response, chunk: dict[str, Any]) -> None:
        """Read one chunk of the response (a whole response is one chunk of the same shape)."""
        if "error" in chunk:
            r.error = chunk["error"]
            return
        r.model = chunk.get("model", r.model)
        if chunk.get("system_fingerprint"):
            r.extra["system_fingerprint"] = chunk["system_fingerprint"]
        usage = chunk.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            r.cached = int(details["cached_tokens"])
        if usage.get("completion_tokens") is not None:
            r.completion_tokens = int(usage["completion_tokens"])
        if usage.get("prompt_tokens") is not None:
            r.prompt_tokens = int(usage["prompt_tokens"])
        r.kvp = chunk.get("kv_transfer_params", r.kvp)
        for ch in chunk.get("choices") or []:
            if ch.get("prompt_token_ids") is not None and r.prompt_ids is None:
                r.prompt_ids = [int(t) for t in ch["prompt_token_ids"]]
            new, top, keys = self.read_choice(ch)
            r.text += ch.get("text") or ""
            if new is not None:
                r.ids_shown = True
            r.add_tokens(new or [])
            if keys is not None and r.logprob_keys is None:
                r.logprob_keys = keys
                r.first_lp = top
            r.finish = ch.get("finish_reason") or r.finish

    def read_choice(self, ch: dict[str, Any]) -> tuple[list[int] | None, dict[int, float] | None, str | None]:
        """One choice of one chunk: (generated ids, or None where the chunk carries none;
        the top log-probabilities of its first token by id, or None; what they are keyed by)."""
        ids = ch.get("token_ids")
        lps = (ch.get("logprobs") or {}).get("top_logprobs") or []
        if not lps or not lps[0]:
            return ([int(t) for t in ids] if ids is not None else None), None, None
        top = {tid: float(v) for k, v in lps[0].items() if (tid := _token_id(k)) is not None}
        return ([int(t) for t in ids] if ids is not None else None), (top or None), (LOGPROB_IDS if top else LOGPROB_TEXT)

    def reset(self, http: httpx.Client) -> bool:
        """Empty the server's whole prompt cache; False where it cannot or refuses."""
        return False


class VllmDialect(Dialect):
    name = "vllm"
    prefix_cache = "vLLM's automatic prefix caching"
    cache_flags = "--enable-prefix-caching --enable-prompt-tokens-details"
    reset_how = "POST /reset_prefix_cache (vLLM: start the server with VLLM_SERVER_DEV_MODE=1)"

    def reset(self, http: httpx.Client) -> bool:
        r = http.post("/reset_prefix_cache")
        if r.status_code != 200:
            return False
        try:
            return bool(r.json().get("success", True))
        except ValueError:
            return True


class LlamaCppDialect(Dialect):
    name = "llama.cpp"
    prefix_cache = "llama.cpp's per-slot prompt cache (cache_prompt)"
    cache_flags = "llama-server caches prompts per slot by default and reports usage.prompt_tokens_details"
    reset_how = ("erase every slot (GET /slots, POST /slots/ID?action=erase: start llama-server with "
                 "--slot-save-path DIR, and --cache-ram 0 or its RAM prompt cache refills the slots)")
    bypass_how = "cache_prompt: false on the request"
    logprobs_for_ids = 1  # llama.cpp shows generated ids only in logprobs.content[].id

    def body(self, body: dict[str, Any], *, bypass_cache: bool) -> dict[str, Any]:
        body["cache_prompt"] = not bypass_cache
        return body

    def read_choice(self, ch: dict[str, Any]) -> tuple[list[int] | None, dict[int, float] | None, str | None]:
        content = (ch.get("logprobs") or {}).get("content") or []
        if not content:
            return None, None, None
        ids = [int(c["id"]) for c in content if "id" in c]
        first = content[0].get("top_logprobs") or []
        top = {int(t["id"]): float(t["logprob"]) for t in first if "id" in t and "logprob" in t}
        return ids, (top or None), (LOGPROB_IDS if top else None)

    def reset(self, http: httpx.Client) -> bool:
        r = http.get("/slots")
        if r.status_code != 200:
            return False
        try:
            slots = [int(s["id"]) for s in r.json()]
        except (ValueError, KeyError, TypeError):
            return False
        return all(http.post(f"/slots/{i}", params={"action": "erase"}).status_code == 200 for i in slots)


def _by_id(entries: Any) -> dict[int, float]:
    """SGLang's ``[(logprob, token id, text), ...]`` as token id -> log-probability."""
    return {int(e[1]): float(e[0]) for e in entries or () if isinstance(e, (list, tuple)) and len(e) >= 2
            and e[0] is not None and e[1] is not None}


class SglangDialect(Dialect):
    name = "sglang"
    path = "/generate"
    version_path = "/server_info"  # SGLang 0.5.17 has no /version (404 on the H200)
    namespace = "extra_key"
    prefix_cache = "SGLang's RadixAttention prefix cache"
    cache_flags = "the radix cache on (SGLang's default); cached tokens reported in meta_info.cached_tokens"
    reset_how = "POST /flush_cache (SGLang empties its radix tree when no request is running)"
    bypass_how = "logprob_start_len 0 on the request (SGLang caps its prefix match at the log-probability start)"

    def request(self, model: str, ids: list[int], *, max_tokens: int, salt: str | None,
                kv_transfer_params: dict[str, Any] | None, stop_token_ids: list[int] | None, stream: bool,
                logprob_token_ids: list[int] | None, bypass_cache: bool, top_logprobs: int = LOGPROBS) -> dict[str, Any]:
        if kv_transfer_params is not None:
            raise KvauditError("SGLang has no kv_transfer_params: kvaudit's connector protocol needs vLLM")
        sampling: dict[str, Any] = {"max_new_tokens": max_tokens, "temperature": 0.0, "skip_special_tokens": True}
        if stop_token_ids:
            sampling["stop_token_ids"] = sorted(stop_token_ids)
        body: dict[str, Any] = {"input_ids": list(ids), "sampling_params": sampling, "stream": stream}
        # SGLang shows output_ids without log-probabilities: asked only where wanted, or where the
        # cache bypass below needs them (logprob_start_len counts only with return_logprob)
        if top_logprobs or logprob_token_ids or bypass_cache:
            body.update(return_logprob=True, top_logprobs_num=top_logprobs)
        if logprob_token_ids:
            body["token_ids_logprob"] = sorted(set(logprob_token_ids))
        if salt is not None:
            body["extra_key"] = salt
        if bypass_cache:  # its prompt's log-probabilities from position 0: no prefix can be matched
            body["logprob_start_len"] = 0
        return body

    def absorb(self, r: _Response, chunk: dict[str, Any]) -> None:
        if "error" in chunk:
            r.error = chunk["error"]
            return
        meta = chunk.get("meta_info") or {}
        for key, attr in (("cached_tokens", "cached"), ("prompt_tokens", "prompt_tokens"),
                          ("completion_tokens", "completion_tokens")):
            if meta.get(key) is not None:
                setattr(r, attr, int(meta[key]))
        if chunk.get("text"):
            r.text = chunk["text"]
        ids = chunk.get("output_ids")
        if ids is not None:
            r.ids_shown = True
            ids = [int(t) for t in ids]
            # cumulative (SGLang's default stream, and a whole response): as many ids as generated so far
            cumulative = r.completion_tokens is not None and len(ids) == r.completion_tokens >= len(r.tokens)
            r.add_tokens(ids[len(r.tokens):] if cumulative else ids)
        top = meta.get("output_top_logprobs") or []
        if r.logprob_keys is None and top and top[0]:
            r.logprob_keys = LOGPROB_IDS
            r.first_lp = {**_by_id(top[0]), **_by_id((meta.get("output_token_ids_logprobs") or [None])[0])}
        echoed = meta.get("input_token_logprobs")  # every prompt position, where the log-probabilities start at 0
        if echoed and r.prompt_ids is None and len(echoed) == r.prompt_tokens:
            r.prompt_ids = [int(e[1]) for e in echoed]
        finish = meta.get("finish_reason")
        if isinstance(finish, dict):
            r.finish = "error" if finish.get("type") == "abort" else str(finish.get("type"))

    def reset(self, http: httpx.Client) -> bool:
        for _ in range(20):  # SGLang refuses (400) while a request runs: a few tries, then False
            r = http.post("/flush_cache")
            if r.status_code == 200:
                return True
            time.sleep(0.05)
        return False


# Keyed by what /v1/models names as the model's owner.
BY_OWNER: dict[str, Dialect] = {"vllm": VllmDialect(), "llamacpp": LlamaCppDialect(), "sglang": SglangDialect()}
GENERIC = Dialect()


def detect(model_card: dict[str, Any]) -> Dialect:
    """The dialect of the server whose ``/v1/models`` entry is ``model_card``."""
    return BY_OWNER.get(str(model_card.get("owned_by") or "").lower(), GENERIC)
