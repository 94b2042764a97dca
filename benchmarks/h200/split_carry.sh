#!/bin/bash
# The shared bundle's first two carry folders (.gpu/c1 61 MiB, .gpu/c2 58 MiB) no longer fit one device
# call beside this repository's 13 MB of tracked files (64 MiB a call, 2026-12-07). Run once after
# `bash ../shared/gpu/make-vllm-bundle.sh`: it re-splits them into four calls of at most 45 MiB, so the
# install is seven calls, each within 30 s of the last:
#   c0, c1, c1b, c2, c3, c4, then c5 with your command   (carry [".gpu/<name>"], `bash .gpu/<name>/step.sh`)
# Run the first call alone: when no machine comes, each further call is refused at 15 s of device time.
# Once it has run, send the other six in one batch of tool calls: a pause of more than 30 s between two
# of them (time spent reading a reply) gives the machine back, and the stash with it (2026-12-07).
set -euo pipefail
cd "$(dirname "$0")/../../.gpu"
[ -f c1/vllm.part00 ] && [ -f c2/vllm.part01 ] || { echo "split_carry: .gpu is not the fresh bundle (already split?)" >&2; exit 2; }
mkdir -p c0 c1b
split -n 2 -d c1/vllm.part00 c1/half
mv c1/half00 c0/
rm c1/vllm.part00
mv c2/vllm.part01 c1b/
chmod u+w c1/step.sh c2/step.sh
cat > c0/step.sh <<'EOF'
#!/bin/bash
set -e; mkdir -p /root/gpu-stash; cp .gpu/c0/half00 /root/gpu-stash/; echo "c0 stashed"
EOF
cat > c1/step.sh <<'EOF'
#!/bin/bash
set -e; S=/root/gpu-stash; test -f $S/half00 || { echo "STASH_GONE: start again at c0"; exit 3; }
cat $S/half00 .gpu/c1/half01 > $S/vllm.part00; rm $S/half00; echo "c1 stashed"
EOF
cat > c1b/step.sh <<'EOF'
#!/bin/bash
set -e; S=/root/gpu-stash; test -f $S/vllm.part00 || { echo "STASH_GONE: start again at c0"; exit 3; }
cp .gpu/c1b/vllm.part01 $S/; echo "c1b stashed"
EOF
sed -i 's#\.gpu/c2/vllm\.part01#$S/vllm.part01#' c2/step.sh
du -sh c0 c1 c1b c2 c3 c4 c5
