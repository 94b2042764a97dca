#!/bin/bash
# issue 38 finding 10 on the H200: a segment replay whose wave of 4 cannot fit the budget is refused
# before any request (exit 2, no request recorded); with a budget that holds the wave it completes.
source /tmp/gpu-env.sh
K="python -m kvaudit.cli"
$K generate workload --out $OUT/w.jsonl --requests 40 --documents 12 --queries 6 --docs-per-request 3 \
  --doc-tokens uniform:400:1200 --prefix-tokens 20 --question-tokens fixed:8 --no-progress; echo "generate rc=$?"
for b in 200MB 2GB; do
  s=$(date +%s.%N)
  $K replay --backend vllm --workload $OUT/w.jsonl --cache-policy segment --cache-budget $b --concurrency 4 \
    --out /tmp/rep-$b --no-progress > $OUT/replay-$b.txt 2>&1; rc=$?
  echo "budget $b rc=$rc wall=$(python3 -c "import time;print(round(time.time()-$s,1))")s requests=$(cat /tmp/rep-$b/requests.jsonl 2>/dev/null | wc -l)"
  tail -3 $OUT/replay-$b.txt
  cp /tmp/rep-$b/summary.json $OUT/summary-$b.json 2>/dev/null
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
