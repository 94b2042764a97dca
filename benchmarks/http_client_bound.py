"""Is an audit over HTTP bound by the engine or by kvaudit's client? Side by side, one server.

Issue 28: kvaudit's wall time for a run's requests should be within 1.5x of the engine's own
throughput for the same request stream. Against one OpenAI-compatible server (``--base-url``, or
a stock ``vllm serve`` this script starts on 127.0.0.1: SmolLM2 fp32 on the CPU, the tests'
launcher), for ``--cases`` generated Boxoffice cases:

* **kvaudit**: ``kvaudit run --backend openai --arms recompute --concurrent-cases N``; its wall
  time for the arm's requests is the manifest's ``timing_s["recompute"]`` (the runner's clock
  around the arm, cache probe and set-up excluded);
* **minimal client**: the same prompt ids (assembled by kvaudit's own prompt code from the same
  dataset and tokenizer, checked equal to the run's ``ids_hash``), the same request body (streamed,
  usage, top-20 log-probabilities by id, a fresh ``cache_salt``, the same ``max_tokens``), sent by
  asyncio + httpx with N requests in flight at all times.

Runs alternate (kvaudit, minimal, kvaudit, ...) ``--repeats`` times; printed: each wall time,
requests per second, and the ratio of medians (kvaudit / minimal; the target is at most 1.5).

    .venv-vllm/bin/python benchmarks/http_client_bound.py --cases 24 --concurrent 4 --repeats 2
    python3 benchmarks/http_client_bound.py --base-url http://127.0.0.1:8000 --model DIR --cases 400 --concurrent 32
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvaudit.cli import main as kvaudit_main  # noqa: E402
from kvaudit.core.manifest import read_manifest  # noqa: E402
from kvaudit.core.run_format import read_pairs  # noqa: E402


def prompts(dataset: Path, model: str, max_new_tokens: int, max_model_len: int) -> dict[str, list[int]]:
    """Every case's prompt ids, assembled exactly as the HTTP backend assembles them."""
    from transformers import AutoTokenizer

    from kvaudit.core.dataset_format import read_dataset
    from kvaudit.models import resolve_model_dir
    from kvaudit.runners.prompt import Tokenizer, assemble

    tok = Tokenizer(AutoTokenizer.from_pretrained(resolve_model_dir(model)))
    ds = read_dataset(dataset)
    return {c.id: assemble(c, ds.segments, tok, max_model_len - max_new_tokens).ids for c in ds.cases}


async def minimal_client(url: str, served: str, ids: list[list[int]], concurrent: int, max_tokens: int) -> float:
    """Send every prompt, ``concurrent`` in flight at all times; the wall time until all finish."""
    sem = asyncio.Semaphore(concurrent)
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        async def one(p: list[int]) -> None:
            body = {"model": served, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 20,
                    "return_token_ids": True, "return_tokens_as_token_ids": True, "stream": True,
                    "stream_options": {"include_usage": True}, "cache_salt": uuid.uuid4().hex}
            async with sem, http.stream("POST", "/v1/completions", json=body) as r:
                r.raise_for_status()
                async for _ in r.aiter_lines():
                    pass

        t0 = time.perf_counter()
        await asyncio.gather(*(one(p) for p in ids))
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", default=None, help="a running server (default: start a stock vllm serve)")
    ap.add_argument("--model", default="smollm2", help="the served model's local checkpoint or tokenizer folder")
    ap.add_argument("--cases", type=int, default=24)
    ap.add_argument("--concurrent", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvaudit-client-bound-"))
    from kvaudit.testing.vllm_server import boxoffice_behind_server

    with boxoffice_behind_server(args.base_url, work, args.cases, connector=False) as (ds, url):
        card = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]
        served, max_len = card["id"], int(card.get("max_model_len") or 4096)
        ids = prompts(ds, args.model, args.max_new_tokens, max_len)
        walls: dict[str, list[float]] = {"kvaudit": [], "minimal": []}
        print(f"{args.cases} cases, {args.concurrent} in flight, {args.max_new_tokens} new tokens; server {url}")
        for k in range(args.repeats):
            out = work / f"run-{k}"
            rc = kvaudit_main(["run", "--backend", "openai", "--base-url", url, "--model", args.model,
                               "--dataset", str(ds), "--out", str(out), "--arms", "recompute", "--no-progress",
                               "--max-new-tokens", str(args.max_new_tokens), "--concurrent-cases", str(args.concurrent)])
            if rc != 0:
                raise SystemExit(f"kvaudit run exited {rc}")
            from kvaudit.core.jsonio import ids_hash

            pairs = read_pairs(out)
            assert all(p.arms["recompute"].ids_hash == ids_hash(ids[p.case_id]) for p in pairs), "prompt ids differ"
            walls["kvaudit"].append(float(read_manifest(out).timing_s["recompute"]))
            walls["minimal"].append(asyncio.run(minimal_client(url, served, [ids[p.case_id] for p in pairs],
                                                               args.concurrent, args.max_new_tokens)))
            print(f"repeat {k}: kvaudit {walls['kvaudit'][-1]:.2f} s ({args.cases / walls['kvaudit'][-1]:.1f} req/s), "
                  f"minimal client {walls['minimal'][-1]:.2f} s ({args.cases / walls['minimal'][-1]:.1f} req/s)",
                  flush=True)
        a, b = statistics.median(walls["kvaudit"]), statistics.median(walls["minimal"])
        print(f"median: kvaudit {a:.2f} s, minimal {b:.2f} s: kvaudit / minimal = {a / b:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
