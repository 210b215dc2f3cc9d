#!/bin/bash

# Parameters
#SBATCH --comment=hpcrun:tiny.submit.0
#SBATCH --cpus-per-task=2
#SBATCH --error=<tmp>/runs/tiny-1/logs/slurm-%j.err
#SBATCH --exclude=node3
#SBATCH --job-name=tiny
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --open-mode=append
#SBATCH --output=<tmp>/runs/tiny-1/logs/slurm-%j.out
#SBATCH --partition=batch
#SBATCH --requeue
#SBATCH --signal=USR1@60
#SBATCH --time=30
#SBATCH --wckey=submitit

# setup
export HPCRUN_RUN_DIR=<tmp>/runs/tiny-1
export HPCRUN_SITE=testbed
export HPCRUN_OP_ID=tiny.submit.0
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1
hpcrun_exit_file=<tmp>/runs/tiny-1/logs/job-"${SLURM_JOB_ID:-}".exit
rm -f "$hpcrun_exit_file"
hpcrun_job_exit() {
    local rc=$? ended
    ended=$(head -c 4 "$hpcrun_exit_file" 2>/dev/null)
    case "$ended" in ''|*[!0-9]*) ;; *) rc=$ended ;; esac
    exit "$rc"
}
trap hpcrun_job_exit EXIT
trap 'echo "hpcrun: batch shell got SIGTERM after the agents" >&2' TERM
trap 'echo "hpcrun: batch shell got SIGUSR1; the agents get it from Slurm" >&2' USR1

# command
export SUBMITIT_EXECUTOR=slurm
srun --unbuffered --output <tmp>/runs/tiny-1/submitit/%j_%t_log.out --error <tmp>/runs/tiny-1/submitit/%j_%t_log.err -n 2 --ntasks-per-node=1 --cpus-per-task=2 --kill-on-bad-exit=0 /opt/hpcrun/venv/bin/python -u -m submitit.core._submit <tmp>/runs/tiny-1/submitit
