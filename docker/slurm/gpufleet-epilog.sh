#!/bin/sh
# gpufleet's Slurm epilog: records the job's end on this node for the agent, which
# publishes it at once (the summary follows within seconds), and frees its GPUs in
# dcgm-exporter's job mapping.
#
# Install as /etc/slurm/epilog.d/gpufleet.sh (mode 0755, owned by root), with the lines of
# slurm.conf.gpufleet in slurm.conf. slurmd runs it as root with the job in its environment.
# Where gpufleet lives and where it writes come from gpufleet-slurm.env beside this script
# (GPUFLEET=/opt/gpufleet/bin/gpufleet, GPUFLEET_SLURM_DIR=/run/gpufleet/slurm by default).
# It never fails: an epilog that exits non-zero drains the node.
here=$(dirname "$0")
[ -r "$here/gpufleet-slurm.env" ] && . "$here/gpufleet-slurm.env"
"${GPUFLEET:-/opt/gpufleet/bin/gpufleet}" slurm epilog --dir "${GPUFLEET_SLURM_DIR:-/run/gpufleet/slurm}"
exit 0
