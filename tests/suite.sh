#!/usr/bin/env bash
# `make test`: the whole suite as two pytest processes side by side. The testbed tests
# (`-m slurm`) run one after another in one process, as they would alone: the testbed is one
# cluster and its tests crash and boot its nodes. Everything else (lint is done before, unit and
# local-backend tests, the browser check) runs in the other, over $LOCAL_WORKERS (2) pytest-xdist
# workers; most testbed time is waiting on Slurm (grace times, requeues), so they overlap. The
# second process's output is kept in $LOG_DIR/local.log and printed after the first's; the exit
# status is the first failure's.
# Usage: tests/suite.sh PYTHON [pytest args...]
set -uo pipefail
py=$1
shift
log_dir=${LOG_DIR:-.test-logs}
mkdir -p "$log_dir"
# Each half keeps its per-test timings (JUnit XML in $LOG_DIR) and prints its 25 slowest tests.
# worksteal: the local-backend runs (30-300 s each) are spread over both workers to the end,
# instead of queueing on one worker.
"$py" -m pytest tests -m "not slurm" -n "${LOCAL_WORKERS:-2}" --dist worksteal --durations=25 \
  --junit-xml="$log_dir/local.xml" "$@" >"$log_dir/local.log" 2>&1 &
local_pid=$!
"$py" -m pytest tests -m slurm --durations=25 --junit-xml="$log_dir/testbed.xml" "$@"
slurm_rc=$?
wait "$local_pid"
local_rc=$?
echo "==================== unit and local-backend tests ($log_dir/local.log) ===================="
cat "$log_dir/local.log"
echo "suite: testbed tests exit $slurm_rc, unit and local-backend tests exit $local_rc"
[ "$slurm_rc" -ne 0 ] && exit "$slurm_rc"
exit "$local_rc"
