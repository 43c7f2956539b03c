# source me on the GPU host after dev/gpu-build.sh
export PYTHONPATH=/tmp/site LLAMA_CPP_LIB_PATH=/tmp/cb/bin PYTHONUNBUFFERED=1
# PyTorch and this llama.cpp build disagree over the C++ runtime when the draft runs in PyTorch:
# importing torch after llama.cpp aborted ("free(): invalid pointer") and loading a model after
# torch segfaulted; preloading the system libstdc++ makes both orders work (H200 host, 2026-11).
export LD_PRELOAD=$(g++ -print-file-name=libstdc++.so.6)
