"""A stand-in server that lies or lacks a feature: it forwards to a real vLLM server and changes one thing.

``cached``: the cached-token count reported for every prompt longer than 128 ids is raised by
32 (a server claiming cache hits it did not have; kvaudit's cache probe at start-up, a prompt of
exactly ``PROBE_TOKENS`` ids, is left alone, so the lie reaches the audit rather than the
probe's own refusal). ``drop``: the first prompt id of every plain completion request (one
without ``kv_transfer_params``) is dropped before it is forwarded, as a server that strips a
token it considers special would; the real server then echoes what it consumed.

Features removed, as servers other than vLLM lack them: ``no_token_ids`` strips the generated
ids (``choices[].token_ids``) from every response, leaving the text and the log-probabilities;
``no_echo`` strips the echoed prompt ids; ``shared_salt`` drops ``cache_salt`` from every
request, so salts do not isolate (one cache for everyone, as llama.cpp has); ``text_logprobs``
keys the top log-probabilities by text, as SGLang's OpenAI server does. ``fail_scoring``: the
second request asking for chosen ids' log-probabilities (``logprob_token_ids``, a leak-probe
scoring request) is answered 500 without reaching the server, as a server that falls over midway
would. For the negative tests only: the positive path uses the real server. ``record`` changes
nothing: with ``seen``, every completion request's body is appended to it as it arrives (what
kvaudit asked the server for).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import httpx

from kvaudit.runners.engines.http.backend import PROBE_TOKENS
from kvaudit.testing.served import in_thread


def _lie_usage(obj: dict) -> None:
    details = (obj.get("usage") or {}).get("prompt_tokens_details")
    if details and details.get("cached_tokens") is not None:
        details["cached_tokens"] += 32


def _strip(obj: dict, mode: str) -> None:
    for ch in obj.get("choices") or []:
        if mode == "no_token_ids":
            ch.pop("token_ids", None)
        elif mode == "no_echo":
            ch.pop("prompt_token_ids", None)
        elif mode == "text_logprobs" and (ch.get("logprobs") or {}).get("top_logprobs"):
            ch["logprobs"]["top_logprobs"] = [{f"t{k}": v for k, v in d.items()} for d in ch["logprobs"]["top_logprobs"]]


def _rewrite(obj: dict, mode: str, lie: bool) -> None:
    if lie:
        _lie_usage(obj)
    _strip(obj, mode)


def make_handler(upstream: str, mode: str, seen: list[dict] | None = None) -> type[BaseHTTPRequestHandler]:
    client = httpx.Client(base_url=upstream, timeout=300)
    scoring = itertools.count(1)  # next() is atomic under the GIL: the handler's threads share it

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            return

        def _reply(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            r = client.get(self.path)
            self._reply(r.status_code, r.content)

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/completions":
                r = client.post(self.path, content=raw)
                self._reply(r.status_code, r.content)
                return
            body = json.loads(raw)
            if seen is not None:
                seen.append(dict(body))
            if mode == "fail_scoring" and body.get("logprob_token_ids") and next(scoring) == 2:
                self._reply(500, b'{"error": "the stand-in fell over"}')
                return
            if (mode == "drop" and not body.get("kv_transfer_params") and isinstance(body.get("prompt"), list)
                    and len(body["prompt"]) > 2):
                body["prompt"] = body["prompt"][1:]
            if mode == "shared_salt":
                body.pop("cache_salt", None)
            lie = (mode == "cached" and isinstance(body.get("prompt"), list)
                   and 128 < len(body["prompt"]) != PROBE_TOKENS)
            if not body.get("stream"):
                r = client.post("/v1/completions", json=body)
                obj = r.json()
                _rewrite(obj, mode, lie)
                self._reply(r.status_code, json.dumps(obj).encode())
                return
            with client.stream("POST", "/v1/completions", json=body) as r:
                self.send_response(r.status_code)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for line in r.iter_lines():
                    if line.startswith("data:") and line[5:].strip() != "[DONE]":
                        obj = json.loads(line[5:])
                        _rewrite(obj, mode, lie)
                        line = "data: " + json.dumps(obj)
                    self.wfile.write((line + "\n").encode())
                    self.wfile.flush()

    return Handler


@contextlib.contextmanager
def lying_proxy(upstream: str, mode: str, seen: list[dict] | None = None) -> Iterator[str]:
    """Serve the lie on 127.0.0.1 (a free port); yields its base URL."""
    with in_thread(make_handler(upstream, mode, seen)) as url:
        yield url
