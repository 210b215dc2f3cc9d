#!/bin/bash
# hpcrun job script for run tiny on site testbed.
# Spec <spec-id>; operation tiny.submit.0.
# Submit with `sbatch <this file>`; it starts one hpcrun agent per node.
#SBATCH --job-name=tiny
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=30
#SBATCH --partition=batch
#SBATCH --exclude=node3,node4
#SBATCH --requeue
#SBATCH --signal=USR1@60
#SBATCH --open-mode=append
#SBATCH --comment=hpcrun:tiny.submit.0
#SBATCH --output=/shared/runs/tiny-20250101-000000-abcd/logs/slurm-%j.out
#SBATCH --error=/shared/runs/tiny-20250101-000000-abcd/logs/slurm-%j.err

# No `set -e`: this shell must reach the wait loop below whatever happens before it.
set -uo pipefail

export HPCRUN_RUN_DIR=/shared/runs/tiny-20250101-000000-abcd
export HPCRUN_SITE=testbed
export HPCRUN_OP_ID=tiny.submit.0
export HPCRUN_PREEMPT_SIGNAL=USR1
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1

# The job's exit status is the run's outcome once the run has ended (a node lost and repaired
# inside the allocation leaves a killed task behind in the step's own status).
hpcrun_exit_file=/shared/runs/tiny-20250101-000000-abcd/logs/job-"${SLURM_JOB_ID:-}".exit
rm -f "$hpcrun_exit_file"
hpcrun_job_exit() {
    local rc=$? ended
    ended=$(head -c 4 "$hpcrun_exit_file" 2>/dev/null)
    case "$ended" in ''|*[!0-9]*) ;; *) rc=$ended ;; esac
    exit "$rc"
}
trap hpcrun_job_exit EXIT

# Preemption: Slurm sends SIGUSR1 to the job steps (--signal without B:), so every agent
# gets it directly. If it reaches this shell instead (`scancel --batch`), forward it to the step.
# SIGTERM (preemption grace, time limit) must not end this shell before the agents have
# committed: it is logged and the shell keeps waiting.
srun_pid=""
forward_preempt() { if [ -n "$srun_pid" ]; then kill -s USR1 "$srun_pid" 2>/dev/null; fi; }
trap forward_preempt USR1
trap 'echo "hpcrun: batch shell got SIGTERM; waiting for the agents to commit" >&2' TERM

# Each agent starts with SIGUSR1 ignored (an ignored signal stays ignored across exec)
# until its first instructions hold it: a notice that reaches the step while the interpreter
# starts must not kill the agent.
srun -n 2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=0 \
    /bin/sh -c 'trap "" USR1; exec "$@"' hpcrun-agent \
    /opt/hpcrun/venv/bin/python -m hpcrun.runtime --run-dir /shared/runs/tiny-20250101-000000-abcd &
srun_pid=$!
while true; do
    wait "$srun_pid"
    rc=$?
    kill -0 "$srun_pid" 2>/dev/null || break
done
exit "$rc"
