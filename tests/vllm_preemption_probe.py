"""Run in a child process by tests/test_vllm_preemption.py: one small engine whose KV space holds
about three of the dataset's requests, the reuse arm for every case in one batch (vLLM must preempt
one) and then for each case alone (nothing to preempt), then every case arriving at once on the
replay's path (its warm-ups in the same engine). Prints one JSON line: preemptions in each, the
connector's loads in the batch, whether each case's answer is the same both ways, and the replay
path's preemptions per request beside the engine's count.

    python tests/vllm_preemption_probe.py DATASET_DIR
"""

from __future__ import annotations

import json
import sys

from kvaudit.core.arms import get_arm
from kvaudit.core.dataset_format import read_dataset
from kvaudit.runners.backend import ArmRequest
from kvaudit.runners.engines.vllm.backend import open_vllm_backend
from kvaudit.runners.engines.vllm.live import LiveJob, serve_arrivals
from kvaudit.runners.prompt import assemble

KV_BYTES = 50 << 20  # 1,088 tokens of SmolLM2's fp32 KV: ten requests of 220-380 tokens cannot all run


def main(dataset: str) -> None:
    ds = read_dataset(dataset)
    # Prefix caching off: a preempted request cannot find its own freed blocks again, so vLLM asks
    # the connector for its range once more at its return (the resumed load this checks).
    # Request stats on: they count the preemptions. Every answer decodes all 48 tokens, so the
    # batch's KV grows until vLLM has to preempt.
    b = open_vllm_backend("smollm2", max_new_tokens=48, measure_decode=True, kv_cache_bytes=KV_BYTES,
                          max_model_len=1024, concurrent_cases=len(ds.cases), disable_log_stats=False,
                          enable_prefix_caching=False)
    try:
        prompts = [assemble(c, ds.segments, b.tok, b.max_prompt_tokens) for c in ds.cases]
        spec = get_arm("reuse")
        b.run_arms(spec, [ArmRequest(p) for p in prompts])  # warm-ups: the next batch only loads
        before, stats = b.preemptions or 0, b.store_rpc("stats")
        together = b.run_arms(spec, [ArmRequest(p) for p in prompts])
        preempted, loads = (b.preemptions or 0) - before, b.store_rpc("stats")["loads"] - stats["loads"]
        alone = [b.run_arms(spec, [ArmRequest(p)])[0] for p in prompts]
        preempted_alone = (b.preemptions or 0) - before - preempted
        # the replay's path: every request arriving at once on emptied caches, each warming up its
        # documents in the same engine; each preemption is charged to one request's record
        b.reset_caches()
        before_live, outcomes = b.preemptions or 0, []
        serve_arrivals(b, "segment", [LiveJob(i, p, 0.0) for i, p in enumerate(prompts)], outcomes.append)
        print(json.dumps({"requests": len(prompts), "preempted_together": preempted, "loads_together": loads,
                          "preempted_alone": preempted_alone,
                          "reused": [t.result.tokens_reused for t in together],
                          "same": [a.result.answer_ids == t.result.answer_ids for a, t in zip(alone, together)],
                          "live_recorded": [o.preemptions for o in outcomes],
                          "live_engine": (b.preemptions or 0) - before_live,
                          "live_warmed": sum(o.warmup_tokens for o in outcomes)}))
    finally:
        b.close()


if __name__ == "__main__":
    main(sys.argv[1])
