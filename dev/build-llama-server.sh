#!/usr/bin/env bash
# llama.cpp's llama-server for this CPU, from the llama-cpp-python sdist localspec builds
# (packaging/build-llama-wheel.sh's version) with packaging/patches applied: the same kernels as
# localspec's own build, for `localspec bench --serve --llama-server PATH` on a CPU. On a GPU host
# dev/gpu-build.sh builds the CUDA one (/tmp/cb/bin/llama-server).
#   bash dev/build-llama-server.sh [BUILD_DIR]     # default /tmp/llama-server-cpu; prints the binary
# LLAMA_CPP_PYTHON_SDIST=FILE.tar.gz (or .tgz) builds from a local copy, else pip downloads it.
# Static (no shared libraries to find), native to this CPU, without the web UI's assets (their
# build would download them).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-/tmp/llama-server-cpu}
ver=$(sed -n 's/^ver=\${LLAMA_CPP_PYTHON_VERSION:-\(.*\)}$/\1/p' "$root/packaging/build-llama-wheel.sh")
ver=${LLAMA_CPP_PYTHON_VERSION:-$ver}   # as build-llama-wheel.sh reads it
[ -n "$ver" ] || { echo "no llama-cpp-python version in packaging/build-llama-wheel.sh" >&2; exit 1; }
src=$(mktemp -d "${TMPDIR:-/tmp}/llama-server-src.XXXX")
trap 'rm -rf "$src"' EXIT
sdist=${LLAMA_CPP_PYTHON_SDIST:-}
if [ -z "$sdist" ]; then
  python3 -m pip download -q --no-cache-dir --no-deps --no-binary=:all: "llama-cpp-python==$ver" -d "$src" >&2
  sdist=$(ls "$src"/llama_cpp_python-*.tar.gz)
fi
tar xzf "$sdist" -C "$src"
d=$(ls -d "$src"/llama_cpp_python-*/)
for p in "$root"/packaging/patches/*.patch; do patch -s -p1 -d "$d" < "$p"; done
cmake -S "$d/vendor/llama.cpp" -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF >&2
cmake --build "$out" -j "${JOBS:-$(nproc)}" --target llama-server >&2
echo "$out/bin/llama-server"
