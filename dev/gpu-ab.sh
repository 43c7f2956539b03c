#!/usr/bin/env bash
# On the GPU host, after dev/gpu-build.sh (which reassembles the models): `localspec bench` of this checkout
# ("new") and of another source tree ("base", BASE=folder holding its engine/ models/ app/) on the
# same machine, one after the other per workload, each "WORKLOAD:LIMIT[:TEMP[:CONFIGS]]" as in
# dev/gpu-bench.sh. Each side starts from its own empty data dir (a cold calibration, as a new user).
# BASE_ENV="NAME=VALUE ..." instead of BASE: the base side is this checkout too, run with those
# environment variables (a llama.cpp switch such as GGML_CUDA_MMVQ_WIDE_MAX=0: one build, both paths).
# HEAD=/path/head.npz adds --head (the head configurations). Results: $OUT/{new,base}-NAME.json
# (bench.json of each run).
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
base_path=/tmp/sb:/tmp/site
if [ -n "${BASE_ENV:-}" ]; then
  base_path=/tmp/site
else
  mkdir -p /tmp/sb/localspec && touch /tmp/sb/localspec/__init__.py
  for sub in engine models app; do ln -sfn "$BASE/$sub" "/tmp/sb/localspec/$sub"; done
fi
learn=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
draft=(); if [ -f /tmp/mod/draft.gguf ]; then draft=(--draft /tmp/mod/draft.gguf); fi
for spec in "$@"; do
  IFS=: read -r workload limit temp configs <<< "$spec"
  temp=${temp:-0}; configs=${configs:-plain,maxgram,adaptive}
  name="$workload-$limit"; if [ "$temp" != 0 ]; then name="$name-t$temp"; fi
  for side in base new; do
    path=/tmp/site; side_env=()
    if [ "$side" = base ]; then path=$base_path; read -r -a side_env <<< "${BASE_ENV:-}"; fi
    mkdir -p "/tmp/out-$side-$name" "/tmp/data-$side"
    env "${side_env[@]}" PYTHONPATH=$path LOCALSPEC_DATA_DIR=/tmp/data-$side python3 -m localspec.app.cli bench \
      --model /tmp/mod/target.gguf "${draft[@]}" --workload "$workload" --limit "$limit" \
      --max-tokens 256 --temperature "$temp" --configs "$configs" --learn "$learn" \
      --learn-max-tokens 1000000 ${HEAD:+--head "$HEAD"} --out "/tmp/out-$side-$name" > "/tmp/bench-$side-$name.log" 2>&1 \
      || echo "bench $side $name failed: $(tail -n 3 /tmp/bench-$side-$name.log)"
    cp "/tmp/out-$side-$name/bench.json" "$OUT/$side-$name.json" 2>/dev/null || true
    echo "== $side $name"; tail -n 8 "/tmp/bench-$side-$name.log"
  done
done
