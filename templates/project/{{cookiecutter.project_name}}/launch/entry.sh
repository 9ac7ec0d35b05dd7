#!/usr/bin/env bash
# {{ cookiecutter.project_name|sh }}: the entry script every node runs under {{ cookiecutter.engine|sh }}.
{%- if cookiecutter.engine == "slurm" %}
# slurm/job.sbatch starts it once per node with srun.
{%- else %}
# Each pod of k8s/{{ cookiecutter.engine|sh }}.yaml runs it, from a copy of the project that
# the pod takes from the ConfigMap in k8s/project.yaml.
{%- endif %}
#
# The engine's variables mean other things than the launcher's (SLURM_PROCID is not a
# rank here): this script turns them into NODE_RANK, NODE_ADDR (HCCL_IF_IP), MASTER_ADDR,
# MASTER_PORT and HCCL_IF_BASE_PORT, checks them, and runs launch/run-node.sh, the launch
# script every node shares{% if cookiecutter.script %}, which starts {{ cookiecutter.script|sh }} on every rank{% endif %}. Anything unexpected stops the node here, with the reason.
#
{%- if cookiecutter.engine == "slurm" %}
# A stop signal (slurm/job.sbatch passes Slurm's SIGUSR1 on as SIGTERM, scancel sends SIGTERM)
{%- else %}
# A stop signal (Kubernetes sends the pod SIGTERM on a deletion or an eviction, and kills it
# after its termination grace period)
{%- endif %}
# has every rank save a checkpoint at its next logged step: the node then exits with code 75,
# "preempted, checkpoint saved" (launch/run-node.sh says so in one line), not a failure.
#
{%- if cookiecutter.engine == "slurm" %}
# Ports: jobs may share a node, so each job takes its own from its job id:
#   MASTER_PORT       = {{ cookiecutter.master_port|int }} + job id % {{ (cookiecutter|port_plan).masters|int }}
#   HCCL_IF_BASE_PORT = {{ cookiecutter.hccl_base_port|int }} + slot x {{ cookiecutter.hccl_port_count|int }}, slot = job id % {{ (cookiecutter|port_plan).slots|int }}
# Jobs fewer than {{ (cookiecutter|port_plan).slots|int }} ids apart never share a port; two jobs {{ (cookiecutter|port_plan).slots|int }} (or {{ (cookiecutter|port_plan).masters|int }}) ids apart
# on one node would.
{%- if cookiecutter.nodes|int == 1 %} This job has one node, so it moves on to the next free slot
# (or master port) there.
{%- endif %} Where a port is still taken, the preflight (runtime/preflight.py)
# stops the node before any rank starts, naming the port and the slot that another job holds.
{%- else %}
# Ports: each pod has a network namespace of its own: MASTER_PORT is the operator's, the
# HCCL ports start at {{ cookiecutter.hccl_base_port|int }} as rendered.
{%- endif %}
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

fail() {
    echo "launch/entry.sh: $*" >&2
    exit 2
}

whole_number() {
    [[ "$1" =~ ^[0-9]+$ ]]
}

EXPECTED_NODES={{ cookiecutter.nodes|int }}
NPROC_PER_NODE={{ cookiecutter.devices_per_node|int }}
{%- if cookiecutter.engine == "slurm" %}

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
master_offset=$((job_id % {{ (cookiecutter|port_plan).masters|int }}))
hccl_slot=$((job_id % {{ (cookiecutter|port_plan).slots|int }}))
{%- if cookiecutter.nodes|int == 1 %}
# A one-node job has no other node to agree with: past a master port or an HCCL slot that
# another job on this node holds, it takes the next free one (runtime/ports.py).
if free="$("${PYTHON:-python3}" -m runtime.ports "$master_offset" {{ (cookiecutter|port_plan).masters|int }} {{ cookiecutter.master_port|int }} 1 2>/dev/null)" && whole_number "$free"; then
    if ((free != master_offset)); then
        echo "entry: master port $(({{ cookiecutter.master_port|int }} + master_offset)) is taken on $(hostname) (another job?): job $job_id takes $(({{ cookiecutter.master_port|int }} + free)) instead"
    fi
    master_offset="$free"
fi
if free="$("${PYTHON:-python3}" -m runtime.ports "$hccl_slot" {{ (cookiecutter|port_plan).slots|int }} {{ cookiecutter.hccl_base_port|int }} {{ cookiecutter.hccl_port_count|int }} 2>/dev/null)" && whole_number "$free"; then
    if ((free != hccl_slot)); then
        echo "entry: HCCL slot $hccl_slot is taken on $(hostname) (another job?): job $job_id takes slot $free instead"
    fi
    hccl_slot="$free"
