#!/usr/bin/env bash
# own-slurm: the entry script every node runs under slurm.
# slurm/job.sbatch starts it once per node with srun.
#
# The engine's variables mean other things than the launcher's (SLURM_PROCID is not a
# rank here): this script turns them into NODE_RANK, NODE_ADDR (HCCL_IF_IP), MASTER_ADDR,
# MASTER_PORT and HCCL_IF_BASE_PORT, checks them, and runs launch/run-node.sh, the launch
# script every node shares, which starts 'src/my train.py' on every rank. Anything unexpected stops the node here, with the reason.
#
# A stop signal (slurm/job.sbatch passes Slurm's SIGUSR1 on as SIGTERM, scancel sends SIGTERM)
# has every rank save a checkpoint at its next logged step: the node then exits with code 75,
# "preempted, checkpoint saved" (launch/run-node.sh says so in one line), not a failure.
#
# Ports: jobs may share a node, so each job takes its own from its job id:
#   MASTER_PORT       = 29500 + job id % 1000
#   HCCL_IF_BASE_PORT = 60000 + slot x 32, slot = job id % 64
# Jobs fewer than 64 ids apart never share a port; two jobs 64 (or 1000) ids apart
# on one node would. Where a port is still taken, the preflight (runtime/preflight.py)
# stops the node before any rank starts, naming the port and the slot that another job holds.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
    echo "launch/entry.sh: $*" >&2
    exit 2
}

whole_number() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

EXPECTED_NODES=2
NPROC_PER_NODE=8

# ---- Slurm -------------------------------------------------------------------------
# Slurm sets neither RANK nor WORLD_SIZE nor MASTER_ADDR; it names the node (SLURM_NODEID),
# the node count (SLURM_NNODES), the job and its nodes.
for name in SLURM_JOB_ID SLURM_NODEID SLURM_NNODES SLURM_JOB_NODELIST; do
    [[ -n "${!name:-}" ]] || fail "$name is not set: run this through srun in slurm/job.sbatch (sbatch slurm/job.sbatch)"
done
whole_number "$SLURM_JOB_ID" || fail "SLURM_JOB_ID='$SLURM_JOB_ID' is not a job number"
whole_number "$SLURM_NODEID" || fail "SLURM_NODEID='$SLURM_NODEID' is not a node index"
whole_number "$SLURM_NNODES" || fail "SLURM_NNODES='$SLURM_NNODES' is not a node count"
if [[ "${SLURM_NTASKS_PER_NODE:-1}" != 1 ]]; then
    fail "SLURM_NTASKS_PER_NODE=$SLURM_NTASKS_PER_NODE: one task per node expected (srun --ntasks-per-node=1); the launcher starts the ranks"
fi
job_id="$SLURM_JOB_ID"
node_rank="$SLURM_NODEID"
node_count="$SLURM_NNODES"
# The master is the job's first node, at the address Slurm itself uses for it.
hostnames="$(scontrol show hostnames "$SLURM_JOB_NODELIST")" ||
    fail "scontrol cannot list the nodes of SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
first_node="${hostnames%%$'\n'*}"
[[ -n "$first_node" ]] || fail "scontrol found no node in SLURM_JOB_NODELIST='$SLURM_JOB_NODELIST'"
node_info="$(scontrol show node "$first_node")" || fail "scontrol cannot show the master node $first_node"
if [[ "$node_info" =~ NodeAddr=([^[:space:]]+) ]]; then
    master="${BASH_REMATCH[1]}"
else
    master="$first_node"
fi
# A GRES of NPUs arrives as CUDA_VISIBLE_DEVICES (Slurm has no Ascend device plugin).
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" && -z "${ASCEND_RT_VISIBLE_DEVICES:-}" ]]; then
    export ASCEND_RT_VISIBLE_DEVICES="$CUDA_VISIBLE_DEVICES"
fi
# An inherited MASTER_PORT is ignored: every node of the job must compute the same one.
master_offset=$((job_id % 1000))
hccl_slot=$((job_id % 64))
master_port=$((29500 + master_offset))
hccl_base=$((60000 + hccl_slot * 32))
# For the preflight: a port found taken is then named with the job and the slot it came from.
export NPU_WIZARD_JOB_ID="$job_id" NPU_WIZARD_HCCL_SLOT="$hccl_slot"
job="job $job_id"
# A requeued job (scontrol requeue after the ranks saved on a stop signal) runs again with
# SLURM_RESTART_COUNT set: a later start of the job, which resumes (launch/run-node.sh).
if whole_number "${SLURM_RESTART_COUNT:-0}" && ((10#${SLURM_RESTART_COUNT:-0} > 0)); then
    whole_number "${NPU_WIZARD_ATTEMPT:-1}" || NPU_WIZARD_ATTEMPT=1
    export NPU_WIZARD_ATTEMPT=$((10#${NPU_WIZARD_ATTEMPT:-1} + 10#$SLURM_RESTART_COUNT))
    export NPU_WIZARD_RESUMING=1
fi

# ---- checks every engine shares ------------------------------------------------------
if ((node_count != EXPECTED_NODES)); then
    fail "the job has $node_count node(s) but this project was rendered for $EXPECTED_NODES: ask the engine for $EXPECTED_NODES, or render again with nodes: $node_count"
fi
((node_rank < node_count)) || fail "node rank $node_rank is not below the node count $node_count"
if [[ -n "${ASCEND_RT_VISIBLE_DEVICES:-}" ]]; then
    [[ "$ASCEND_RT_VISIBLE_DEVICES" =~ ^[0-9]+(,[0-9]+)*$ ]] ||
        fail "ASCEND_RT_VISIBLE_DEVICES='$ASCEND_RT_VISIBLE_DEVICES' is not a list of device numbers"
    visible="$(awk -F, '{ print NF }' <<<"$ASCEND_RT_VISIBLE_DEVICES")"
    if ((visible < NPROC_PER_NODE)); then
        fail "this node sees $visible device(s) ($ASCEND_RT_VISIBLE_DEVICES) but runs $NPROC_PER_NODE rank(s): ask the engine for $NPROC_PER_NODE devices per node"
    fi
fi
master_ip="$(getent ahosts "$master" | awk 'NR == 1 { print $1 }')"
[[ -n "$master_ip" ]] || fail "cannot resolve the master node '$master' on $(hostname)"
# This node's address for HCCL: the one its route to the master leaves from.
if ! route="$(ip -o route get "$master_ip" 2>&1)"; then
    fail "no route from $(hostname) to the master $master_ip: $route"
fi
own_ip="$(sed -n 's/.* src \([^ ]*\).*/\1/p' <<<"$route")"
[[ -n "$own_ip" ]] || fail "cannot tell this node's address towards the master from: $route"

export NODE_RANK="$node_rank"
export MASTER_ADDR="$master_ip"
export MASTER_PORT="$master_port"
export NODE_ADDR="$own_ip"
export HCCL_IF_BASE_PORT="$hccl_base"
echo "entry: $job node $NODE_RANK of $node_count on $(hostname): master $MASTER_ADDR:$MASTER_PORT, HCCL_IF_IP $NODE_ADDR, HCCL ports from $HCCL_IF_BASE_PORT"
exec bash launch/run-node.sh "$@"
