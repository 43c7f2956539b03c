#!/usr/bin/env bash
# On the GPU host: build llama.cpp with CUDA from the staged sdist (../shared/docs/GPU.md) and
# make `localspec` importable from this checkout without network (a symlink shim in /tmp/site).
set -euo pipefail
mkdir -p /tmp/b /tmp/site/localspec
tar xzf .gpu/src/llama-cpp-python.tgz -C /tmp/b
d=$(ls -d /tmp/b/llama_cpp_python-*)
cmake -S "$d/vendor/llama.cpp" -B /tmp/cb -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
cmake --build /tmp/cb -j16 --target llama llama-bench >/dev/null
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
cp -r "$d/llama_cpp" /tmp/site/
for sub in engine models app; do ln -sfn "$PWD/$sub" "/tmp/site/localspec/$sub"; done
echo built; ls /tmp/cb/bin | head
