#!/usr/bin/env bash
# Builds the folders that carry SGLang 0.5.17 (the newest release pinning torch==2.11.0, the lent
# H200's own build) onto the GPU machine, at most ~56 MiB a device call (the tree travels too), into .gpu-sglang/cN
# (ignored through .git/info/exclude; never commit them). Run from the project root, on a machine
# with PyPI:   bash scripts/make-sglang-bundle.sh        (downloads ~200 MB once, cached)
# Then the device calls, back to back (each within 30 s of the last), as scripts/sglang-gpu/README.md says.
#
# What travels (about 380 MB, seven calls): sglang itself; sglang-kernel 0.4.5 without flash_ops.abi3.so (FA3, 342 MiB, imported
# only by the fa3 attention backend: the server is started with --attention-backend triton
# --sampling-backend pytorch); flashinfer-python, xgrammar, transformers 5.12.1 and tokenizers 0.22.2
# (the image's 5.17.0 and 0.23.2 are too new for 0.5.17's pins); and every other wheel of 0.5.17's
# dependency closure the image lacks (the image's packages: /work/.library/device/KINDS.md, "Python
# packages already there"). All of it goes to /tmp/sgl-site on the machine, beside (not into) the
# vLLM carry's /tmp/site, so the two engines' pins never meet.
set -euo pipefail
root=$(git rev-parse --show-toplevel); cd "$root"
out=.gpu-sglang; dl=${GPU_BUNDLE_CACHE:-$HOME/.cache/kvaudit-gpu-wheels}/sglang-0.5.17
here=scripts/sglang-gpu
grep -qx "/$out/" .git/info/exclude 2>/dev/null || echo "/$out/" >> .git/info/exclude
mkdir -p "$dl"
plat=(--platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux1_x86_64 --platform any)
# 1. The dependency closure, resolved by uv from PyPI's metadata for the machine's platform, with the
# image's torch stood in by an empty wheel (its CUDA libraries are the image's: nothing of torch travels).
uv=${UV:-.venv/bin/uv}; [ -x "$uv" ] || uv=uv
python3 - "$dl/torch-2.11.0-py3-none-any.whl" <<'PY'
import base64, hashlib, sys, zipfile
di = "torch-2.11.0.dist-info"
files = {f"{di}/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n",
         f"{di}/WHEEL": b"Wheel-Version: 1.0\nGenerator: kvaudit\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
digest = lambda v: base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b"=").decode()
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for k, v in files.items():
        z.writestr(k, v)
    z.writestr(f"{di}/RECORD", "".join(f"{k},sha256={digest(v)},{len(v)}\n" for k, v in files.items()) + f"{di}/RECORD,,\n")
PY
echo "torch @ file://$dl/torch-2.11.0-py3-none-any.whl" > "$dl/overrides.txt"
printf 'sglang==0.5.17\nsglang-kernel==0.4.5\ntransformers==5.12.1\ntokenizers==0.22.2\n' > "$dl/requirements.txt"
"$uv" pip compile "$dl/requirements.txt" --override "$dl/overrides.txt" --python-version 3.12 \
  --python-platform x86_64-manylinux_2_34 --only-binary :all: --no-header --no-annotate -q -o "$dl/closure.txt"
# 2. What the image lacks (or holds at another version kvaudit's pins refuse), downloaded without deps.
python3 - "$dl/closure.txt" "$here/image-packages.txt" "$dl/wanted.txt" <<'PY'
import re, sys
closure, image, wanted = sys.argv[1:]
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
have = {norm(l.strip()) for l in open(image) if l.strip() and not l.startswith("#")}
must = {"transformers", "tokenizers", "sglang", "sglang-kernel", "flashinfer-python", "xgrammar"}
skip = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|torchvision|torchaudio)$")
rows = []
for line in open(closure):
    line = line.split("#")[0].strip()
    if not line or "==" not in line:
        continue
    name = norm(line.split("==")[0])
    if skip.match(name) or (name in have and name not in must):
        continue
    rows.append(line)
open(wanted, "w").write("\n".join(sorted(rows)) + "\n")
print(f"{len(rows)} wheels to carry")
PY
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$dl/w" -r "$dl/wanted.txt"
# 3. sglang-kernel without FA3; then the wheels packed into calls of at most 62 MiB.
python3 - "$dl" "$out" <<'PY'
import hashlib, pathlib, re, shutil, sys, zipfile
dl, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
shutil.rmtree(out, ignore_errors=True)
w = dl / "w"
for k in w.glob("sglang_kernel-*.whl"):
    slim = dl / k.name
    drop = re.compile(r"(^|/)flash_ops\.abi3\.so$")
    with zipfile.ZipFile(k) as zi, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as zo:
        for info in zi.infolist():
            if drop.search(info.filename):
                continue
            data = zi.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(l for l in data.decode().splitlines(True) if not drop.search(l.split(",")[0])).encode()
            zo.writestr(info, data, compress_type=info.compress_type)
    k.unlink(); shutil.move(slim, k)
LIMIT = 56 * 2**20  # the working tree travels too (about 6 MiB): 64 MiB in all
# A wheel over one call's limit travels in parts (joined and checked on the machine in the last call).
items: list[tuple[str, bytes | pathlib.Path]] = []
joins = []
for f in sorted(w.glob("*.whl")):
    data = f.read_bytes()
    if len(data) <= LIMIT:
        items.append((f.name, f))
        continue
    parts = [data[i:i + LIMIT] for i in range(0, len(data), LIMIT)]
    joins.append(f"{f.name} {hashlib.sha256(data).hexdigest()} {len(parts)}")
    items += [(f"{f.name}.part{k:02d}", part) for k, part in enumerate(parts)]
size = lambda item: item[1].stat().st_size if isinstance(item[1], pathlib.Path) else len(item[1])
calls: list[list] = []
for item in sorted(items, key=lambda it: -size(it)):  # first fit, largest first
    for c in calls:
        if sum(map(size, c)) + size(item) <= LIMIT:
            c.append(item); break
    else:
        calls.append([item])
for i, c in enumerate(calls, 1):
    d = out / f"c{i}" / "w"; d.mkdir(parents=True)
    for name, src in c:
        if isinstance(src, pathlib.Path):
            shutil.copy(src, d / name)
        else:
            (d / name).write_bytes(src)
(out / f"c{len(calls)}" / "joins.txt").write_text("".join(j + "\n" for j in joins))
print(f"{len(calls)} calls: " + ", ".join(f"c{i} {sum(map(size, c)) / 2**20:.0f} MiB" for i, c in enumerate(calls, 1)))
PY
n=$(ls -d "$out"/c* | wc -l)
for i in $(seq 1 "$n"); do
  cp "$here/step.sh" "$out/c$i/step.sh"; echo "$i $n" > "$out/c$i/call"
done
cp "$here/sgl-env.sh" "$out/c$n/"
du -sm "$out"/c* | while read -r mb d; do [ "$mb" -le 57 ] || { echo "$d is ${mb} MiB, over a call's limit with the tree"; exit 1; }; echo "$d ${mb} MiB"; done
echo "ready: $n device calls, carry .gpu-sglang/c1 .. c$n in turn (scripts/sglang-gpu/README.md)"
