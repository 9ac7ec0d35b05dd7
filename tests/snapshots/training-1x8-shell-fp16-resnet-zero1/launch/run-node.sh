#!/usr/bin/env bash
# t910-zero1: what every node runs. launch/nodeK.sh says which node this is and runs it.
#
# Hardware:  Atlas training series (Atlas 800 training server, Ascend 910)
# Topology:  1 node(s) x 8 device(s) = world size 8; node K runs ranks K x 8 to K x 8 + 7
# Launcher:  shell
# Master:    10.0.0.10:29500 (rank 0 listens there)
#
# The caller sets who this node is (launch/nodeK.sh does, or a scheduler's entry script):
#   NODE_RANK  this node's index, 0 to 0; node 0 hosts the master
#   NODE_ADDR  this node's host IP, exported as HCCL_IF_IP (the address HCCL uses)
# Everything else about the job is fixed below, from the answers.
#
# Arguments go to train.py (e.g. --epochs 1).
# Environment overrides: MASTER_PORT, NPU_WIZARD_RUN_DIR (default runs/latest),
# PYTHON (default python3; npu-wizard run passes the Python it runs in), CANN_SET_ENV,
# NPU_WIZARD_STOP_GRACE (seconds ranks get between TERM and KILL when one failed,
# default 5), NPU_WIZARD_SAVE_GRACE (seconds they get to save a checkpoint when SIGTERM
# or SIGUSR1 reaches this script, default 60), NPU_WIZARD_ATTEMPT (which start of the
# job this is, default 1) and NPU_WIZARD_RESUMING (1: this start resumes; default 0,
# 1 from attempt 2 on): every rank has both in its environment.
set -euo pipefail
HOW_TO_START="run launch/nodeK.sh"

if ! [[ "${NODE_RANK:-}" =~ ^(0|[1-9][0-9]*)$ ]] || ((NODE_RANK >= 1)); then
    echo "run-node.sh: NODE_RANK must be this node's index, 0 to 0 (got '${NODE_RANK:-}'); $HOW_TO_START instead" >&2
    exit 2
fi
if [[ -z "${NODE_ADDR:-}" ]]; then
    echo "run-node.sh: NODE_ADDR must be this node's host IP; $HOW_TO_START instead" >&2
    exit 2
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PROJECT_DIR="$(pwd)"
# The interpreter every rank runs; it is checked (and its folder put on PATH) below.
PYTHON="${PYTHON:-python3}"

# ---- who is who ---------------------------------------------------------------
export NODE_RANK
export NNODES=1
export NPROC_PER_NODE=8
export MASTER_ADDR=10.0.0.10
export MASTER_PORT="${MASTER_PORT:-29500}"
LAUNCHER=shell

# ---- HCCL ---------------------------------------------------------------------
# HCCL_IF_IP: the address HCCL uses on this node; without it HCCL picks a NIC by name.
export HCCL_IF_IP="$NODE_ADDR"
HCCL_NIC="$HCCL_IF_IP"
export HCCL_WHITELIST_DISABLE=1
# Host ports 60000-60031: reserve them with sysctl/reserve-ports.sh.
export HCCL_IF_BASE_PORT=60000
# (This series reads neither HCCL_HOST_SOCKET_PORT_RANGE nor HCCL_NPU_SOCKET_PORT_RANGE.)
export HCCL_CONNECT_TIMEOUT=120
export HCCL_EXEC_TIMEOUT=1836

# ---- attempt ------------------------------------------------------------------
# Which start of the job this is (NPU_WIZARD_ATTEMPT; npu-wizard run --restarts counts on)
# and whether it resumes (NPU_WIZARD_RESUMING=1: a start after the first, or npu-wizard
# run after a run that did not finish).
if ! [[ "${NPU_WIZARD_ATTEMPT:-1}" =~ ^[1-9][0-9]{0,5}$ ]]; then
    echo "run-node.sh: NPU_WIZARD_ATTEMPT='${NPU_WIZARD_ATTEMPT:-}' is not an attempt number (1, 2, ...): using 1" >&2
    NPU_WIZARD_ATTEMPT=1
fi
export NPU_WIZARD_ATTEMPT="${NPU_WIZARD_ATTEMPT:-1}"
if [[ "${NPU_WIZARD_RESUMING:-0}" == 1 ]] || ((NPU_WIZARD_ATTEMPT > 1)); then
    export NPU_WIZARD_RESUMING=1
