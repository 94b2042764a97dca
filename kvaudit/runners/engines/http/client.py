"""One OpenAI-compatible completions server, as kvaudit talks to it: token ids in, evidence out.

Every request sends the prompt as **token ids** (``"prompt": [ids]``), so the server consumes
exactly what kvaudit assembled; greedy decoding (``temperature 0``); the first token's top-k
log-probabilities keyed by token id (``return_tokens_as_token_ids``); streaming, so time to
first token is the wall time until the first chunk that carries a token. What the server says
about the request is kept as evidence for the audit, never trusted as fact: the prompt ids it
echoes (``return_token_ids``), the cached prompt tokens it reports
(``usage.prompt_tokens_details.cached_tokens``; ``None`` when it reports none), the model it
names. Any transport or protocol failure is a :class:`~kvaudit.core.errors.KvauditError`
naming the server and what it answered.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvaudit.core.errors import KvauditError
from kvaudit.runners.engines.http.dialects import LOGPROBS, Dialect, detect

__all__ = ["LOGPROBS", "Completion", "ServerClient"]


@dataclass
class Completion:
    """One finished request, as the server reported it."""

    token_ids: list[int]
    first_lp: dict[int, float]  # first generated token: token id -> log-probability (top LOGPROBS)
    ttft_s: float
    total_s: float
    cached_tokens: int | None  # None: the server reports no cached-token count
    prompt_ids: list[int] | None  # None: the server does not echo the ids it consumed
    model: str | None
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    logprob_keys: str | None = None  # what the first-token log-probabilities were keyed by (dialects.LOGPROB_*)
    prompt_tokens: int | None = None  # usage.prompt_tokens: how many prompt tokens the server counted


class _Response:
    """What one completion's response says, read chunk by chunk (a whole response is one chunk of
    the same OpenAI shape as a streamed one): the first token's arrival time, the generated ids,
    the first token's top log-probabilities, the echoed prompt ids, cached tokens, model."""

    def __init__(self, t0: float, dialect: Dialect) -> None:
        self.t0 = t0
        self.dialect = dialect
        self.ids_shown = False  # some chunk carried generated ids
        self.text = ""
        self.completion_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.logprob_keys: str | None = None
        self.tokens: list[int] = []
        self.first_lp: dict[int, float] | None = None
        self.prompt_ids: list[int] | None = None
        self.cached: int | None = None
        self.model: str | None = None
        self.finish: str | None = None
        self.kvp: dict[str, Any] | None = None
        self.extra: dict[str, Any] = {}
        self.ttft: float | None = None
        self.error: Any = None

    def add(self, chunk: dict[str, Any]) -> None:
        """Read one chunk, in the server's dialect (:meth:`Dialect.absorb`)."""
        self.dialect.absorb(self, chunk)

    def add_tokens(self, new: list[int]) -> None:
        """Generated ids this chunk added; the first of them is the time to first token."""
        if new and self.ttft is None:
            self.ttft = time.perf_counter() - self.t0
        self.tokens.extend(new)

    def completion(self, total_s: float) -> Completion:
        return Completion(token_ids=self.tokens, first_lp=self.first_lp or {},
                          ttft_s=self.ttft if self.ttft is not None else total_s, total_s=total_s,
                          cached_tokens=self.cached, prompt_ids=self.prompt_ids, model=self.model,
                          finish_reason=self.finish, kv_transfer_params=self.kvp, extra=self.extra,
                          logprob_keys=self.logprob_keys, prompt_tokens=self.prompt_tokens)

    def missing_ids(self) -> bool:
        """The server generated something (text, or a completion-token count) but showed no ids:
        answers read from it would be empty on every arm and agree vacuously."""
        generated = bool(self.text) or bool(self.completion_tokens)
        return generated and not self.tokens


