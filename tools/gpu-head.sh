#!/usr/bin/env bash
# On the GPU host, after tools/gpu-build.sh and the model reassembly: train a draft head for the
# target on this host's Python standard library (the text the bench's n-gram stage learns from
# too; HumanEval is not in it) and write it to /tmp/head.npz and $OUT/head.npz.
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
learn=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
python3 -m localspec.app.cli head train --model /tmp/mod/target.gguf --text "$learn" \
  --out /tmp/head.npz --max-tokens "${TOKENS:-1000000}" --steps "${STEPS:-3000}" "$@" 2>&1 | tail -n 25
cp /tmp/head.npz "$OUT/head.npz"
