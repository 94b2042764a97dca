"""A server process for the tests: started on a free 127.0.0.1 port, healthy before use, stopped after.

Shared by the real engines the tests start (``vllm_server``, ``llama_server``): the process runs in
a session of its own so that stopping it stops its children too (SIGTERM, then SIGKILL after 30 s).
:func:`in_thread` serves a stand-in's request handler (a proxy in front of a real server) the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def in_thread(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve ``handler`` on 127.0.0.1 (a free port) from a thread of this process; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def served(name: str, cmd: list[str], port: int, log: Path, *, env: dict[str, str] | None = None,
           startup_s: float = 300.0, poll_s: float = 1.0) -> Iterator[str]:
    """Start ``cmd`` (listening on ``port``), wait for its /health, yield its base URL, stop it."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}; its log: {log}\n"
                                   + log.read_text(errors="replace")[-3000:])
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become healthy in {startup_s:.0f} s; its log: {log}")
            time.sleep(poll_s)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