else
    export NPU_WIZARD_RESUMING=0
fi
# What every rank runs (after python, or the launcher's flags).
program=(train.py --launcher shell)

# ---- performance: Huawei's settings (README.md says what each does) --------------
# Each keeps a value set in the environment, e.g. TASK_QUEUE_ENABLE=1 bash launch/node0.sh.
# Operator dispatch pipelined in two stages (level 2); on this series only with binary
# kernels, which train.py selects (jit_compile=False).
export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
# torch_npu binds each rank's threads to the CPU cores near its device (1: coarse;
# 2: fine-grained).
# Where a container's cgroup limits the cores, add force:1 after the mode: 1,force:1.
export CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-1}"
# A profile window (npu-wizard run --profile) has torch_npu parse its data in a child
# process (async_mode, the 7.0.0 branches on): the rank trains on meanwhile.
export NPU_WIZARD_PROFILE_ASYNC_PARSE="${NPU_WIZARD_PROFILE_ASYNC_PARSE:-1}"

# ---- run folder and this node's log ---------------------------------------------
export NPU_WIZARD_RUN_DIR="${NPU_WIZARD_RUN_DIR:-"$PROJECT_DIR/runs/latest"}"
mkdir -p "$NPU_WIZARD_RUN_DIR/logs"
NODE_LOG="$NPU_WIZARD_RUN_DIR/logs/node-$NODE_RANK.log"
# Everything below (and the ranks' early output) also goes to NODE_LOG. tee ignores
# INT/TERM so that it outlives Ctrl-C and records how the ranks were stopped.
exec > >(trap '' INT TERM; exec tee -a "$NODE_LOG") 2>&1

echo "node $NODE_RANK/$NNODES ($HCCL_NIC): $LAUNCHER, $NPROC_PER_NODE process(es), master $MASTER_ADDR:$MASTER_PORT"
echo "node $NODE_RANK: logs in $NPU_WIZARD_RUN_DIR/logs: this node's in node-$NODE_RANK.log, each rank's in rank-<R>.log"
if ((NPU_WIZARD_RESUMING)); then
    echo "node $NODE_RANK: attempt $NPU_WIZARD_ATTEMPT, resuming (NPU_WIZARD_RESUMING=1)"
fi

# ---- the Python and the launcher --------------------------------------------------
# npu-wizard run puts the interpreter's folder first on PATH (the torchrun beside it is the one
# started); here it comes last, so that a launch script started by hand finds that torchrun too.
if ! python_found="$(command -v "$PYTHON")"; then
    echo "node $NODE_RANK: no Python '$PYTHON' on $(hostname), so nothing started: set run.python in answers.yaml (or PYTHON) to the interpreter that has torch on every node, e.g. your virtual environment's bin/python"
    exit 1
fi
python_dir="$(dirname "$python_found")"
export PYTHON PATH="$PATH:$python_dir"
echo "node $NODE_RANK: HCCL host ports from HCCL_IF_BASE_PORT=$HCCL_IF_BASE_PORT (32 ports)"

