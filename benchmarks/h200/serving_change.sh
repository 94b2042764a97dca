#!/bin/bash
# issue 40 on the H200 (after the shared/gpu install; vLLM 0.26): serving changes audited as paired runs.
#   bash benchmarks/h200/serving_change.sh fp8     SmolLM2 (real weights, bf16), fp8 KV cache, 500 Boxoffice cases
#   bash benchmarks/h200/serving_change.sh ngram   SmolLM2, ngram speculative decoding, 500 cases
#   bash benchmarks/h200/serving_change.sh 8b      Llama-3.1-8B shape, dummy bf16 weights, fp8 KV cache: speed only
# Each: kvaudit run --engines, audit, gate (quality and speed rows), report; summaries to $OUT.
set -u
source /tmp/gpu-env.sh
export KVAUDIT_CACHE=/tmp/kvcache
K="python3 -m kvaudit.cli"
which=$1
N=${CASES:-500}
FAMILIES=single_doc=3,multi_hop_bridge=2,multi_hop_compare=2,aggregate=1,position_probe=1
# no leak probes: a serving change is judged on answers (the 2026-12-04 runs left them out, when their
# candidate scoring needed the segment connector; since 2026-12-08 they score without it)
[ -d /tmp/boxsc$N ] || $K generate boxoffice --out /tmp/boxsc$N --cases $N --seed 0 --families "${FAMILIES}" > /dev/null
# Both engines: bf16, CUDA graphs, decode measured over all 24 tokens, no segment connector (these arms
# are full prefills on either engine), a third of the GPU each (several engines share the process).
common='dtype = "bfloat16"
max_new_tokens = 24'
opts="measure_decode = true
enforce_eager = ${EAGER:-false}
segment_connector = ${SC:-false}
gpu_memory_utilization = 0.25"
# the speed rows the fp8 runs share (the ngram run asks for a decode speed-up instead)
TTFT_ROW='[[speed]]
name = "TTFT no worse than 1.05x"
metric = "ttft"
max_ratio = 1.05'
DECODE_ROW='[[speed]]
name = "decode no slower than 1.05x"
metric = "time_per_output_token"
max_ratio = 1.05'
model=smollm2
arms=recompute,candidate,candidate_off,candidate_again,recompute_again
case $which in
  fp8) change='change = "fp8 KV cache"
declares = ["kv_cache_dtype"]'; copt='kv_cache_dtype = "fp8"'
       speed="$TTFT_ROW
$DECODE_ROW" ;;
  ngram) change='change = "ngram speculative decoding, 4 tokens"
declares = ["speculative_config"]'; copt='speculative_config = {method = "ngram", num_speculative_tokens = 4, prompt_lookup_max = 4, prompt_lookup_min = 2}'
       speed='[[speed]]
name = "decode at least 1.3x faster"
metric = "time_per_output_token"
min_speedup = 1.3'"
$TTFT_ROW" ;;
  8b) python3 - <<'PY'
import sys; sys.path.insert(0, "benchmarks")
from pathlib import Path
from vllm_ttft import make_shape
make_shape(Path("/tmp/llama8b"), "llama3-8b")
PY
      model=/tmp/llama8b; arms=recompute,candidate,candidate_again,recompute_again
      opts="$opts
load_format = \"dummy\"
max_model_len = 8192
kv_cache_memory_bytes = 4294967296"
      change='change = "fp8 KV cache (dummy weights: speed only)"
declares = ["kv_cache_dtype"]'; copt='kv_cache_dtype = "fp8"'
      speed="$TTFT_ROW
$DECODE_ROW" ;;
  *) echo "usage: $0 fp8|ngram|8b"; exit 2 ;;
esac
cat > /tmp/engines-$which.toml <<TOML
[baseline]
backend = "vllm"
model = "$model"
$common
[baseline.options]
$opts

[candidate]
backend = "vllm"
model = "$model"
$common
$change
[candidate.options]
$opts
$copt
TOML
cat > /tmp/policy-$which.toml <<TOML
arm = "candidate"
[[delta]]
name = "overall quality"
group = "overall"
min_lower_bound = -2.0
$speed
[audit]
require_passed = true
TOML
cp /tmp/engines-$which.toml /tmp/policy-$which.toml $OUT/
rm -rf /tmp/r-$which
t0=$(date +%s)
$K run --dataset /tmp/boxsc$N --engines /tmp/engines-$which.toml --out /tmp/r-$which --arms $arms --no-progress \
  > $OUT/run-$which.log 2>&1; echo "$which run rc=$? wall=$(( $(date +%s) - t0 ))s"
grep -v "^(\|^INFO\|^WARNING\|Loading\|it/s\]" $OUT/run-$which.log | tail -4
$K audit /tmp/r-$which > $OUT/audit-$which.txt 2>&1; echo "$which audit rc=$?"
grep -v "does not apply" $OUT/audit-$which.txt | cut -c1-400
$K gate /tmp/r-$which --policy /tmp/policy-$which.toml > $OUT/gate-$which.md 2>&1; echo "$which gate rc=$?"
cat $OUT/gate-$which.md | cut -c1-500
$K report /tmp/r-$which > /dev/null 2>&1; echo "$which report rc=$?"
for f in summary.json audit.json manifest.json report.html; do cp /tmp/r-$which/$f $OUT/$which-$f 2>/dev/null; done
gzip -c /tmp/r-$which/pairs.jsonl > $OUT/$which-pairs.jsonl.gz
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
