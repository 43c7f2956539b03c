#!/usr/bin/env bash
# On the GPU host, after dev/gpu-build.sh (which reassembles the models): train a draft head for the
# target on this host's Python standard library and site-packages (what `head train` reads by
# default, less the chat history; HumanEval is in neither, dev/head_contamination.py): TOKENS of
# their text and GEN tokens of the target's own continuations of their functions, for MINUTES of
# training steps. The target's states are kept in /tmp/corpus.npz (--corpus): a second run with
# other flags (--ff, --length, more MINUTES) trains on them without reading the text again.
# Writes HEAD (default /tmp/head.npz); RETURN=1 also puts it under $OUT in 12 MB pieces (a
# reference-target head of the default shape is 35 MB: one call; `--ff 6144 --draft-vocab 32768`,
# the old default, makes one of 78 MB: two calls, below).
# Run it in the background and poll (dev/README.md): training outlasts a call.
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
head=${HEAD:-/tmp/head.npz}
python3 -m localspec.app.cli head train --model /tmp/mod/target.gguf --no-history --corpus /tmp/corpus.npz \
  --out "$head" --max-tokens "${TOKENS:-300000}" --generated-tokens "${GEN:-700000}" \
  --parallel "${PARALLEL:-128}" --steps 100000 --minutes "${MINUTES:-5}" "$@" 2>&1 | grep -v "^llama\|^load" | tail -n 16
# what one call brings back is bounded (~70 MB): the pieces wait in /tmp/headparts, PIECES (a glob,
# default all) picks this call's; a later call copies the rest (`cp /tmp/headparts/*.0[4-9] $OUT/`)
if [ "${RETURN:-0}" = 1 ]; then
  mkdir -p /tmp/headparts && split -b 12M -d "$head" "/tmp/headparts/$(basename "$head")."
  cp /tmp/headparts/$(basename "$head").${PIECES:-*} "$OUT/"
fi