fi
{%- endif %}
master_port=$(({{ cookiecutter.master_port|int }} + master_offset))
hccl_base=$(({{ cookiecutter.hccl_base_port|int }} + hccl_slot * {{ cookiecutter.hccl_port_count|int }}))
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
{%- elif cookiecutter.engine == "ascendjob" %}

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
{%- elif cookiecutter.engine == "pytorchjob" %}

# ---- Kubeflow PyTorchJob -------------------------------------------------------------
# The training operator sets PET_NNODES (pods), PET_NODE_RANK (this pod's index),
# PET_NPROC_PER_NODE (nprocPerNode), MASTER_ADDR/MASTER_PORT (the Master pod's service);
# RANK is the pod index and WORLD_SIZE pods x nprocPerNode: not torchrun's meanings.
for name in PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE MASTER_ADDR MASTER_PORT; do
    [[ -n "${!name:-}" ]] || fail "$name is not set: run this in a pod of the PyTorchJob (kubectl apply --server-side -f k8s/)"
done
whole_number "$PET_NNODES" ||
    fail "PET_NNODES='$PET_NNODES' is not a node count (an elastic range min:max is not supported: drop elasticPolicy)"
whole_number "$PET_NODE_RANK" || fail "PET_NODE_RANK='$PET_NODE_RANK' is not a node rank"
whole_number "$PET_NPROC_PER_NODE" ||
    fail "PET_NPROC_PER_NODE='$PET_NPROC_PER_NODE' is not a process count (set nprocPerNode to a number, not auto)"
if [[ -n "${LOCAL_RANK:-}" ]] && ! whole_number "$LOCAL_RANK"; then
    fail "LOCAL_RANK='$LOCAL_RANK' is not an integer; the launcher wants one per process and sets it itself"
fi
node_rank="$PET_NODE_RANK"
node_count="$PET_NNODES"
pod_devices="$PET_NPROC_PER_NODE"
# torchrun takes PET_* as defaults for its flags: launch/run-node.sh passes every one it needs.
unset PET_NNODES PET_NODE_RANK PET_NPROC_PER_NODE PET_MASTER_ADDR PET_MASTER_PORT
{%- endif %}
{%- if cookiecutter.engine in ["ascendjob", "pytorchjob"] %}
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
hccl_base={{ cookiecutter.hccl_base_port|int }}
job="pod $(hostname)"
{%- endif %}

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
{%- if cookiecutter.engine in ["ascendjob", "pytorchjob"] %}
# A new Service's name can take a while to resolve: keep asking (NPU_WIZARD_RESOLVE_WAIT seconds).
master_ip=""
for _ in $(seq 1 "${NPU_WIZARD_RESOLVE_WAIT:-120}"); do
    master_ip="$(getent ahosts "$master" | awk 'NR == 1 { print $1 }')"
    [[ -z "$master_ip" ]] || break
    sleep 1
done
{%- else %}
master_ip="$(getent ahosts "$master" | awk 'NR == 1 { print $1 }')"
{%- endif %}
[[ -n "$master_ip" ]] || fail "cannot resolve the master node '$master' on $(hostname)"
# This node's address for HCCL: the one its route to the master leaves from.
if ! route="$(ip -o route get "$master_ip" 2>&1)"; then
    fail "no route from $(hostname) to the master $master_ip: $route"
fi
own_ip="$(sed -n 's/.* src \([^ ]*\).*/\1/p' <<<"$route")"
[[ -n "$own_ip" ]] || fail "cannot tell this node's address towards the master from: $route"
{%- if cookiecutter.engine == "ascendjob" %}
# AscendJob's MASTER_ADDR is the Master Service's cluster IP, which no pod owns: node 0
# listens at its own address, and the Service leads the other nodes there.
if ((node_rank == 0)); then
    master_ip="$own_ip"
fi
{%- endif %}
{%- if cookiecutter.engine in ["ascendjob", "pytorchjob"] %}
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
{%- endif %}

export NODE_RANK="$node_rank"
export MASTER_ADDR="$master_ip"
export MASTER_PORT="$master_port"
export NODE_ADDR="$own_ip"
export HCCL_IF_BASE_PORT="$hccl_base"
echo "entry: $job node $NODE_RANK of $node_count on $(hostname): master $MASTER_ADDR:$MASTER_PORT, HCCL_IF_IP $NODE_ADDR, HCCL ports from $HCCL_IF_BASE_PORT"
exec bash launch/run-node.sh "$@"
