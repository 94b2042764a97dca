#!/bin/bash
# The GPU audit of issue 13 on the lent H200 (after the shared/gpu install runs; source /tmp/gpu-env.sh
# first): SmolLM2, 50 Boxoffice cases with the default families (leak probes included), fp32 and
# bf16, every control arm. Results (audit tables, summaries) go to $OUT.
set -u
export KVAUDIT_CACHE=/tmp/kvcache
python3 -m kvaudit.cli generate boxoffice --out /tmp/box50 --cases 50 --seed 0 > /dev/null
for dt in float32 bfloat16; do
  t0=$(date +%s)
  python3 -m kvaudit.cli run --backend vllm --model smollm2 --dtype $dt --dataset /tmp/box50 --out /tmp/r-$dt \
    --arms recompute,reuse,identity,reuse_norope,reuse_first_user,recompute_again --no-progress > $OUT/run-$dt.log 2>&1
  echo "$dt run rc=$? wall=$(( $(date +%s) - t0 ))s"
  python3 -m kvaudit.cli audit /tmp/r-$dt > $OUT/audit-$dt.txt 2>&1; echo "$dt audit rc=$?"
  python3 -m kvaudit.cli report /tmp/r-$dt > /dev/null 2>&1; echo "$dt report rc=$?"
  cp /tmp/r-$dt/summary.json $OUT/summary-$dt.json 2>/dev/null; cp /tmp/r-$dt/audit.json $OUT/audit-$dt.json 2>/dev/null
  cp /tmp/r-$dt/manifest.json $OUT/manifest-$dt.json 2>/dev/null; gzip -c /tmp/r-$dt/pairs.jsonl > $OUT/pairs-$dt.jsonl.gz
  tail -25 $OUT/audit-$dt.txt | cut -c1-220
done
