#!/usr/bin/env bash
# The key of a llama.cpp build for the GPU host (its libs.key): the patches it was built from, and
# what it holds besides the libraries (llama-server). gpu-build.sh reuses a carried build only
# under the current key; gpu-build-here.sh, gpu-dispatch.sh libs and gpu-prep.sh write or check it.
cd "$(dirname "$0")/.." && (cat packaging/patches/*.patch; echo with-llama-server) | sha256sum | cut -c1-16