# ---- HCCL flight recorder: each rank's newest collectives, for a hang -------------
# torch_npu keeps each rank's last TORCH_HCCL_TRACE_BUFFER_SIZE collectives (sequence
# number, sizes, dtypes, state; a few hundred bytes each) and npu-wizard reads them when
# the job hangs. With the monitor on, torch_npu also writes them to hccl/rank-<R> in the
# run folder when a collective times out, when a rank's watchdog has had no collective
# for TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC, or when something is written to
# hccl/rank-<R>.pipe; it does not stop the job for that.
# training.parallelism zero1: about three collectives per block and step
# (all_gather forward and backward, reduce_scatter), so a larger buffer than DDP's
hccl_trace_size="${TORCH_HCCL_TRACE_BUFFER_SIZE:-8000}"
if ! [[ "$hccl_trace_size" =~ ^[0-9]{1,6}$ ]] || (( 10#$hccl_trace_size > 100000 )); then
    echo "node $NODE_RANK: NOTE: TORCH_HCCL_TRACE_BUFFER_SIZE=$hccl_trace_size is not a whole number up to 100000: using 8000"
    hccl_trace_size=8000
fi
export TORCH_HCCL_TRACE_BUFFER_SIZE="$hccl_trace_size"
export TORCH_HCCL_ENABLE_MONITORING="${TORCH_HCCL_ENABLE_MONITORING:-1}"
export TORCH_HCCL_DUMP_ON_TIMEOUT="${TORCH_HCCL_DUMP_ON_TIMEOUT:-1}"
# With the dump on, a failing collective holds its rank TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC
# (torch_npu's default 600 s) before it exits; Ascend asks for it below HCCL_EXEC_TIMEOUT.
export TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC="${TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC:-600}"
mkdir -p "$NPU_WIZARD_RUN_DIR/hccl"
export TORCH_HCCL_DEBUG_INFO_TEMP_FILE="${TORCH_HCCL_DEBUG_INFO_TEMP_FILE:-$NPU_WIZARD_RUN_DIR/hccl/rank-}"
# torch_npu makes the pipe with mkfifo in its monitor thread, which does not survive a
# failure: it gets one only where this node can make a FIFO.
if [[ -z "${TORCH_HCCL_DEBUG_INFO_PIPE_FILE+set}" ]]; then
    fifo_probe="$NPU_WIZARD_RUN_DIR/hccl/.fifo-probe-$$"
    if mkfifo "$fifo_probe" 2>/dev/null; then
        rm -f "$fifo_probe"
        export TORCH_HCCL_DEBUG_INFO_PIPE_FILE="$NPU_WIZARD_RUN_DIR/hccl/rank-"
    else
        echo "node $NODE_RANK: NOTE: no FIFO can be made in $NPU_WIZARD_RUN_DIR/hccl: torch_npu's dump pipe is left off"
    fi
fi

# ---- CANN ---------------------------------------------------------------------
# set_env.sh: CANN_SET_ENV (or the answers' path) first, then where CANN installs:
# <root>/cann (8.5 and later), <root>/ascend-toolkit (before 8.5), <root>/nnae (runtime
# only), under the root /etc/Ascend/ascend_cann_install.info names, /usr/local/Ascend
# and $HOME/Ascend (a non-root install).
# (Unquoted on purpose: quotes inside "${VAR:-...}" would be kept as text.)
cann_answer=${CANN_SET_ENV:-/usr/local/Ascend/cann/set_env.sh}
DEVICE=${NPU_WIZARD_DEVICE:-npu}
cann_tried=("$cann_answer")
cann_roots=()
if [[ -r /etc/Ascend/ascend_cann_install.info ]]; then
    cann_root="$(sed -n 's/^Install_Path=//p' /etc/Ascend/ascend_cann_install.info | head -n 1)"
    [[ -z "$cann_root" ]] || cann_roots+=("${cann_root%/}")
fi
cann_roots+=(/usr/local/Ascend)
[[ -z "${HOME:-}" ]] || cann_roots+=("${HOME%/}/Ascend")
for cann_root in "${cann_roots[@]}"; do
    cann_tried+=("$cann_root/cann/set_env.sh" "$cann_root/ascend-toolkit/set_env.sh" "$cann_root/nnae/set_env.sh")
done
CANN_SET_ENV=""
for candidate in "${cann_tried[@]}"; do
    if [[ -f "$candidate" ]]; then
        CANN_SET_ENV="$candidate"
        break
    fi
done
if [[ -n "$CANN_SET_ENV" ]]; then
    # set_env.sh reads variables that may be unset.
    set +u
    # shellcheck source=/dev/null
    source "$CANN_SET_ENV"
    set -u
    echo "node $NODE_RANK: CANN environment from $CANN_SET_ENV"
elif [[ "$DEVICE" == "npu" ]]; then
    echo "node $NODE_RANK: no CANN set_env.sh found (tried ${cann_tried[*]}); the preflight fails unless CANN is already set up in this shell"
else
    echo "node $NODE_RANK: CANN skipped: no set_env.sh found (CPU simulation, device $DEVICE)"
    # torch_npu >= 2.5.1 loads itself on `import torch` and fails without CANN.
    export TORCH_DEVICE_BACKEND_AUTOLOAD="${TORCH_DEVICE_BACKEND_AUTOLOAD:-0}"
fi

# ---- preflight ------------------------------------------------------------------
# Fast checks before any rank starts (runtime/preflight.py): HCCL's address or NIC is
# on this host, the master port is free (node 0) or the master answers (other nodes),
# CANN (none found with device npu stops here) and the HCCL ports (device npu). A bad node stops here in seconds, with the
# reason, instead of hanging at init. NPU_WIZARD_SKIP_PREFLIGHT=1 skips them.
if [[ "${NPU_WIZARD_SKIP_PREFLIGHT:-0}" == 1 ]]; then
    echo "node $NODE_RANK: preflight skipped (NPU_WIZARD_SKIP_PREFLIGHT=1)"
else
    preflight=0
    preflight_args=(--device "$DEVICE" --cann-set-env "$CANN_SET_ENV" --hccl-port-count 32)
    for candidate in "${cann_tried[@]}"; do
        preflight_args+=(--cann-tried "$candidate")
    done
    "$PYTHON" -m runtime.preflight "${preflight_args[@]}" || preflight=$?
    if ((preflight == 3)); then
        echo "node $NODE_RANK: preflight failed: nothing started; fix the above (or skip the checks with NPU_WIZARD_SKIP_PREFLIGHT=1)"
        exit 1
    elif ((preflight != 0)); then
        echo "node $NODE_RANK: preflight could not run (exit code $preflight); starting anyway"
    fi
fi
# The ranks are this script's own children: a rank's exit code 75 says it saved.
LAUNCHER_BETWEEN=0

# ---- process bookkeeping --------------------------------------------------------
# PID -> what it is, for every process this script started and has not reaped.
declare -A CHILDREN=()
STOP_GRACE="${NPU_WIZARD_STOP_GRACE:-5}"
SAVE_GRACE="${NPU_WIZARD_SAVE_GRACE:-60}"
# (checked here: a word like 60s would end the signal traps below before they stop anything)
if ! [[ "$SAVE_GRACE" =~ ^[0-9]{1,6}$ ]]; then
    echo "node $NODE_RANK: NOTE: NPU_WIZARD_SAVE_GRACE=$SAVE_GRACE is not a whole number of seconds: using 60"
    SAVE_GRACE=60
fi
SAVE_GRACE=$((10#$SAVE_GRACE))
# When this attempt started (unix seconds): a rank's `preempted` event from before, which an
# earlier attempt wrote into the same run folder (Slurm's requeue), is not this attempt's.
STARTED_AT="$(date +%s)"
# A rank that saved a checkpoint on SIGTERM or SIGUSR1 exits with this (runtime/preemption.py),
# and so does this script once every rank of the node did: preempted, not failed.
PREEMPTED_EXIT=75

start_child() {
    # start_child LABEL COMMAND...: run COMMAND in the background and remember it.
    local label="$1"
    shift
    "$@" &
    CHILDREN[$!]="$label"
}

stop_children() {
    # stop_children [GRACE] [SIGNAL]: send every remaining child SIGNAL (default TERM; 0: none),
    # give them GRACE (default STOP_GRACE) seconds, then KILL the rest.
    local pid deadline grace="${1:-$STOP_GRACE}" sig="${2:-TERM}"
    ((${#CHILDREN[@]} > 0)) || return 0
    for pid in "${!CHILDREN[@]}"; do
        kill -"$sig" "$pid" 2>/dev/null || true
    done
    deadline=$((SECONDS + grace))
    while ((SECONDS < deadline)); do
        for pid in "${!CHILDREN[@]}"; do
            kill -0 "$pid" 2>/dev/null || unset "CHILDREN[$pid]"
        done
        ((${#CHILDREN[@]} > 0)) || break
        sleep 0.2
    done
    # (Checked first: bash before 4.4 calls an empty array unbound under set -u.)
    ((${#CHILDREN[@]} > 0)) || return 0
    for pid in "${!CHILDREN[@]}"; do
        echo "node $NODE_RANK: ${CHILDREN[$pid]} did not stop within ${grace}s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        # Reap it; a bare `wait` would also wait for the tee above.
        wait "$pid" 2>/dev/null || true
    done
    CHILDREN=()
}

preempted_ranks() {
    # Say so and return 0 when every rank of this node saved a checkpoint on a stop signal and exited.
    local said
    # from the project's folder: the ranks may have started elsewhere (the root of a repository)
    said="$(cd "$PROJECT_DIR" && "$PYTHON" -m runtime.preemption "$NPU_WIZARD_RUN_DIR" \
        $((NODE_RANK * NPROC_PER_NODE)) "$NPROC_PER_NODE" --since "$STARTED_AT" 2>/dev/null)" || return 1
    echo "node $NODE_RANK: $said; exiting with code $PREEMPTED_EXIT (preempted)"
}

# shellcheck disable=SC2329  # called from the traps below
on_signal() {
    # on_signal NAME EXIT_CODE [GRACE]: stop everything and leave with EXIT_CODE, or with
    # PREEMPTED_EXIT where every rank of the node saved a checkpoint first.
    trap - INT TERM USR1
    if (($# < 3)); then
        echo "node $NODE_RANK: got SIG$1; stopping ${#CHILDREN[@]} process(es)"
        stop_children
    elif [[ -n "${SLURM_STEP_ID:-}" ]]; then
        # Slurm signalled every process of the job step itself (scancel --signal=TERM): a second
        # TERM would cut torchrun's own stopping of its workers short
        echo "node $NODE_RANK: got SIG$1; the ranks save a checkpoint at their next logged step and exit (killed after ${3}s)"
        stop_children "$3" 0
    else
        echo "node $NODE_RANK: got SIG$1; asking ${#CHILDREN[@]} process(es) to save a checkpoint and stop (SIGTERM; killed after ${3}s)"
        stop_children "$3"
    fi
    preempted_ranks && exit "$PREEMPTED_EXIT"
    exit "$2"
}
trap 'on_signal INT 130' INT
# SIGTERM (Kubernetes, npu-wizard run, scancel) and SIGUSR1 (Slurm's --signal before the time
# limit): the ranks save at their next logged step, given SAVE_GRACE seconds.
trap 'on_signal TERM 143 "$SAVE_GRACE"' TERM
trap 'on_signal USR1 138 "$SAVE_GRACE"' USR1
trap stop_children EXIT

wait_children() {
    # Wait until all children exit 0 (return 0) or one fails: then stop the others and return its code.
    # A rank that saved on a stop signal (PREEMPTED_EXIT, or a launcher whose ranks all did) is no
    # failure: the others save at the same step; then PREEMPTED_EXIT is returned.
    local pid code preempted=0
    while ((${#CHILDREN[@]} > 0)); do
        wait -n 2>/dev/null || true
        for pid in "${!CHILDREN[@]}"; do
            kill -0 "$pid" 2>/dev/null && continue
            code=0
            wait "$pid" 2>/dev/null || code=$?
            if ((code == PREEMPTED_EXIT)) || { ((code != 0 && LAUNCHER_BETWEEN)) && preempted_ranks >/dev/null; }; then
                preempted=1
            elif ((code != 0)); then
                echo "node $NODE_RANK: ${CHILDREN[$pid]} failed with exit code $code; stopping the others"
                unset "CHILDREN[$pid]"
                stop_children
                echo "node $NODE_RANK: see $NPU_WIZARD_RUN_DIR/logs for each rank's log"
                return "$code"
            fi
            unset "CHILDREN[$pid]"
        done
    done
    if ((preempted)); then
        preempted_ranks || echo "node $NODE_RANK: a rank saved a checkpoint on a stop signal and exited"
        return "$PREEMPTED_EXIT"
    fi
}

# ---- launch -------------------------------------------------------------------
# One process per device: this loop plays the launcher's part.
export WORLD_SIZE=$((NNODES * NPROC_PER_NODE))
export LOCAL_WORLD_SIZE="$NPROC_PER_NODE"
for ((local_rank = 0; local_rank < NPROC_PER_NODE; local_rank++)); do
    export LOCAL_RANK="$local_rank"
    export RANK=$((NODE_RANK * NPROC_PER_NODE + LOCAL_RANK))
    start_child "rank $RANK (local rank $LOCAL_RANK)" "$PYTHON" "${program[@]}" "$@"
done
echo "node $NODE_RANK: started ranks $((NODE_RANK * NPROC_PER_NODE))-$((NODE_RANK * NPROC_PER_NODE + NPROC_PER_NODE - 1)) of $WORLD_SIZE"

status=0
wait_children || status=$?
if ((status == 0)); then
    echo "node $NODE_RANK: finished; logs in $NPU_WIZARD_RUN_DIR/logs"
fi
exit "$status"
