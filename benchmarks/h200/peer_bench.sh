#!/bin/bash
# issue 41, "held to a peer", on the H200 (after the shared/gpu install; vLLM 0.26): one `vllm serve`
# (Llama-3.1-8B shape, dummy bf16, CUDA graphs, no prefix caching), the default workload shape,
# kvaudit replay --backend openai --cache-policy recompute and vllm bench serve at each offered load.
#   RATES=0.3,0.6 REQUESTS=40 [DOCS=lognormal:500:0.5] bash benchmarks/h200/peer_bench.sh
set -u
source /tmp/gpu-env.sh
python3 benchmarks/peer_bench.py --shape llama3-8b --dtype bfloat16 --doc-tokens "${DOCS:-lognormal:2000:0.5}" \
  --rates "${RATES:-0.3,0.6}" --requests "${REQUESTS:-40}" --max-new-tokens "${MNT:-16}" --text-vs-ids "${TVI:-0}" \
  --json "$OUT/peer.json" 2>&1 | grep -Ev "(^| )(INFO|WARNING) |it/s\]"
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
