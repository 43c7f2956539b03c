#!/usr/bin/env bash
# On this machine (no GPU, no cuBLAS; CUDA 13.0's nvcc, as on the GPU host): build the GPU host's
# llama.cpp (dev/gpu-build.sh's configuration: sm_90, shared libraries, llama-server) and put it
# in .gpu/libs as the libs.* pieces and libs.key that gpu-build.sh reuses, so that a session's
# first GPU call skips the ~4.5-minute build. A build takes ~40 minutes on 2 cores.
#   bash dev/gpu-build-here.sh
# cuBLAS's headers and library come from the nvidia-cublas wheel of the package registry
# (CUBLAS_WHEEL: a local copy); the CUDA driver's library is a stub of its name only (the host's
# driver provides it). The libraries look for cuBLAS and the runtime where the host's CUDA image
# keeps them (RUNPATH below); gpu-build.sh loads a carried build once and builds there instead
# when it does not load, so a build from here that does not fit the host costs one check.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/tmp/gpu-build-here}
out=${LIBS:-$root/.gpu/libs}
nvcc=$(command -v nvcc) || { echo "needs CUDA's nvcc on the PATH" >&2; exit 2; }
cuda=$(cd "$(dirname "$(readlink -f "$nvcc")")/.." && pwd)
rm -rf "$work" && mkdir -p "$work/b" "$work/cublas" "$work/stub"

wheel=${CUBLAS_WHEEL:-}
if [ -z "$wheel" ]; then   # the version the host's toolkit carries (13.0)
  ${PYTHON:-python3} -m pip download -q --no-deps "nvidia-cublas==13.0.0.19" -d "$work/dl"
  wheel=$(ls "$work"/dl/nvidia_cublas-*.whl)
fi
(cd "$work/cublas" && ${PYTHON:-python3} -m zipfile -e "$wheel" .)
blas=$work/cublas/nvidia/cu13
ln -sf libcublas.so.13 "$blas/lib/libcublas.so" && ln -sf libcublasLt.so.13 "$blas/lib/libcublasLt.so"
# libcuda.so.1 as a stub: the driver functions ggml-cuda calls (`nm -D --undefined-only` of its
# library), defined empty so that the link records libcuda.so.1 as needed (a stub that defines none
# is dropped, and the calls would find nothing at run time); the host's driver defines them
for f in cuDeviceGet cuDeviceGetAttribute cuGetErrorString cuMemAddressFree cuMemAddressReserve cuMemCreate \
         cuMemGetAllocationGranularity cuMemMap cuMemRelease cuMemSetAccess cuMemUnmap; do
  echo "int $f(void) { return 0; }"
done > "$work/stub/libcuda.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$work/stub/libcuda.so" "$work/stub/libcuda.c"

tar xzf "$root/.gpu/src/llama-cpp-python.tgz" -C "$work/b"
src=$(ls -d "$work"/b/llama_cpp_python-*)
for patch in "$root"/packaging/patches/*.patch; do patch -s -p1 -d "$src" < "$patch"; done

# the host's CPU is not this one: its backend for the few operations left on the CPU (the token
# embeddings' rows) takes AVX2, which every GPU host has, not this machine's native set.
# RUNPATH: the CUDA image's toolkit and the pip wheels' folder beside PyTorch's, then the usual
# search; the executables take the driver's symbols from the host's libcuda at run time
rpath='$ORIGIN:/usr/local/cuda/lib64:/usr/local/cuda-13.0/lib64:/usr/local/cuda/targets/x86_64-linux/lib:/usr/local/lib/python3.12/dist-packages/nvidia/cu13/lib:/usr/local/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/lib/python3/dist-packages/nvidia/cu13/lib'
cmake -S "$src/vendor/llama.cpp" -B "$work/cb" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DCUDAToolkit_ROOT="$cuda" -DCUDA_cublas_LIBRARY="$blas/lib/libcublas.so" \
  -DCUDA_cublasLt_LIBRARY="$blas/lib/libcublasLt.so" -DCUDA_cuda_driver_LIBRARY="$work/stub/libcuda.so" \
  -DCMAKE_CUDA_FLAGS="-I$blas/include" -DCMAKE_CXX_FLAGS="-I$blas/include" \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,--allow-shlib-undefined" \
  -DCMAKE_SKIP_BUILD_RPATH=OFF -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH="$rpath" >/dev/null
[ -n "${CONFIGURE_ONLY:-}" ] && exit 0
cmake --build "$work/cb" -j"$(nproc)" --target llama llama-bench llama-server >/dev/null
# every driver function the build calls must come from a library it names as needed
lib=$work/cb/bin/libggml-cuda.so
missing=$(nm -D --undefined-only "$lib" | awk '$2 ~ /^cu[A-Z]/ {print $2}' | while read -r f; do
  grep -q "int $f(" "$work/stub/libcuda.c" || echo "$f"; done)
if [ -n "$missing" ] || ! readelf -d "$lib" | grep -q 'NEEDED.*libcuda.so.1'; then
  echo "libggml-cuda.so calls driver functions the stub lacks: $missing (add them above)" >&2; exit 1
fi
mkdir -p "$out" && rm -f "$out"/libs.*
(cd "$work/cb/bin" && tar cf - ./*.so* llama-server) | xz -T0 -6 | split -b 15m - "$out/libs."
bash "$root/dev/gpu-libs-key.sh" > "$out/libs.key"
ls -la "$out"