class ServerClient:
    """An OpenAI-compatible ``/v1/completions`` server at ``base_url`` (``http://host:port``).
    ``namespaces`` False sends no cache namespace (``cache_salt``, ``extra_key``) with any request:
    the server is audited as a deployment whose clients share one cache."""

    def __init__(self, base_url: str, *, model: str | None = None, timeout_s: float = 300.0,
                 api_key: str | None = None, namespaces: bool = True) -> None:
        self.namespaces = namespaces
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No cap on connections: a replay's arrivals each hold one while in flight, and httpx's default
        # of 100 would hold the 101st back on the client, inside its measured TTFT.
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers,
                                 limits=httpx.Limits(max_connections=None, max_keepalive_connections=32))
        self.model = model or self._first_model()["id"]
        self.dialect: Dialect = detect(self.model_card())

    # ------------------------------------------------------------------ server facts

    def _get(self, path: str) -> httpx.Response:
        try:
            return self.http.get(path)
        except httpx.HTTPError as e:
            raise KvauditError(f"server {self.base_url}: GET {path} failed ({e})") from None

    def models(self) -> list[dict[str, Any]]:
        r = self._get("/v1/models")
        if r.status_code != 200:
            raise KvauditError(f"server {self.base_url}: GET /v1/models answered {r.status_code}: {r.text[:300]}")
        try:
            data = r.json()["data"]
        except (ValueError, KeyError, TypeError):
            raise KvauditError(f"server {self.base_url}: /v1/models is not an OpenAI model list") from None
        if not isinstance(data, list) or not data:
            raise KvauditError(f"server {self.base_url}: /v1/models lists no model")
        return data

    def _first_model(self) -> dict[str, Any]:
        return self.models()[0]

    def model_card(self) -> dict[str, Any]:
        """The served model's entry of ``/v1/models`` (``id``, and ``root``/``max_model_len`` where given)."""
        for m in self.models():
            if m.get("id") == self.model:
                return m
        raise KvauditError(f"server {self.base_url} does not serve model {self.model!r}")

    def version(self) -> str | None:
        """The server's version as it reports it (vLLM: ``GET /version``, SGLang: ``GET /server_info``,
        the dialect's :attr:`Dialect.version_path`); None where it reports none (llama.cpp, most
        managed endpoints)."""
        try:
            r = self.http.get(self.dialect.version_path)
            v = r.json().get("version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return v if isinstance(v, str) and v else None

    def reset_cache(self) -> bool:
        """Empty the server's whole prompt cache the way its dialect knows
        (:attr:`Dialect.reset_how`); False where it has no way or refuses."""
        try:
            return self.dialect.reset(self.http)
        except httpx.HTTPError as e:
            raise KvauditError(f"server {self.base_url}: cache reset failed ({e})") from None

    # ------------------------------------------------------------------ one request

    def complete(self, ids: list[int], *, max_tokens: int, salt: str | None = None,
                 kv_transfer_params: dict[str, Any] | None = None,
                 stop_token_ids: list[int] | None = None, stream: bool = True,
                 logprob_token_ids: list[int] | None = None, bypass_cache: bool = False,
                 top_logprobs: int = LOGPROBS) -> Completion:
        """One greedy completion of the prompt ``ids``, timed. Streamed (time to first token is
        the first token's chunk) unless ``stream`` is false; servers return ``kv_transfer_params``
        only in a whole response, so warm-ups that need them are sent unstreamed. ``bypass_cache``:
        the dialect's per-request cache bypass, where it has one (llama.cpp's ``cache_prompt``).
        ``top_logprobs``: the first token's best log-probabilities asked for (0: none, as far as the
        engine shows the generated ids without them)."""
        body = self.dialect.request(self.model, ids, max_tokens=max_tokens, salt=salt if self.namespaces else None,
                                    kv_transfer_params=kv_transfer_params, stop_token_ids=stop_token_ids,
                                    stream=stream, logprob_token_ids=logprob_token_ids, bypass_cache=bypass_cache,
                                    top_logprobs=top_logprobs)
        path = self.dialect.path
        t0 = time.perf_counter()
        acc = _Response(t0, self.dialect)
        try:
            if not stream:
                r = self.http.post(path, json=body)
                if r.status_code != 200:
                    raise KvauditError(f"server {self.base_url}: {path} answered {r.status_code}: {r.text[:500]}")
                acc.add(r.json())  # a whole response is one chunk of the same shape
            else:
                with self.http.stream("POST", path, json=body) as resp:
                    if resp.status_code != 200:
                        resp.read()
                        raise KvauditError(f"server {self.base_url}: {path} answered {resp.status_code}: "
                                           f"{resp.text[:500]}")
                    for line in resp.iter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        acc.add(json.loads(data))
        except httpx.HTTPError as e:
            raise KvauditError(f"server {self.base_url}: {path} failed ({e})") from None
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise KvauditError(f"server {self.base_url}: unreadable completion ({e!r})") from None
        if acc.error is not None:
            raise KvauditError(f"server {self.base_url}: error in the response: {acc.error}")
        if acc.missing_ids():
            raise KvauditError(f"server {self.base_url} ({self.dialect.name}) generated an answer but showed none of "
                               "its token ids (vLLM: return_token_ids; llama.cpp: logprobs.content[].id; SGLang: output_ids): every "
                               "arm's answer would read as empty and agree with every other; refused")
        out = acc.completion(time.perf_counter() - t0)
        if out.finish_reason == "error":
            raise KvauditError(f"server {self.base_url}: the request failed on the server (finish_reason "
                               "'error'; with kvaudit's connector: a load plan named KV its store does not hold)")
        return out

    def close(self) -> None:
        self.http.close()
