# source me on the GPU host after tools/gpu-build.sh
export PYTHONPATH=/tmp/site LLAMA_CPP_LIB_PATH=/tmp/cb/bin PYTHONUNBUFFERED=1
