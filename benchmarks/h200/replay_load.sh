#!/bin/bash
# issue 41 on the H200 (after the shared/gpu install, its carry re-split by split_carry.sh; vLLM 0.26):
# one policy served at several offered loads, each request joining the running batch at its arrival
# (kvaudit replay --schedule arrivals), one engine per policy with empty caches at each load.
# Llama-3.1-8B shape, dummy bf16, CUDA graphs, the default workload shape (benchmarks/replay_gpu.py),
# 16 decoded tokens per request.
#   bash benchmarks/h200/replay_load.sh prefix|segment|recompute
# Environment: RATES, REQUESTS, BUDGET, KV_SPACE (the engine's KV space for requests in flight; default
# enough that none waits for space), KV_DTYPE (vLLM's kv_cache_dtype, e.g. fp8: a serving change under
# load), MNT (decoded tokens), SLO (seconds), DOCS (document tokens,
# default the workload's lognormal:2000:0.5), SCHEDULE (arrivals, or waves for the old mode side by side),
# REPS (replications: each load served that many times with new arrival seeds; 6 bounds each p95's interval),
# RESULTS (where the summaries and each load's requests go; default $OUT). A sweep longer than one call:
#   bash benchmarks/h200/bg.sh start /tmp/r500 'RESULTS=/tmp/r500 REQUESTS=500 bash benchmarks/h200/replay_load.sh prefix'
# On an H100 (80 GB) the default 40 GB budget does not fit beside the 8B shape (2026-12-05): run both
# policies with BUDGET=20GB (prefix caching: 16 GB of weights, 20 GB + 34 GB of KV; segment reuse: 34 GB of
# KV space for 8 running requests of 32K tokens, its 20 GB store beside it, 31.6 GB fitting there).
# Before spending device time on a change to replay_gpu.py, run it on a CPU (.venv-vllm) with the tiny shape:
#   python benchmarks/replay_gpu.py --shape tiny --dtype float32 --eager --block-size 32 --requests 10 \
#     --doc-tokens lognormal:60:0.5 --rates 20 --replications 2 --concurrency 4 --policies prefix,segment --cache-budget 20MB
set -u
source /tmp/gpu-env.sh
policy=$1
python3 benchmarks/replay_gpu.py --policies "$policy" --rates "${RATES:-0.5,1,1.5,2.5}" --requests "${REQUESTS:-80}" \
  --cache-budget "${BUDGET:-40GB}" ${KV_SPACE:+--kv-space "$KV_SPACE"} ${KV_DTYPE:+--vllm-option kv_cache_dtype="$KV_DTYPE"} --max-new-tokens "${MNT:-16}" --concurrency 8 --slo-ttft "${SLO:-2}" \
  --replications "${REPS:-1}" \
  --doc-tokens "${DOCS:-lognormal:2000:0.5}" --schedule "${SCHEDULE:-arrivals}" \
  --json "${RESULTS:-$OUT}/replay_load_${policy}_${SCHEDULE:-arrivals}.json" \
  ${RESULTS:+--work "$RESULTS/work-${policy}-${SCHEDULE:-arrivals}"} 2>&1 | grep -Ev "(^| )(INFO|WARNING) |it/s\]"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
