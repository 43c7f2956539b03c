#!/usr/bin/env bash
# On a GPU host: the CUDA kernels chosen per batch width (docs/decisions/0044), measured on the
# reference-shaped 1.5B and the 7B and 32B shapes, all written there (dev/synthetic_target.py,
# the reference's tokenizer from .gpu/tok/tok.gguf: `synthetic_target.py --tokenizer-only`), so
# no model crosses to the host.
#   bash dev/gpu-dispatch.sh start      copy this checkout to /tmp/repo0, build llama.cpp there
#                                       (dev/gpu-build.sh) and write the targets, in the background
#   bash dev/gpu-dispatch.sh queue      once both are done: dev/cuda_width_curves.py on each target,
#                                       then the CUDA kernel tests, one after another in the
#                                       background (dev/gpu-queue.sh); TESTS=-k... narrows the tests,
#                                       TESTS=none skips them; SHAPES (default "1.5b 7b 32b") names the
#                                       targets; PROFILE_SHAPE=32b adds dev/verify_cost_probe.py's
#                                       kernel table at 8 and 16 rows on it, stock and fixed
#   bash dev/gpu-dispatch.sh wait SECS  wait up to SECS for the queue, copy what is done to $OUT
#   bash dev/gpu-dispatch.sh all JOBS   start, then a background starter that runs the queue of
#                                       JOBS (dev/gpu-queue.sh) once the build and the first
#                                       target are there: one call, no polling until results
#                                       (dev/gpu-session-jobs.txt: the planned session's jobs)
#   bash dev/gpu-dispatch.sh libs       once built: the build's libraries to $OUT as libs.* and
#                                       libs.key (put them in .gpu/libs: the next session skips the build)
set -euo pipefail
case "$1" in
  start)
    mkdir -p /tmp/mod/ref && rm -rf /tmp/repo0 && cp -r . /tmp/repo0 && cd /tmp/repo0
    (OUT= PARTS=/nonexistent setsid nohup bash dev/gpu-build.sh > /tmp/build.log 2>&1 &)
    python3 -m pip install -q --no-index --no-deps --target /tmp/gsite .gpu/whl/gguf*.whl
    (SHAPES="${SHAPES:-1.5b 7b 32b}" setsid nohup bash -c 'for s in $SHAPES; do
       PYTHONPATH=/tmp/gsite python3 dev/synthetic_target.py --shape $s /tmp/mod/s$s.gguf \
         --tokenizer-from .gpu/tok/tok.gguf || exit 1; done; echo generated' > /tmp/gen.log 2>&1 &)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ;;
  all)
    jobs=$(realpath "$2")
    SHAPES="${SHAPES:-7b 32b}" bash "$0" start
    cp "$jobs" /tmp/session-jobs.txt
    first=$(echo ${SHAPES:-7b 32b} | cut -d' ' -f1)
    (setsid nohup bash -c "for _ in \$(seq 200); do grep -q '^built' /tmp/build.log && break; sleep 3; done
       for _ in \$(seq 400); do [ -f /tmp/mod/s$first.gguf ] && break; sleep 3; done
       cd /tmp/repo0 && bash dev/gpu-queue.sh start /tmp/session-jobs.txt" > /tmp/starter.log 2>&1 &) ;;
  queue)
    cd /tmp/repo0
    for _ in $(seq 1 110); do grep -q '^built' /tmp/build.log && grep -q generated /tmp/gen.log && break; sleep 5; done
    grep -q '^built' /tmp/build.log || { tail -n 20 /tmp/build.log; exit 1; }
    grep -q generated /tmp/gen.log || { cat /tmp/gen.log; exit 1; }
    # the tests take the reference's tokenizer from a model that holds it
    ln -sf /tmp/mod/s1.5b.gguf /tmp/mod/ref/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > /tmp/queue-gpu.txt
      for s in ${SHAPES:-1.5b 7b 32b}; do echo "python3 dev/cuda_width_curves.py /tmp/mod/s$s.gguf \$RES/curves-$s.json"; done
      if [ -n "${PROFILE_SHAPE:-}" ]; then for d in stock:GGML_CUDA_MULTICOL_WIDTHS=0 fixed:; do
        echo "env ${d#*:} PROFILE=8,16 python3 dev/verify_cost_probe.py /tmp/mod/s$PROFILE_SHAPE.gguf 1,8,16 > \$RES/profile-$PROFILE_SHAPE-${d%%:*}.txt 2>&1"
      done; fi
      [ "${TESTS:-}" = none ] || echo "LOCALSPEC_BENCH_MODELS=/tmp/mod/ref python3 -m pytest -q -rs -p no:cacheprovider ${TESTS:-} tests/engine/test_multicol_cuda.py tests/engine/test_synthetic_target.py > \$RES/kernel-tests.txt 2>&1"
    } > /tmp/jobs.txt
    bash dev/gpu-queue.sh start /tmp/jobs.txt ;;
  libs)
    cd /tmp/repo0 && grep -q '^built' /tmp/build.log
    (cd /tmp/cb/bin && tar cf - ./*.so* llama-server) | xz -T16 -6 | split -b 15m - "$OUT/libs."
    bash dev/gpu-libs-key.sh > "$OUT/libs.key" ;;
  wait)
    bash /tmp/repo0/dev/gpu-queue.sh poll "${2:-280}"
    cp /tmp/queue/res/* /tmp/queue-gpu.txt "$OUT"/ 2>/dev/null || true
    tail -n 60 /tmp/queue/[0-9]*.log > "$OUT/logs.txt" 2>/dev/null || true ;;
esac
