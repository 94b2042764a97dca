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

The dialect is chosen by what ``/v1/models`` says owns the model (vLLM ``"vllm"``, llama.cpp
``"llamacpp"``); any other server is read as vLLM's OpenAI shape (``openai``), and the probe
refuses it where that reading finds no token ids. SGLang has no dialect here: no real SGLang
server has answered kvaudit (docs/engines.md).
"""

from __future__ import annotations

from typing import Any

import httpx

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
    prefix_cache = "the server's own prefix cache"
    cache_flags = "prefix caching on, cached tokens reported in usage.prompt_tokens_details"
    reset_how: str | None = None  # how the whole cache is emptied; None: no way known
    bypass_how: str | None = None  # how one request bypasses the cache; None: a fresh cache_salt only

    def body(self, body: dict[str, Any], *, bypass_cache: bool) -> dict[str, Any]:
        """The request body with this engine's own fields (``bypass_cache``: compute every token)."""
        return body

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


# Keyed by what /v1/models names as the model's owner.
BY_OWNER: dict[str, Dialect] = {"vllm": VllmDialect(), "llamacpp": LlamaCppDialect()}
GENERIC = Dialect()


def detect(model_card: dict[str, Any]) -> Dialect:
    """The dialect of the server whose ``/v1/models`` entry is ``model_card``."""
    return BY_OWNER.get(str(model_card.get("owned_by") or "").lower(), GENERIC)
