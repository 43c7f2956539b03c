#!/usr/bin/env bash
# On the GPU host: run a session's long jobs one after another in the background, so that calls
# only start, poll and collect (the machine goes back ~30 s after a call ends, and a call brings
# back at most 8 files).
#   bash dev/gpu-queue.sh start JOBS.txt   one shell command a line (run from this checkout, with
#                                          dev/gpu-env.sh sourced; $RES is the results folder)
#   bash dev/gpu-queue.sh poll [SECONDS]   wait up to SECONDS (default 280) for the queue, then
#                                          print each job's state and its log's last lines
#   bash dev/gpu-queue.sh collect          everything under $RES and the logs as $OUT/queue.tgz
set -euo pipefail
q=/tmp/queue
case "${1:-}" in
  start)
    mkdir -p "$q/res" && cp "$2" "$q/jobs.txt" && : > "$q/status"
    cat > "$q/run.sh" <<RUN
cd "$PWD" && source dev/gpu-env.sh && export RES=$q/res
n=0
while IFS= read -r job; do
  [ -z "\$job" ] && continue; n=\$((n + 1))
  echo "\$n started \$(date +%T): \$job" >> $q/status
  bash -c "\$job" > $q/\$n.log 2>&1; echo "\$n ended rc=\$? \$(date +%T)" >> $q/status
done < $q/jobs.txt
echo "all done" >> $q/status
RUN
    (setsid nohup bash "$q/run.sh" > "$q/queue.log" 2>&1 &) ;;
  poll)
    for _ in $(seq 1 $(( ${2:-280} / 5 ))); do grep -q "all done" "$q/status" && break; sleep 5; done
    cat "$q/status"; for f in "$q"/[0-9]*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 4 "$f"; }; done ;;
  collect)
    tar czf "$OUT/queue.tgz" -C "$q" . && ls -la "$OUT/queue.tgz" ;;
  *) echo "usage: gpu-queue.sh start JOBS.txt | poll [SECONDS] | collect" >&2; exit 2 ;;
esac
