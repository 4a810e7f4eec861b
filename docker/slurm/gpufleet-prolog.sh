#!/bin/sh
# gpufleet's Slurm prolog: records the job's GPUs on this node for the agent
# (gpufleet agent --allocations slurm) and for dcgm-exporter (--hpc-job-mapping-dir).
#
# Install as /etc/slurm/prolog.d/gpufleet.sh (mode 0755, owned by root), with the lines of
# slurm.conf.gpufleet in slurm.conf. slurmd runs it as root with the job in its environment.
# Where gpufleet lives and where it writes come from gpufleet-slurm.env beside this script
# (GPUFLEET=/opt/gpufleet/bin/gpufleet, GPUFLEET_SLURM_DIR=/run/gpufleet/slurm by default).
# It never fails the job: a prolog that exits non-zero drains the node.
here=$(dirname "$0")
[ -r "$here/gpufleet-slurm.env" ] && . "$here/gpufleet-slurm.env"
"${GPUFLEET:-/opt/gpufleet/bin/gpufleet}" slurm prolog --dir "${GPUFLEET_SLURM_DIR:-/run/gpufleet/slurm}"
exit 0
