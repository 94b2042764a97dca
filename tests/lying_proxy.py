"""A stand-in server that lies: it forwards to a real vLLM server and falsifies one thing.

``cached``: the cached-token count reported for every prompt longer than 128 ids is raised by
32 (a server claiming cache hits it did not have; kvaudit's 96-token cache probe at start-up is
left alone, so the lie reaches the audit rather than the probe's own refusal). ``drop``: the first prompt id of every plain completion request (one without
``kv_transfer_params``) is dropped before it is forwarded, as a server that strips a token it
considers special would; the real server then echoes what it consumed. For the audit's negative tests only: the positive path uses the real server.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


def _lie_usage(obj: dict) -> None:
    details = (obj.get("usage") or {}).get("prompt_tokens_details")
    if details and details.get("cached_tokens") is not None:
        details["cached_tokens"] += 32


def make_handler(upstream: str, mode: str) -> type[BaseHTTPRequestHandler]:
    client = httpx.Client(base_url=upstream, timeout=300)

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
            if (mode == "drop" and not body.get("kv_transfer_params") and isinstance(body.get("prompt"), list)
                    and len(body["prompt"]) > 2):
                body["prompt"] = body["prompt"][1:]
            lie = mode == "cached" and isinstance(body.get("prompt"), list) and len(body["prompt"]) > 128
            if not body.get("stream"):
                r = client.post("/v1/completions", json=body)
                obj = r.json()
                if lie:
                    _lie_usage(obj)
                self._reply(r.status_code, json.dumps(obj).encode())
                return
            with client.stream("POST", "/v1/completions", json=body) as r:
                self.send_response(r.status_code)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for line in r.iter_lines():
                    if lie and line.startswith("data:") and line[5:].strip() != "[DONE]":
                        obj = json.loads(line[5:])
                        _lie_usage(obj)
                        line = "data: " + json.dumps(obj)
                    self.wfile.write((line + "\n").encode())
                    self.wfile.flush()

    return Handler


@contextlib.contextmanager
def lying_proxy(upstream: str, mode: str) -> Iterator[str]:
    """Serve the lie on 127.0.0.1 (a free port); yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(upstream, mode))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
