#!/usr/bin/env bash
# On the GPU host, after dev/gpu-build.sh, which reassembles the models (the team's GPU staging puts the sdist and models in .gpu/):
# run `localspec bench` on the reference pair once per argument, each "WORKLOAD:LIMIT[:TEMP[:CONFIGS]]"
# (e.g. humaneval:40  humaneval:40:0.7  edit:40:0:plain,maxgram,adaptive), results under $OUT/NAME:
# bench.json only (a run's files come back only up to a count), bench.png too with PNG=1.
# HEAD=/path/head.npz adds --head (the head and adaptive-head configurations); without a draft model
# on the host, `adaptive` is skipped: name adaptive-nomodel as the baseline the head is measured against
# (e.g. humaneval:40:0:plain,adaptive-nomodel,head,adaptive-head).
set -euo pipefail
source "$(dirname "$0")/gpu-env.sh"
learn=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
for spec in "$@"; do
  IFS=: read -r workload limit temp configs <<< "$spec"
  temp=${temp:-0}; configs=${configs:-plain,maxgram,adaptive}
  name="$workload-$limit"; if [ "$temp" != 0 ]; then name="$name-t$temp"; fi
  mkdir -p "$OUT/$name"
  draft=(); if [ -f /tmp/mod/draft.gguf ]; then draft=(--draft /tmp/mod/draft.gguf); fi
  python3 -m localspec.app.cli bench --model /tmp/mod/target.gguf "${draft[@]}" \
    --workload "$workload" --limit "$limit" --max-tokens 256 --temperature "$temp" \
    --configs "$configs" ${HEAD:+--head "$HEAD"} --learn "$learn" --learn-max-tokens 1000000 --out "$OUT/$name" \
    > "/tmp/bench-$name.log" 2>&1 || echo "bench $name failed"
  tail -n 12 "/tmp/bench-$name.log"
  [ "${PNG:-0}" = 1 ] || rm -f "$OUT/$name/bench.png"
done
