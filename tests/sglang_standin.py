"""A stand-in that speaks SGLang's native API over a real vLLM server: SGLang's wire format, a real
engine's answers and cache.

No SGLang runs on this machine (it needs a CUDA torch); this is how kvaudit's SGLang dialect meets a
real engine in the vLLM tier. It serves what the dialect uses, in SGLang's shapes
(``python/sglang/srt/entrypoints/http_server.py``, ``srt/managers/io_struct.py`` as of 0.5.17):
``GET /v1/models`` (``owned_by: "sglang"``), ``GET /server_info`` (its ``version``; SGLang has no
``/version``), ``POST /flush_cache`` (vLLM's
``/reset_prefix_cache``), and ``POST /generate``: ``input_ids``, ``sampling_params``,
``return_logprob``, ``top_logprobs_num``, ``token_ids_logprob``, ``extra_key`` (vLLM's
``cache_salt``: a namespace that isolates), ``logprob_start_len: 0`` (no prefix match: a fresh
salt, and every prompt id echoed in ``meta_info.input_token_logprobs``), ``stream``; answered with
``output_ids`` and ``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``output_top_logprobs`` and ``output_token_ids_logprobs`` as ``[logprob, id, text]`` lists,
``finish_reason`` as ``{"type": ...}``), streamed cumulatively (SGLang's default) or, with
``incremental``, one chunk's new ids at a time (``--incremental-streaming-output``).
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx

from kvaudit.testing.served import in_thread

STANDIN_VERSION = "0.5.17 (kvaudit's stand-in)"


def _lps(top: dict[str, float]) -> list[list[Any]]:
    """vLLM's ``{"token_id:N": lp}`` as SGLang's ``[[lp, N, None], ...]``."""
    return [[lp, int(k.split(":", 1)[1]), None] for k, lp in top.items() if k.startswith("token_id:")]


def _upstream_body(req: dict[str, Any]) -> dict[str, Any]:
    sp = req.get("sampling_params") or {}
    bypass = req.get("logprob_start_len") == 0
    body: dict[str, Any] = {
        "prompt": req["input_ids"], "max_tokens": sp.get("max_new_tokens", 16),
        "temperature": sp.get("temperature", 1.0), "skip_special_tokens": sp.get("skip_special_tokens", True),
        "logprobs": req.get("top_logprobs_num") or 0, "return_token_ids": True,
        "return_tokens_as_token_ids": True, "stream": True, "stream_options": {"include_usage": True},
        "cache_salt": uuid.uuid4().hex if bypass else req.get("extra_key"),
    }
    if sp.get("stop_token_ids"):
        body["stop_token_ids"] = sp["stop_token_ids"]
    if req.get("token_ids_logprob"):
        body["logprob_token_ids"] = req["token_ids_logprob"]
    return {k: v for k, v in body.items() if v is not None}


class _Generation:
    """One /generate answered from vLLM's stream: SGLang's chunks, one per upstream chunk with ids."""

    def __init__(self, req: dict[str, Any], incremental: bool) -> None:
        self.incremental = incremental
        self.echo = req.get("logprob_start_len") == 0
        self.ids: list[int] = []
        self.sent = 0
        self.meta: dict[str, Any] = {"id": uuid.uuid4().hex, "prompt_tokens": len(req["input_ids"]),
                                     "completion_tokens": 0, "cached_tokens": 0, "output_top_logprobs": [],
                                     "finish_reason": None}
        self.token_ids_logprob = bool(req.get("token_ids_logprob"))
        self.prompt_ids = list(req["input_ids"])

    def absorb(self, obj: dict[str, Any]) -> None:
        usage = obj.get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is not None:
            self.meta["cached_tokens"] = int(cached)
        for ch in obj.get("choices") or []:
            self.ids += [int(t) for t in ch.get("token_ids") or []]
            for top in (ch.get("logprobs") or {}).get("top_logprobs") or []:
                self.meta["output_top_logprobs"].append(_lps(top or {}))
            if ch.get("finish_reason"):
                self.meta["finish_reason"] = {"type": ch["finish_reason"]}
        self.meta["completion_tokens"] = len(self.ids)

    def chunk(self) -> dict[str, Any]:
        meta = dict(self.meta)
        if self.token_ids_logprob:  # vLLM returns the asked ids among the first position's top entries
            meta["output_token_ids_logprobs"] = meta["output_top_logprobs"][:1]
        if self.echo:
            meta["input_token_logprobs"] = [[None, t, None] for t in self.prompt_ids]
        if self.incremental:
            new, self.sent = self.ids[self.sent:], len(self.ids)
            meta["output_top_logprobs"] = meta["output_top_logprobs"][len(self.ids) - len(new):]
            return {"text": None, "output_ids": new, "meta_info": meta}
        return {"text": None, "output_ids": list(self.ids), "meta_info": meta}


def make_handler(upstream: str, incremental: bool) -> type[BaseHTTPRequestHandler]:
    client = httpx.Client(base_url=upstream, timeout=300)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            return

        def _reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/version", "/server_info"):  # SGLang 0.5.17: no /version; server_info has it
                found = self.path == "/server_info"
                self._reply(200 if found else 404, json.dumps(
                    {"version": STANDIN_VERSION} if found else {"detail": "Not Found"}).encode())
                return
            r = client.get(self.path)
            if self.path == "/v1/models" and r.status_code == 200:
                data = r.json()
                for m in data.get("data") or []:
                    m["owned_by"] = "sglang"
                self._reply(200, json.dumps(data).encode())
                return
            self._reply(r.status_code, r.content)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == "/flush_cache":
                r = client.post("/reset_prefix_cache")
                self._reply(200 if r.status_code == 200 else 400, b"Cache flushed.")
                return
            if self.path != "/generate":
                self._reply(404, b'{"error": "not in the stand-in"}')
                return
            req = json.loads(raw)
            gen = _Generation(req, incremental)
            with client.stream("POST", "/v1/completions", json=_upstream_body(req)) as r:
                if r.status_code != 200:
                    r.read()
                    self._reply(400, json.dumps({"error": {"message": r.text}}).encode())
                    return
                if req.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                for line in r.iter_lines():
                    if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                        continue
                    before = len(gen.ids)
                    gen.absorb(json.loads(line[5:]))
                    if req.get("stream") and len(gen.ids) > before:
                        self.wfile.write(f"data: {json.dumps(gen.chunk())}\n\n".encode())
                        self.wfile.flush()
            if not req.get("stream"):
                gen.incremental = False
                self._reply(200, json.dumps(gen.chunk()).encode())
                return
            last = gen.chunk()  # the cached-token count vLLM reports only in its last (usage) chunk
            self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

    return Handler


@contextlib.contextmanager
def sglang_standin(upstream: str, *, incremental: bool = False) -> Iterator[str]:
    """SGLang's native API on 127.0.0.1 (a free port) over the vLLM server at ``upstream``."""
    with in_thread(make_handler(upstream, incremental)) as url:
        yield url
