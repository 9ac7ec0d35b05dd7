#!/usr/bin/env bash
# own-acjob: the entry script every node runs under ascendjob.
# Each pod of k8s/ascendjob.yaml runs it, from a copy of the project that
# the pod takes from the ConfigMap in k8s/project.yaml.
#
# The engine's variables mean other things than the launcher's (SLURM_PROCID is not a
# rank here): this script turns them into NODE_RANK, NODE_ADDR (HCCL_IF_IP), MASTER_ADDR,
# MASTER_PORT and HCCL_IF_BASE_PORT, checks them, and runs launch/run-node.sh, the launch
# script every node shares, which starts src/train_mine.py on every rank. Anything unexpected stops the node here, with the reason.
#
# A stop signal (Kubernetes sends the pod SIGTERM on a deletion or an eviction, and kills it
# after its termination grace period)
# has every rank save a checkpoint at its next logged step: the node then exits with code 75,
# "preempted, checkpoint saved" (launch/run-node.sh says so in one line), not a failure.
#
# Ports: each pod has a network namespace of its own: MASTER_PORT is the operator's, the
# HCCL ports start at 60000 as rendered.
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

# ---- MindCluster AscendJob -----------------------------------------------------------
# The ascend-operator sets RANK = this pod's node rank, WORLD_SIZE = NPUs in the whole job,
# LOCAL_WORLD_SIZE = NPUs in this pod, LOCAL_RANK = the list "0,1,...,n-1", and
# MASTER_ADDR/MASTER_PORT = the Master pod's service and its port named ascendjob-port.
for name in RANK WORLD_SIZE LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT; do
    [[ -n "${!name:-}" ]] || fail "$name is not set: run this in a pod of the AscendJob (kubectl apply --server-side -f k8s/)"
done
whole_number "$RANK" || fail "RANK='$RANK' is not a node rank (AscendJob sets this pod's node rank)"
whole_number "$WORLD_SIZE" || fail "WORLD_SIZE='$WORLD_SIZE' is not a device count"
if ! whole_number "$LOCAL_WORLD_SIZE" || ((LOCAL_WORLD_SIZE == 0)); then
    fail "LOCAL_WORLD_SIZE='$LOCAL_WORLD_SIZE' is not a device count"
fi
((WORLD_SIZE % LOCAL_WORLD_SIZE == 0)) ||
    fail "WORLD_SIZE=$WORLD_SIZE is not a multiple of LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE: pods with different device counts"
local_ranks="$(seq -s, 0 $((LOCAL_WORLD_SIZE - 1)))"
if [[ -n "${LOCAL_RANK:-}" && "$LOCAL_RANK" != "$local_ranks" ]]; then
    fail "LOCAL_RANK='$LOCAL_RANK': AscendJob lists this pod's devices ($local_ranks); the launcher numbers the ranks itself"
fi
node_rank="$RANK"
node_count=$((WORLD_SIZE / LOCAL_WORLD_SIZE))
pod_devices="$LOCAL_WORLD_SIZE"
if ((pod_devices != NPROC_PER_NODE)); then
    fail "this pod runs $pod_devices process(es) but the project was rendered for $NPROC_PER_NODE per node: render again with devices_per_node: $pod_devices"
fi
whole_number "$MASTER_PORT" || fail "MASTER_PORT='$MASTER_PORT' is not a port"
# Every launcher sets RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE for each process it
# starts: the operator's values (meaning other things) must not reach the ranks.
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
master="$MASTER_ADDR"
# Each pod has its own network namespace: the operator's port and the HCCL ports as rendered.
master_port="$MASTER_PORT"
hccl_base=60000
job="pod $(hostname)"

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
# A new Service's name can take a while to resolve: keep asking (NPU_WIZARD_RESOLVE_WAIT seconds).
master_ip=""
for _ in $(seq 1 "${NPU_WIZARD_RESOLVE_WAIT:-120}"); do
    master_ip="$(getent ahosts "$master" | awk 'NR == 1 { print $1 }')"
    [[ -z "$master_ip" ]] || break
    sleep 1
done
[[ -n "$master_ip" ]] || fail "cannot resolve the master node '$master' on $(hostname)"
# This node's address for HCCL: the one its route to the master leaves from.
if ! route="$(ip -o route get "$master_ip" 2>&1)"; then
    fail "no route from $(hostname) to the master $master_ip: $route"
fi
own_ip="$(sed -n 's/.* src \([^ ]*\).*/\1/p' <<<"$route")"
[[ -n "$own_ip" ]] || fail "cannot tell this node's address towards the master from: $route"
# AscendJob's MASTER_ADDR is the Master Service's cluster IP, which no pod owns: node 0
# listens at its own address, and the Service leads the other nodes there.
if ((node_rank == 0)); then
    master_ip="$own_ip"
fi
# The operator may start this container again in place after a failure (restartCount): the pod's
# workspace keeps the count of its starts, and a start after the first resumes (launch/run-node.sh).
# A pod made anew (another node) starts from 1 with an empty workspace. Counted after every check:
# a refused start writes nothing.
mkdir -p runs
pod_starts=0
if [[ -f runs/.pod-starts ]]; then
    read -r pod_starts <runs/.pod-starts || pod_starts=0
    whole_number "$pod_starts" || pod_starts=0
fi
pod_starts=$((10#$pod_starts + 1))
echo "$pod_starts" >runs/.pod-starts
export NPU_WIZARD_ATTEMPT="$pod_starts"
if ((pod_starts > 1)); then
    export NPU_WIZARD_RESUMING=1
fi

export NODE_RANK="$node_rank"
export MASTER_ADDR="$master_ip"
export MASTER_PORT="$master_port"
export NODE_ADDR="$own_ip"
export HCCL_IF_BASE_PORT="$hccl_base"
echo "entry: $job node $NODE_RANK of $node_count on $(hostname): master $MASTER_ADDR:$MASTER_PORT, HCCL_IF_IP $NODE_ADDR, HCCL ports from $HCCL_IF_BASE_PORT"
exec bash launch/run-node.sh "$@"
