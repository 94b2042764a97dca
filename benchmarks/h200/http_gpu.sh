#!/bin/bash
# The HTTP backend against a real vLLM server on the H200 (issue 15): `vllm serve`'s module with
# kvaudit's connector, bf16 SmolLM2; 30 Boxoffice cases through `--backend openai --reuse-protocol
# kvaudit` with the prefix-cache and tenant arms, then audit and report (timing AUC on the GPU).
set -u
export KVAUDIT_CACHE=/tmp/kvcache
M=$(python3 -c "from kvaudit.models import resolve_model_dir; print(resolve_model_dir('smollm2'))")
CFG='{"kv_connector":"KvauditSegmentConnector","kv_connector_module_path":"kvaudit.runners.engines.vllm.connector","kv_role":"kv_both","kv_connector_extra_config":{"store":"http","capacity_bytes":4294967296}}'
VLLM_SERVER_DEV_MODE=1 python3 -m vllm.entrypoints.openai.api_server --model $M --served-model-name smollm2 \
  --host 127.0.0.1 --port 8011 --dtype bfloat16 --max-model-len 4096 --enable-prefix-caching \
  --enable-prompt-tokens-details --block-size 32 --gpu-memory-utilization 0.3 --kv-transfer-config "$CFG" \
  > $OUT/serve.log 2>&1 &
P=$!
for i in $(seq 1 150); do sleep 2; curl -sf 127.0.0.1:8011/health > /dev/null && break; kill -0 $P || break; done
echo "server up after ${i}x2 s"
python3 -m kvaudit.cli generate boxoffice --out /tmp/box30 --cases 30 --seed 1 \
  --families single_doc=3,multi_hop_bridge=2,leak_probe=1 > /dev/null
t0=$(date +%s)
python3 -m kvaudit.cli run --backend openai --base-url http://127.0.0.1:8011 --reuse-protocol kvaudit --dtype bfloat16 \
  --dataset /tmp/box30 --out /tmp/http --no-progress \
  --arms recompute,reuse,identity,reuse_other_tenant,prefix_cache_cold,prefix_cache_flushed,prefix_cache,prefix_cache_other_tenant,recompute_again \
  > $OUT/http-run.log 2>&1
echo "run rc=$? wall=$(( $(date +%s) - t0 ))s"
python3 -m kvaudit.cli audit /tmp/http > $OUT/http-audit.txt 2>&1; echo "audit rc=$?"
python3 -m kvaudit.cli report /tmp/http > /dev/null 2>&1; echo "report rc=$?"
cp /tmp/http/summary.json $OUT/http-summary.json; cp /tmp/http/manifest.json $OUT/http-manifest.json
gzip -c /tmp/http/pairs.jsonl > $OUT/http-pairs.jsonl.gz
python3 -c "import json; s=json.load(open('$OUT/http-summary.json'))['security']; print(json.dumps(s, indent=1)[:3000])"
tail -22 $OUT/http-audit.txt | cut -c1-220
kill $P; wait $P 2>/dev/null
