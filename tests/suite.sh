#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side. The testbed tests
# (`-m slurm`) run in one, over $TESTBED_LANES (2) xdist workers, worker K on testbed lane K: a
# Slurm cluster of its own (`hpcrun testbed up --lane K`), since the tests crash and boot nodes
# and preempt whatever runs on the batch partition; a test module stays on one lane
# (--dist loadfile). Everything else (lint is done before, unit and local-backend tests, the
# browser check) runs in the other, over $LOCAL_WORKERS (3) workers. Most testbed time is waiting
# on Slurm (grace times, requeues), so they overlap. The second process's output is kept in
# $LOG_DIR/local.log and printed after the first's; the exit status is the first failure's.
# Usage: tests/suite.sh PYTHON [pytest args...]
set -uo pipefail
py=$1
shift
log_dir=${LOG_DIR:-.test-logs}
mkdir -p "$log_dir"
# Each half keeps its per-test timings (JUnit XML in $LOG_DIR) and prints its 25 slowest tests.
# worksteal: the local-backend runs (30-300 s each) are spread over all workers to the end,
# instead of queueing on one worker.
"$py" -m pytest tests -m "not slurm" -n "${LOCAL_WORKERS:-3}" --dist worksteal --durations=25 \
  --junit-xml="$log_dir/local.xml" "$@" >"$log_dir/local.log" 2>&1 &
local_pid=$!
lanes=${TESTBED_LANES:-2}
hpcrun="$(dirname "$py")/hpcrun"
started=()  # lanes this script brought up, newest first (the last one down stops munged)
if [ "$(id -u)" = 0 ]; then  # without root the testbed tests skip themselves
  for ((k = 0; k < lanes; k++)); do
    if ! out=$("$hpcrun" testbed up --lane "$k" 2>&1); then
      echo "$out" >&2
      echo "suite: testbed lane $k did not come up (see above)" >&2
      kill "$local_pid"
      exit 1
    fi
    echo "$out" | head -1
    [[ $out == "testbed started"* ]] && started=("$k" "${started[@]}")
  done
fi
"$py" -m pytest tests -m slurm -n "$lanes" --dist loadfile --durations=25 \
  --junit-xml="$log_dir/testbed.xml" "$@"
slurm_rc=$?
for k in "${started[@]}"; do
  "$hpcrun" testbed down --lane "$k" | head -1
done
wait "$local_pid"
local_rc=$?
echo "==================== unit and local-backend tests ($log_dir/local.log) ===================="
cat "$log_dir/local.log"
echo "suite: testbed tests exit $slurm_rc, unit and local-backend tests exit $local_rc"
[ "$slurm_rc" -ne 0 ] && exit "$slurm_rc"
exit "$local_rc"
