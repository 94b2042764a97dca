#!/bin/bash
# issue 44 on the H200, after the shared/gpu install (SmolLM2's weights, kvaudit's needs: /tmp/gpu-env.sh)
# and the SGLang carry (scripts/sglang-gpu: /tmp/sgl-env.sh): SmolLM2 bf16 served by SGLang 0.5.17
# (native /generate) and by the stock vLLM 0.26 server, the same Boxoffice cases through the same
# prefix-cache arms, 32 cases at a time; then SGLang again without namespaces (--no-cache-namespace,
# one case at a time). Each run audited, reported and gated; summaries, audits and manifests to $OUT.
#   bash benchmarks/h200/sglang_audit.sh            (CASES=800 NONS=200 by default)
# Run 2026-12-05: 800 cases took 158 s on SGLang; the stock vLLM server ran 320 of them in its 120 s
# (T_VLLM). A second call resumes what a first left unfinished (the runs are resumable).
# Everything lands in /tmp/res, packed into $OUT/sglang-results.tgz after each step (a call stopped at
# its time limit still returns what finished).
set -u
export KVAUDIT_CACHE=/tmp/kvcache HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
N=${CASES:-800}; NONS=${NONS:-200}
ARMS=recompute,prefix_cache_cold,prefix_cache_flushed,prefix_cache,prefix_cache_other_tenant,recompute_again
R=/tmp/res; mkdir -p $R
save() { tar czf "$OUT/sglang-results.tgz" -C /tmp res; }
echo "glibc: $(ldd --version | head -1)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
K() { (source /tmp/gpu-env.sh; python3 -m kvaudit.cli "$@"); }
M=$(source /tmp/gpu-env.sh; python3 -c "from kvaudit.models import resolve_model_dir; print(resolve_model_dir('smollm2'))")
echo "model folder: $M"; ls "$M"
K generate boxoffice --out /tmp/box$N --cases $N --seed 0 > /dev/null
cat > /tmp/sglang.toml <<'EOF'
arm = "prefix_cache"
[[delta]]
group = "overall"
min_lower_bound = -2.0
[audit]
accept_cannot_judge = ["server_consumed_ids", "server_model"]
EOF
cat > /tmp/vllm.toml <<'EOF'
arm = "prefix_cache"
[[delta]]
group = "overall"
min_lower_bound = -2.0
EOF

up() {  # wait for a server's /health (pid $1, port $2, at most $3 s)
  for i in $(seq 1 "$3"); do sleep 1; curl -sf "127.0.0.1:$2/health" > /dev/null && { echo "up after ${i} s"; return 0; }
    kill -0 "$1" 2> /dev/null || { echo "server exited"; return 1; }; done; echo "not up after $3 s"; return 1; }

audit() {  # run folder, policy, label: audit, report, gate; copy what a reviewer reads
  K audit "$1" > "$R/$3-audit.txt" 2>&1; echo "$3 audit rc=$?"
  K report "$1" > /dev/null 2>&1; echo "$3 report rc=$?"
  K gate "$1" --policy "$2" > "$R/$3-gate.txt" 2>&1; echo "$3 gate rc=$?"; cat "$R/$3-gate.txt" | cut -c1-200
  for f in summary audit manifest; do cp "$1/$f.json" "$R/$3-$f.json" 2> /dev/null; done
  tar czf "$R/$3-run.tgz" -C "$(dirname "$1")" "$(basename "$1")/pairs.jsonl" "$(basename "$1")/report.html" 2> /dev/null
  python3 - "$1" "$3" <<'EOF'
import json, sys
d, label = sys.argv[1], sys.argv[2]
s = json.load(open(f"{d}/summary.json")); m = json.load(open(f"{d}/manifest.json"))
print(label, "probe:", json.dumps(m["backend"].get("cache_probe"))[:600])
sec = s.get("security") or {}
print(label, "cold/flushed/warm:", json.dumps(sec.get("cold_flushed_warm"))[:600])
print(label, "tenant isolation / timing:", json.dumps({k: v for k, v in sec.items() if k != "cold_flushed_warm"})[:1500])
print(label, "timing_s:", json.dumps(m.get("timing_s"))[:400])
EOF
  grep -E "PASS|FAIL|CANNOT|verdict" "$R/$3-audit.txt" | cut -c1-200 | tail -22
  save
}

runs() {  # label, seconds, port, out, extra run options...: one kvaudit run against a server, timed
  local label=$1 secs=$2 port=$3 out=$4; shift 4; local t0=$(date +%s)
  timeout "$secs" bash -c "$(declare -f K); K run --backend openai --base-url http://127.0.0.1:$port --model smollm2 \
    --dtype bfloat16 --dataset /tmp/box$N --out $out --no-progress $*" > "$R/$label-run.log" 2>&1
  echo "$label run rc=$? wall=$(( $(date +%s) - t0 ))s"; tail -5 "$R/$label-run.log" | cut -c1-300
}

# ---- SGLang 0.5.17 (triton attention, pytorch sampling: FA3 not carried)
(source /tmp/sgl-env.sh; exec python3 -m sglang.launch_server --model-path "$M" --served-model-name smollm2 \
  --host 127.0.0.1 --port 30000 --dtype bfloat16 --context-length 4096 --mem-fraction-static 0.3 \
  --attention-backend triton --sampling-backend pytorch --enable-cache-report --cuda-graph-max-bs 32) \
  > "$R/sglang-serve.log" 2>&1 &
P=$!
if up $P 30000 240; then
  curl -s 127.0.0.1:30000/v1/models; echo; curl -s 127.0.0.1:30000/server_info | head -c 300; echo
  runs sglang ${T_SGL:-180} 30000 /tmp/sgl --concurrent-cases 32 --arms $ARMS
  audit /tmp/sgl /tmp/sglang.toml sglang
  runs sglang-nons ${T_NONS:-60} 30000 /tmp/sgl-nons --limit $NONS --no-cache-namespace \
    --arms recompute,prefix_cache_cold,prefix_cache,prefix_cache_other_tenant
  audit /tmp/sgl-nons /tmp/sglang.toml sglang-nons
fi
tail -30 "$R/sglang-serve.log" | cut -c1-300
kill $P; wait $P 2> /dev/null; save; sleep 3
[ $SECONDS -lt ${DEADLINE:-400} ] || { echo "skipping vLLM: ${SECONDS} s spent"; exit 0; }

# ---- the stock vLLM 0.26 server on the same cases
(source /tmp/gpu-env.sh; export VLLM_SERVER_DEV_MODE=1; exec python3 -m vllm.entrypoints.openai.api_server --model "$M" --served-model-name smollm2 \
  --host 127.0.0.1 --port 8011 --dtype bfloat16 --max-model-len 4096 --enable-prefix-caching \
  --enable-prompt-tokens-details --gpu-memory-utilization 0.3) > "$R/vllm-serve.log" 2>&1 &
P=$!
if up $P 8011 180; then
  runs vllm ${T_VLLM:-120} 8011 /tmp/vllm --concurrent-cases 32 --arms $ARMS
  audit /tmp/vllm /tmp/vllm.toml vllm
fi
kill $P; wait $P 2> /dev/null; save
