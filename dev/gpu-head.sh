#!/usr/bin/env bash
# On the GPU host, after dev/gpu-build.sh (which reassembles the models): train a draft head for the
# target on this host's Python standard library (the text the bench's n-gram stage learns from
# too; HumanEval is not in it): TOKENS of its text and GEN tokens of the target's own
# continuations of its functions. Writes /tmp/head.npz, and $OUT/head.npz.00, .01 (16 MiB a file
# comes back).
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
learn=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
python3 -m localspec.app.cli head train --model /tmp/mod/target.gguf --text "$learn" \
  --no-history --no-stdlib --no-site-packages \
  --out /tmp/head.npz --max-tokens "${TOKENS:-300000}" --generated-tokens "${GEN:-700000}" \
  --parallel "${PARALLEL:-128}" --steps "${STEPS:-5000}" "$@" 2>&1 | grep -v "^step [0-9]*[1-9]00/" | tail -n 12
split -b 12M -d /tmp/head.npz "$OUT/head.npz."
