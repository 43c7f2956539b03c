#!/usr/bin/env bash
# Build (or reuse) the llama-cpp-python wheel for this machine's CPU and print its path.
#
# Building from source takes ~5-15 min on 2 cores, so the wheel is cached under
# $LOCALSPEC_WHEEL_CACHE (default ~/.cache/localspec/wheels), keyed by version and CPU flags.
# CPU build: the instruction sets this CPU has (AVX2/AVX-512/VNNI/...), but never AMX: ggml's AMX
# path crashed (SIGSEGV in ggml_backend_amx_mul_mat) on the development VMs, which report AMX.
# CUDA build: LOCALSPEC_CUDA=1 adds -DGGML_CUDA=on (see packaging/README.md).
set -euo pipefail
ver=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
python=${PYTHON:-python3}
cache=${LOCALSPEC_WHEEL_CACHE:-$HOME/.cache/localspec/wheels}
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
has() { [[ " $flags " == *" $1 "* ]] && echo ON || echo OFF; }
args="-DGGML_NATIVE=OFF -DGGML_AVX=$(has avx) -DGGML_AVX2=$(has avx2) -DGGML_FMA=$(has fma)"
args+=" -DGGML_F16C=$(has f16c) -DGGML_BMI2=$(has bmi2) -DGGML_AVX_VNNI=$(has avx_vnni)"
args+=" -DGGML_AVX512=$(has avx512f) -DGGML_AVX512_VBMI=$(has avx512vbmi)"
args+=" -DGGML_AVX512_VNNI=$(has avx512_vnni) -DGGML_AVX512_BF16=$(has avx512_bf16)"
common="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"   # every build's, the AVX2 one's too
common+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
common+=" -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
args+=" $common"
# every build carries packaging/patches (see packaging/README.md): one CUDA graph per batch shape
# (CUDA); switches for ggml's split-KV attention and tiled matmul, and multi-column Q4_K/Q5_K/Q6_K
# and repacked Q4_0 (and, with AVX-512 VNNI, Q8_0) kernels for small batches (CPU)
patches=$(ls "$(dirname "$0")"/patches/*.patch 2>/dev/null || true)
if [ "${LOCALSPEC_CUDA:-0}" = 1 ]; then
  args+=" -DGGML_CUDA=on"
fi
stamp="$ver $args $($python -c 'import sys; print(sys.version_info[:2])')"
if [ -n "$patches" ]; then stamp+=" $(cat $patches | sha256sum)"; fi
stamp+=" $(sha256sum < "$0")"   # this script: what it builds beside the wheel (avx2/) is cached too
key=$(echo "$stamp" | sha256sum | cut -c1-12)
dir="$cache/$key"
whl=$(ls "$dir"/llama_cpp_python-"$ver"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$whl" ]; then
  echo "building llama-cpp-python $ver from source (cached afterwards in $dir) ..." >&2
  mkdir -p "$dir"
  tmp=$(mktemp -d "$dir.tmp.XXXX")
  src="llama-cpp-python==$ver"
  if [ -n "$patches" ]; then   # the sdist, patched, built from its folder
    mkdir -p "$tmp/sdist"
    sdist=${LLAMA_CPP_PYTHON_SDIST:-}   # a local copy of that sdist (offline builds), else PyPI's
    if [ -z "$sdist" ]; then
      $python -m pip download -q --no-cache-dir --no-deps --no-binary=:all: "$src" -d "$tmp/sdist" >&2
      sdist=$(ls "$tmp"/sdist/llama_cpp_python-*.tar.gz)
    fi
    tar xzf "$sdist" -C "$tmp/sdist"
    src=$(ls -d "$tmp"/sdist/llama_cpp_python-*/)
    for p in $patches; do
      if command -v patch >/dev/null; then patch -s -p1 -d "$src" < "$p"
      else (cd "$src" && git apply -p1 "$(cd "$(dirname "$p")" && pwd)/$(basename "$p")"); fi
    done
  fi
  CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    $python -m pip wheel -q --no-cache-dir --no-deps --no-binary=llama-cpp-python "$src" -w "$tmp" >&2
  # On an AVX-512 CPU the wheel takes the patches' AVX-512 kernels, so their AVX2 forms (what CPUs
  # without AVX-512 run) would go untested here: the same patched llama.cpp is built for AVX2 too,
  # its libraries kept beside the wheel (avx2/) for tests/engine/test_multicol_avx2.py. Skipped
  # without a cmake on the PATH (the wheel's own build brings one of its own).
  if [ -n "$patches" ] && [ "$(has avx512f)" = ON ] && [ "$(has avx2)" = ON ] && command -v cmake >/dev/null; then
    echo "building its AVX2 libraries for the kernels' tests ..." >&2
    a2="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    a2+=" -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF $common -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_TYPE=Release"
    if ! { cmake -S "$src/vendor/llama.cpp" -B "$tmp/avx2" $a2 >/dev/null &&
           cmake --build "$tmp/avx2" --target llama ggml-cpu -j "$(nproc)" >/dev/null &&
           mkdir -p "$dir/avx2.tmp" && cp -P "$tmp"/avx2/bin/lib*.so* "$dir/avx2.tmp/" &&
           mv "$dir/avx2.tmp" "$dir/avx2"; }; then
      echo "the AVX2 libraries did not build: their test will skip" >&2; rm -rf "$dir/avx2.tmp"
    fi
  fi
  mv "$tmp"/llama_cpp_python-*.whl "$dir"/ && rm -rf "$tmp"
  whl=$(ls "$dir"/llama_cpp_python-"$ver"-*.whl | head -1)
fi
echo "$whl"
