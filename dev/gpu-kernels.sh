#!/usr/bin/env bash
# On the GPU host, with the model pieces in .gpu/m (or the folder PARTS names): build llama.cpp and
# reassemble the models (dev/gpu-build.sh), run the kernel tests, then dev/verify_cost_probe.py once
# per VARIANTS entry ("name:VAR=VALUE,VAR=VALUE;name2:...": llama.cpp switches), one build.
# Results: $OUT/probe-NAME.txt, $OUT/kernel-tests.txt.
set -euo pipefail
bash dev/gpu-build.sh > /tmp/build.log 2>&1 || { tail -n 30 /tmp/build.log; exit 1; }
tail -n 4 /tmp/build.log
source dev/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -m pytest -q -rs -p no:cacheprovider tests/engine/test_multicol.py tests/engine/test_multicol_cuda.py \
  > "$OUT/kernel-tests.txt" 2>&1 || true
tail -n 5 "$OUT/kernel-tests.txt"
sizes=${SIZES:-1,2,3,4,5,6,7,8,9,10,12,16}
variants=${VARIANTS:-stock:}
IFS=';' read -r -a list <<< "$variants"
for item in "${list[@]}"; do
  name=${item%%:*}; IFS=',' read -r -a vars <<< "${item#*:}"
  env "${vars[@]}" PROFILE=${PROFILE-8,16} python3 dev/verify_cost_probe.py /tmp/mod/target.gguf "$sizes" \
    > "$OUT/probe-$name.txt" 2>&1 || true
  echo "== $name ${vars[*]}"; sed -n 2,13p "$OUT/probe-$name.txt"
done
