#!/bin/bash
# One device call of the SGLang carry (carry .gpu-sglang/cN): this call's files are kept in
# /root/sgl-stash; the last call joins any wheel that travelled in parts (checking its sha256),
# installs every wheel into /tmp/sgl-site, writes /tmp/sgl-env.sh and checks the server's modules import.
set -e; here=$(dirname "$0"); read -r i n < "$here/call"; S=/root/sgl-stash
if [ "$i" -gt 1 ] && [ ! -f $S/.call-$((i - 1)) ]; then
  echo "STASH_GONE: the machine went back (call $((i - 1)) is not there); start again at call 1"; exit 3; fi
mkdir -p $S; cp "$here"/w/* $S/; touch $S/.call-$i; echo "call $i of $n stashed"
[ "$i" = "$n" ] || exit 0
while read -r wheel sum parts; do
  [ -n "$wheel" ] || continue
  cat $(for k in $(seq 0 $((parts - 1))); do printf "$S/$wheel.part%02d " "$k"; done) > "$S/$wheel"
  [ "$(sha256sum "$S/$wheel" | cut -d' ' -f1)" = "$sum" ] || { echo "$wheel: checksum mismatch"; exit 4; }
  rm -f "$S/$wheel".part*
done < "$here/joins.txt"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sgl-site $S/*.whl \
  > /tmp/sgl-pip.log 2>&1 || { grep -v "already exists" /tmp/sgl-pip.log | tail -20; echo "install failed"; exit 5; }
rm -rf $S; cp "$here/sgl-env.sh" /tmp/sgl-env.sh
PYTHONPATH=/tmp/sgl-site python3 -c "import sglang, sgl_kernel, torch; import sglang.srt.entrypoints.http_server; \
print('sglang', sglang.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
