#!/bin/bash
# issue 41, the client's lag at saturation (after the shared/gpu install; vLLM 0.26): the short-prompt
# replay where kvaudit's client was 2.90 ms (p95) behind vLLM's first-token time at 10/s with 16 running,
# served twice side by side: as replays now ask (no log-probabilities), and asking every token's top-20
# as replays did before 8677ace (--ask-logprobs 20). Llama-3.1-8B shape, dummy bf16, CUDA graphs.
#   RATES=6,10 REQUESTS=200 bash benchmarks/h200/client_lag.sh
set -u
source /tmp/gpu-env.sh
for lp in 0 20; do
  python3 benchmarks/replay_gpu.py --policies "${POLICY:-prefix}" --rates "${RATES:-6,10}" --requests "${REQUESTS:-200}" \
    --cache-budget 40GB --doc-tokens lognormal:300:1.0 --max-new-tokens 16 --concurrency 16 --slo-ttft 0.5 \
    --ask-logprobs "$lp" --json "$OUT/client_lag_logprobs${lp}.json" 2>&1 | grep -Ev "(^| )(INFO|WARNING) |it/s\]" | grep -E "^(prefix|segment)|Error|rror:"
done
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
