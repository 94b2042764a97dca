#!/bin/bash
# The GPU audit of issue 13 on the lent H200 (after the shared/gpu install runs; source /tmp/gpu-env.sh
# first): SmolLM2, 50 Boxoffice cases with the default families (leak probes included), fp32 and
# bf16, every control arm. Results (audit tables, summaries) go to $OUT. CONCURRENT=N runs N cases at a
# time (--concurrent-cases N; files get a -cN suffix).
set -u
C=${CONCURRENT:-1}
S=$([ "$C" = 1 ] && echo "" || echo "-c$C")
export KVAUDIT_CACHE=/tmp/kvcache
python3 -m kvaudit.cli generate boxoffice --out /tmp/box50 --cases 50 --seed 0 > /dev/null
for dt in float32 bfloat16; do
  t0=$(date +%s)
  python3 -m kvaudit.cli run --backend vllm --model smollm2 --dtype $dt --dataset /tmp/box50 --out /tmp/r-$dt$S --concurrent-cases $C \
    --arms recompute,reuse,identity,reuse_norope,reuse_first_user,recompute_again --no-progress > $OUT/run-$dt$S.log 2>&1
  echo "$dt run rc=$? wall=$(( $(date +%s) - t0 ))s"
  python3 -m kvaudit.cli audit /tmp/r-$dt$S > $OUT/audit-$dt$S.txt 2>&1; echo "$dt audit rc=$?"
  python3 -m kvaudit.cli report /tmp/r-$dt$S > /dev/null 2>&1; echo "$dt report rc=$?"
  cp /tmp/r-$dt$S/summary.json $OUT/summary-$dt$S.json 2>/dev/null; cp /tmp/r-$dt$S/audit.json $OUT/audit-$dt$S.json 2>/dev/null
  cp /tmp/r-$dt$S/manifest.json $OUT/manifest-$dt$S.json 2>/dev/null; gzip -c /tmp/r-$dt$S/pairs.jsonl > $OUT/pairs-$dt$S.jsonl.gz
  tail -25 $OUT/audit-$dt$S.txt | cut -c1-220
done
