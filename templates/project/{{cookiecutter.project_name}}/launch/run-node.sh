#!/usr/bin/env bash
{%- set foreign = cookiecutter.script != "" %}
{#- The project's folder inside the user's repository (--into REPO --folder NAME): "" for a project of its own. #}
{%- set repository_folder = cookiecutter.get("repository_folder", "") if foreign else "" %}
{%- if repository_folder %}
{#- Started from its file, the runtime is the package npu_wizard_runtime: the repository's own `runtime` stays theirs. #}
{%- set words = [repository_folder ~ "/runtime/start_userscript.py", cookiecutter.script] + cookiecutter.script_args|shell_words %}
{%- elif foreign %}
{#- The user's own script runs under runtime/userscript.py, which records the rank as train.py does. #}
{%- set words = ["-m", "runtime.userscript", cookiecutter.script] + cookiecutter.script_args|shell_words %}
{%- else %}
{%- set words = ["train.py", "--launcher", cookiecutter.launcher] %}
{%- endif %}
{%- if cookiecutter.engine in ["slurm", "ascendjob", "pytorchjob"] %}
# {{ cookiecutter.project_name|sh }}: what every node runs. launch/entry.sh finds which node this is and runs it.
{%- else %}
# {{ cookiecutter.project_name|sh }}: what every node runs. launch/nodeK.sh says which node this is and runs it.
{%- endif %}
#
{%- if cookiecutter.hardware == "atlas-training" %}
# Hardware:  Atlas training series (Atlas 800 training server, Ascend 910)
{%- elif cookiecutter.hardware == "atlas-a2" %}
# Hardware:  Atlas A2 training series (Atlas 800T A2, Ascend 910B)
{%- else %}
# Hardware:  Atlas A3 training series (Atlas 800T A3, Ascend 910_93)
{%- endif %}
# Topology:  {{ cookiecutter.nodes|int }} node(s) x {{ cookiecutter.devices_per_node|int }} device(s) = world size {{ cookiecutter.nodes|int * cookiecutter.devices_per_node|int }}; node K runs ranks K x {{ cookiecutter.devices_per_node|int }} to K x {{ cookiecutter.devices_per_node|int }} + {{ cookiecutter.devices_per_node|int - 1 }}
# Launcher:  {{ cookiecutter.launcher|sh }}
{%- if cookiecutter.master_addr %}
# Master:    {{ cookiecutter.master_addr|sh }}:{{ cookiecutter.master_port|int }} (rank 0 listens there)
{%- else %}
# Master:    the job's first node; MASTER_ADDR, MASTER_PORT and HCCL_IF_BASE_PORT come from launch/entry.sh
{%- endif %}
#
# The caller sets who this node is (launch/nodeK.sh does, or a scheduler's entry script):
#   NODE_RANK  this node's index, 0 to {{ cookiecutter.nodes|int - 1 }}; node 0 hosts the master
#   NODE_ADDR  this node's host IP, exported as HCCL_IF_IP (the address HCCL uses){% if cookiecutter.nic %}; unused
#              here: HCCL_SOCKET_IFNAME names the NIC instead{% endif %}
# Everything else about the job is fixed below, from the answers.
#
{%- if repository_folder %}
# This project is the folder {{ repository_folder|sh }} of your repository. Your script {{ cookiecutter.script|sh }}
# (a path from the repository's root) runs on every rank from that root, as torchrun started
# there would run it, through runtime/start_userscript.py (which records the rank's start, log
# and end for npu-wizard run; your report hook: from npu_wizard_runtime import report).
# Arguments go to the script, after those of the answers (training.script_args).
{%- elif foreign %}
# Your script {{ cookiecutter.script|sh }} runs on every rank through runtime/userscript.py
# (which records the rank's start, log and end for npu-wizard run). Arguments go to the
# script, after those of the answers (training.script_args).
{%- else %}
# Arguments go to train.py (e.g. --epochs 1).
{%- endif %}
# Environment overrides: MASTER_PORT, NPU_WIZARD_RUN_DIR (default runs/latest),
{%- if cookiecutter.python %}
# PYTHON (default run.python, {{ cookiecutter.python|sh }}; npu-wizard run passes it), CANN_SET_ENV,
{%- else %}
# PYTHON (default python3; npu-wizard run passes the Python it runs in), CANN_SET_ENV,
{%- endif %}
# NPU_WIZARD_STOP_GRACE (seconds ranks get between TERM and KILL when one failed,
# default 5), NPU_WIZARD_SAVE_GRACE (seconds they get to save a checkpoint when SIGTERM
# or SIGUSR1 reaches this script, default 60), NPU_WIZARD_ATTEMPT (which start of the
# job this is, default 1) and NPU_WIZARD_RESUMING (1: this start resumes; default 0,
# 1 from attempt 2 on): every rank has both in its environment.
{%- if cookiecutter.launcher in ["torchrun", "torch-npu-run"] %}
# NPU_WIZARD_MAX_RESTARTS: how often the launcher restarts failed workers (default 0).
{%- endif %}
set -euo pipefail
{%- if cookiecutter.master_addr %}
HOW_TO_START="run launch/nodeK.sh"
{%- else %}
HOW_TO_START="start launch/entry.sh"
{%- endif %}

if ! [[ "${NODE_RANK:-}" =~ ^(0|[1-9][0-9]*)$ ]] || ((NODE_RANK >= {{ cookiecutter.nodes|int }})); then
    echo "run-node.sh: NODE_RANK must be this node's index, 0 to {{ cookiecutter.nodes|int - 1 }} (got '${NODE_RANK:-}'); $HOW_TO_START instead" >&2
    exit 2
fi
if [[ -z "${NODE_ADDR:-}" ]]; then
    echo "run-node.sh: NODE_ADDR must be this node's host IP; $HOW_TO_START instead" >&2
    exit 2
fi

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PROJECT_DIR="$(pwd)"
# The interpreter every rank runs; it is checked (and its folder put on PATH) below.
{%- if cookiecutter.python %}
# (Unquoted on purpose: quotes inside "${VAR:-...}" would be kept as text.)
PYTHON=${PYTHON:-{{ cookiecutter.python|sh }}}
{%- else %}
PYTHON="${PYTHON:-python3}"
{%- endif %}
{%- if repository_folder %}
# The repository's root, where the ranks start (npu-wizard's own steps run here, in the
# project's folder). Nothing is added to PYTHONPATH: your imports resolve as under plain torchrun.
REPOSITORY_DIR="$(cd {{ ([".."] * (repository_folder.split("/")|length))|join("/")|sh }} && pwd)"
{%- elif foreign %}
# The project first on the path: `from runtime import report` works in your script and
# in every process it starts.
export PYTHONPATH="$PROJECT_DIR${PYTHONPATH:+:$PYTHONPATH}"
{%- endif %}

# ---- who is who ---------------------------------------------------------------
export NODE_RANK
export NNODES={{ cookiecutter.nodes|int }}
export NPROC_PER_NODE={{ cookiecutter.devices_per_node|int }}
{%- if cookiecutter.master_addr %}
export MASTER_ADDR={{ cookiecutter.master_addr|sh }}
export MASTER_PORT="${MASTER_PORT:-{{ cookiecutter.master_port|int }}}"
{%- else %}
# The nodes are chosen when the job starts: launch/entry.sh found the master and the job's ports.
: "${MASTER_ADDR:?is not set: start this script through launch/entry.sh}"
: "${MASTER_PORT:?is not set: start this script through launch/entry.sh}"
export MASTER_ADDR MASTER_PORT
{%- endif %}
LAUNCHER={{ cookiecutter.launcher|sh }}

# ---- HCCL ---------------------------------------------------------------------
{%- if cookiecutter.nic %}
# HCCL_SOCKET_IFNAME: HCCL's NIC on this node, by name. HCCL_IF_IP is left unset on
# purpose: HCCL would take it over the name (CANN envref_07_0073/0075).
export HCCL_SOCKET_IFNAME={{ cookiecutter.nic|sh }}
unset HCCL_IF_IP
HCCL_NIC="NIC $HCCL_SOCKET_IFNAME"
{%- else %}
# HCCL_IF_IP: the address HCCL uses on this node; without it HCCL picks a NIC by name.
export HCCL_IF_IP="$NODE_ADDR"
HCCL_NIC="$HCCL_IF_IP"
{%- endif %}
export HCCL_WHITELIST_DISABLE=1
{%- if cookiecutter.master_addr %}
# Host ports {{ cookiecutter.hccl_base_port|int }}-{{ cookiecutter.hccl_base_port|int + cookiecutter.hccl_port_count|int - 1 }}: reserve them with sysctl/reserve-ports.sh.
export HCCL_IF_BASE_PORT={{ cookiecutter.hccl_base_port|int }}
{%- else %}
# This job's slot of the HCCL host ports, from launch/entry.sh.
: "${HCCL_IF_BASE_PORT:?is not set: start this script through launch/entry.sh}"
export HCCL_IF_BASE_PORT
{%- endif %}
{%- if cookiecutter.hardware == "atlas-training" %}
# (This series reads neither HCCL_HOST_SOCKET_PORT_RANGE nor HCCL_NPU_SOCKET_PORT_RANGE.)
{%- else %}
# HCCL_HOST_SOCKET_PORT_RANGE, where this node's environment sets it, overrides
# HCCL_IF_BASE_PORT (A2/A3), and HCCL_NPU_SOCKET_PORT_RANGE moves the device port 16666:
# they are kept, and the lines below and the preflight follow them.
{%- endif %}
export HCCL_CONNECT_TIMEOUT={{ cookiecutter.connect_timeout|int }}
export HCCL_EXEC_TIMEOUT={{ cookiecutter.exec_timeout|int }}

# ---- attempt ------------------------------------------------------------------
# Which start of the job this is (NPU_WIZARD_ATTEMPT; npu-wizard run --restarts counts on)
# and whether it resumes (NPU_WIZARD_RESUMING=1: a start after the first, or npu-wizard
# run after a run that did not finish).
{%- if cookiecutter.engine == "slurm" %}
# A requeued job counts on too (launch/entry.sh).
{%- elif cookiecutter.engine in ["ascendjob", "pytorchjob"] %}
# A container the operator starts again counts on too (launch/entry.sh).
{%- endif %}
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
{%- if cookiecutter.launcher != "mp-spawn" %}
# What every rank runs (after python, or the launcher's flags).
program=({% for word in words %}{{ word|sh }}{% if not loop.last %} {% endif %}{% endfor %})
{%- endif %}
{%- if foreign and cookiecutter.resume_args %}
resume_args=()
if ((NPU_WIZARD_RESUMING)); then
    # training.resume_args: this start resumes (they go last, after `npu-wizard run -- ARGS`)
    resume_args=({% for word in cookiecutter.resume_args|shell_words %}{{ word|sh }}{% if not loop.last %} {% endif %}{% endfor %})
{%- if cookiecutter.launcher in ["torchrun", "torch-npu-run"] %}
else
    # the launcher's own restarts (--max-restarts) start the ranks again with this command
    # line: the runtime adds training.resume_args then (runtime/userscript.py)
    export NPU_WIZARD_RESUME_ARGS={{ cookiecutter.resume_args|sh }}
{%- endif %}
fi
{%- endif %}
{%- if foreign %}
if [[ "${1:-}" == --smoke ]]; then
    # --smoke never runs your script: npu-wizard's own smoke test, same launcher and environment
    program=(-m runtime.smoke --launcher {{ cookiecutter.launcher|sh }} --device {{ cookiecutter.device|sh }})
fi
# gloo (the CPU backend) takes its address from the host name, which need not be this
# node's host IP: it uses HCCL's NIC, as the generated train.py sets it.
if [[ -z "${GLOO_SOCKET_IFNAME:-}" ]]; then
    gloo_nic="$("$PYTHON" -m runtime.nic 2>/dev/null)" || gloo_nic=""
    [[ -z "$gloo_nic" ]] || export GLOO_SOCKET_IFNAME="$gloo_nic"
fi
{%- endif %}

# ---- performance: Huawei's settings (README.md says what each does) --------------
{%- set task_queue = cookiecutter.torch_npu_version|torch_npu_has("task_queue_2") %}
{%- set server_devices = 16 if cookiecutter.hardware == "atlas-a3" else 8 %}
{%- set cpu_affinity = cookiecutter.torch_npu_version|torch_npu_has("cpu_affinity_conf") %}
{%- if cookiecutter.device == "cpu" %}
# Left out: this project simulates on the CPU, where torch_npu reads none of them.
{%- else %}
# Each keeps a value set in the environment, e.g. TASK_QUEUE_ENABLE=1 bash launch/node0.sh.
{%- if task_queue %}
{%- if cookiecutter.hardware == "atlas-training" %}
# Operator dispatch pipelined in two stages (level 2); on this series only with binary
{%- if foreign %}
# kernels: your script selects them with torch_npu.npu.set_compile_mode(jit_compile=False).
{%- else %}
# kernels, which train.py selects (jit_compile=False).
{%- endif %}
{%- else %}
# Operator dispatch pipelined in two stages (level 2); peak memory may rise a little.
{%- endif %}
export TASK_QUEUE_ENABLE="${TASK_QUEUE_ENABLE:-2}"
{%- else %}
# TASK_QUEUE_ENABLE=2 needs torch_npu 2.1.0.post8 / 2.3.1.post2 / 2.4.0 or later; this
# torch_npu ({{ cookiecutter.torch_npu_version|sh }}) keeps its own default.
{%- endif %}
{%- if cpu_affinity %}
# torch_npu binds each rank's threads to the CPU cores near its device (1: coarse;
# 2: fine-grained).
{%- if cookiecutter.torch_npu_version|torch_npu_has("cpu_affinity_force") %}
# Where a container's cgroup limits the cores, add force:1 after the mode: 1,force:1.
{%- else %}
# force:1 (written after the mode: 1,force:1) is read only by the torch_npu of CANN
# 9.1.0 (2.7.1.post8, 2.9.0.post6, 2.10.0.post4, 2.11.0 and later), not by this one.
if [[ "${CPU_AFFINITY_CONF:-}" == *force* ]]; then
    echo "node $NODE_RANK: NOTE: torch_npu {{ cookiecutter.torch_npu_version|sh }} does not read the force option of CPU_AFFINITY_CONF=$CPU_AFFINITY_CONF (the torch_npu of CANN 9.1.0 does)"
fi
{%- endif %}
export CPU_AFFINITY_CONF="${CPU_AFFINITY_CONF:-1}"
{%- elif cookiecutter.launcher == "shell" %}
# torch_npu {{ cookiecutter.torch_npu_version|sh }} predates CPU_AFFINITY_CONF (2.1.0.post10 / 2.3.1.post4 /
# 2.4.0.post2): the rank loop below pins each rank to its share of the cores with taskset
# (NPU_WIZARD_TASKSET=0 turns that off).
{%- else %}
# torch_npu {{ cookiecutter.torch_npu_version|sh }} predates CPU_AFFINITY_CONF (2.1.0.post10 / 2.3.1.post4 /
# 2.4.0.post2): no core binding here (the shell-loop launcher pins ranks with taskset).
{%- endif %}
{%- if cookiecutter.torch_npu_version|torch_npu_has("profiler_async_parse") %}
# A profile window (npu-wizard run --profile) has torch_npu parse its data in a child
# process (async_mode, the 7.0.0 branches on): the rank trains on meanwhile.
export NPU_WIZARD_PROFILE_ASYNC_PARSE="${NPU_WIZARD_PROFILE_ASYNC_PARSE:-1}"
{%- else %}
# A profile window (npu-wizard run --profile): torch_npu {{ cookiecutter.torch_npu_version|sh }} parses its data
# in the rank, which waits meanwhile (async parsing came with 2.1.0.post12 / 2.3.1.post6 / 2.4.0.post4 / 2.5.1).
{%- endif %}
{%- endif %}

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
    echo "node $NODE_RANK: attempt $NPU_WIZARD_ATTEMPT, resuming (NPU_WIZARD_RESUMING=1){% if foreign and cookiecutter.resume_args %}: training.resume_args added{% endif %}"
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
{%- if cookiecutter.launcher in ["torchrun", "torch-npu-run"] %}
if ! command -v torchrun >/dev/null 2>&1{% if cookiecutter.launcher == "torch-npu-run" %} && ! command -v torch_npu_run >/dev/null 2>&1{% endif %}; then
    echo "node $NODE_RANK: torchrun is neither beside $python_found nor on PATH on $(hostname), so nothing started: install torch into that Python ($PYTHON -m pip install torch), or set run.python in answers.yaml (or PYTHON) to the interpreter that has it"
    exit 1
fi
{%- endif %}
{%- if cookiecutter.device != "cpu" %}
{%- if cookiecutter.hardware == "atlas-training" %}
echo "node $NODE_RANK: HCCL host ports from HCCL_IF_BASE_PORT=$HCCL_IF_BASE_PORT ({{ cookiecutter.hccl_port_count|int }} ports)"
{%- else %}
if [[ -n "${HCCL_HOST_SOCKET_PORT_RANGE:-}" ]]; then
    echo "node $NODE_RANK: HCCL host ports from HCCL_HOST_SOCKET_PORT_RANGE=$HCCL_HOST_SOCKET_PORT_RANGE, which overrides HCCL_IF_BASE_PORT=$HCCL_IF_BASE_PORT (reserve those: sysctl/reserve-ports.sh follows it)"
else
    echo "node $NODE_RANK: HCCL host ports from HCCL_IF_BASE_PORT=$HCCL_IF_BASE_PORT ({{ cookiecutter.hccl_port_count|int }} ports)"
fi
if [[ -n "${HCCL_NPU_SOCKET_PORT_RANGE:-}" ]]; then
    echo "node $NODE_RANK: HCCL device port(s) from HCCL_NPU_SOCKET_PORT_RANGE=$HCCL_NPU_SOCKET_PORT_RANGE, not 16666: every node must set the same"
fi
{%- endif %}
{%- endif %}
{%- if cookiecutter.device != "cpu" %}

# ---- HCCL flight recorder: each rank's newest collectives, for a hang -------------
{%- if cookiecutter.torch_npu_version|torch_npu_has("hccl_flight_recorder") %}
# torch_npu keeps each rank's last TORCH_HCCL_TRACE_BUFFER_SIZE collectives (sequence
# number, sizes, dtypes, state; a few hundred bytes each) and npu-wizard reads them when
# the job hangs. With the monitor on, torch_npu also writes them to hccl/rank-<R> in the
# run folder when a collective times out, when a rank's watchdog has had no collective
# for TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC, or when something is written to
# hccl/rank-<R>.pipe; it does not stop the job for that.
{%- set trace_entries = 2000 if cookiecutter.parallelism == "ddp" or foreign else 8000 %}
{%- if trace_entries > 2000 %}
# training.parallelism {{ cookiecutter.parallelism|sh }}: about three collectives per block and step
# (all_gather forward and backward, reduce_scatter), so a larger buffer than DDP's
{%- endif %}
hccl_trace_size="${TORCH_HCCL_TRACE_BUFFER_SIZE:-{{ trace_entries|int }}}"
if ! [[ "$hccl_trace_size" =~ ^[0-9]{1,6}$ ]] || (( 10#$hccl_trace_size > 100000 )); then
    echo "node $NODE_RANK: NOTE: TORCH_HCCL_TRACE_BUFFER_SIZE=$hccl_trace_size is not a whole number up to 100000: using {{ trace_entries|int }}"
    hccl_trace_size={{ trace_entries|int }}
fi
export TORCH_HCCL_TRACE_BUFFER_SIZE="$hccl_trace_size"
export TORCH_HCCL_ENABLE_MONITORING="${TORCH_HCCL_ENABLE_MONITORING:-1}"
export TORCH_HCCL_DUMP_ON_TIMEOUT="${TORCH_HCCL_DUMP_ON_TIMEOUT:-1}"
{%- set exec_s = cookiecutter.exec_timeout|int %}
{%- if cookiecutter.hardware == "atlas-training" %}
{%- set exec_s = [68, exec_s // 68 * 68]|max %}
{%- endif %}
# With the dump on, a failing collective holds its rank TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC
# (torch_npu's default 600 s) before it exits; Ascend asks for it below HCCL_EXEC_TIMEOUT.
export TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC="${TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC:-{{ (600 if exec_s == 0 or exec_s > 666 else [1, exec_s - exec_s // 10]|max)|int }}}"
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
{%- else %}
# torch_npu {{ cookiecutter.torch_npu_version|sh }} has no HCCL flight recorder (2.1.0.post12 / 2.5.1.post1 /
# 2.6.0 and later have it): a hang shows each rank's stack, not its collectives.
{%- endif %}
{%- endif %}

# ---- CANN ---------------------------------------------------------------------
# set_env.sh: CANN_SET_ENV (or the answers' path) first, then where CANN installs:
# <root>/cann (8.5 and later), <root>/ascend-toolkit (before 8.5), <root>/nnae (runtime
# only), under the root /etc/Ascend/ascend_cann_install.info names, /usr/local/Ascend
# and $HOME/Ascend (a non-root install).
# (Unquoted on purpose: quotes inside "${VAR:-...}" would be kept as text.)
cann_answer=${CANN_SET_ENV:-{{ cookiecutter.cann_set_env|sh }}}
DEVICE=${NPU_WIZARD_DEVICE:-{{ cookiecutter.device|sh }}}
{%- if foreign %}
# npu or cpu, for your script's backend (hccl or gloo): see README.md, "Your script"
export NPU_WIZARD_DEVICE="$DEVICE"
{%- endif %}
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
    preflight_args=(--device "$DEVICE" --cann-set-env "$CANN_SET_ENV" --hccl-port-count {{ cookiecutter.hccl_port_count|int }})
{%- if cookiecutter.hardware != "atlas-training" %}
    preflight_args+=(--hccl-reads-port-range)
{%- endif %}
    for candidate in "${cann_tried[@]}"; do
        preflight_args+=(--cann-tried "$candidate")
    done
{%- if foreign %}
    # and no file of the project hides a standard-library module (random.py, logging/)
{%- if repository_folder %}
    preflight_args+=(--user-script "$REPOSITORY_DIR"/{{ cookiecutter.script|sh }})
{%- else %}
    preflight_args+=(--user-script {{ cookiecutter.script|sh }})
{%- endif %}
{%- endif %}
    "$PYTHON" -m runtime.preflight "${preflight_args[@]}" || preflight=$?
    if ((preflight == 3)); then
        echo "node $NODE_RANK: preflight failed: nothing started; fix the above (or skip the checks with NPU_WIZARD_SKIP_PREFLIGHT=1)"
        exit 1
    elif ((preflight != 0)); then
        echo "node $NODE_RANK: preflight could not run (exit code $preflight); starting anyway"
    fi
fi
{%- if cookiecutter.launcher == "shell" %}
# The ranks are this script's own children: a rank's exit code 75 says it saved.
LAUNCHER_BETWEEN=0
{%- else %}
# A launcher stands between this script and the ranks: its exit code does not say whether
# they saved on a stop signal; their events do.
LAUNCHER_BETWEEN=1
{%- endif %}
{# ${#...} would open a Jinja comment: keep this shell part raw. #}
{%- raw %}
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
{%- endraw %}

# ---- launch -------------------------------------------------------------------
{%- if foreign and cookiecutter.resume_args %}
# training.resume_args after your script's arguments and those of `npu-wizard run -- ARGS`, in the
# order a launcher's own restart gives them (runtime/userscript.py); never to the smoke test
{% raw %}[[ "${1:-}" == --smoke ]] || ((${#resume_args[@]} == 0)) || set -- "$@" "${resume_args[@]}"{% endraw %}
{%- endif %}
{%- if repository_folder %}
# Your script's ranks start from the repository's root (npu-wizard's smoke test from here).
[[ "${1:-}" == --smoke ]] || cd "$REPOSITORY_DIR"
{%- endif %}
{%- if cookiecutter.launcher == "shell" %}
# One process per device: this loop plays the launcher's part.
export WORLD_SIZE=$((NNODES * NPROC_PER_NODE))
export LOCAL_WORLD_SIZE="$NPROC_PER_NODE"
{%- if cookiecutter.device != "cpu" and not cpu_affinity %}
# Each rank on the cores of the device it uses, as ModelZoo's train_full_8p.sh does: the
# server's cores split into {{ server_devices|int }} equal shares, device d taking share d. A rank's device
# is its entry of ASCEND_RT_VISIBLE_DEVICES (4,5,6,7: local rank 0 uses device 4), else its
# local rank.
pin=0
cpu_count="$(nproc)"
cores_per_device=$((cpu_count / {{ server_devices|int }}))
rank_devices=()
for ((local_rank = 0; local_rank < NPROC_PER_NODE; local_rank++)); do
    rank_devices+=("$local_rank")
done
if [[ -n "${ASCEND_RT_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -ra rank_devices <<<"${ASCEND_RT_VISIBLE_DEVICES// /}"
fi
if [[ "${NPU_WIZARD_TASKSET:-1}" == 1 ]] && ((cores_per_device > 0)) && command -v taskset >/dev/null 2>&1; then
    pin=1
    for ((local_rank = 0; local_rank < NPROC_PER_NODE; local_rank++)); do
        device="${rank_devices[local_rank]:-}"
        if ! [[ "$device" =~ ^[0-9]{1,9}$ ]] || ((10#$device >= {{ server_devices|int }})); then
            echo "node $NODE_RANK: NOTE: no taskset: ASCEND_RT_VISIBLE_DEVICES='${ASCEND_RT_VISIBLE_DEVICES:-}' names no device 0-{{ (server_devices - 1)|int }} for local rank $local_rank"
            pin=0
            break
        fi
    done
fi
{%- endif %}
for ((local_rank = 0; local_rank < NPROC_PER_NODE; local_rank++)); do
    export LOCAL_RANK="$local_rank"
    export RANK=$((NODE_RANK * NPROC_PER_NODE + LOCAL_RANK))
{%- if cookiecutter.device != "cpu" and not cpu_affinity %}
    if ((pin)); then
        device=$((10#${rank_devices[local_rank]}))
        cores="$((device * cores_per_device))-$((device * cores_per_device + cores_per_device - 1))"
        start_child "rank $RANK (local rank $LOCAL_RANK, device $device, cores $cores)" taskset -c "$cores" \
            "$PYTHON" "${program[@]}" "$@"
        continue
    fi
{%- endif %}
    start_child "rank $RANK (local rank $LOCAL_RANK)" "$PYTHON" "${program[@]}" "$@"
done
echo "node $NODE_RANK: started ranks $((NODE_RANK * NPROC_PER_NODE))-$((NODE_RANK * NPROC_PER_NODE + NPROC_PER_NODE - 1)) of $WORLD_SIZE"
{%- elif cookiecutter.launcher == "mp-spawn" %}
# train.py spawns NPROC_PER_NODE processes itself (torch.multiprocessing.spawn).
start_child "train.py (mp-spawn)" "$PYTHON" train.py --launcher mp-spawn \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" "$@"
{%- elif cookiecutter.launcher == "torch-launch" %}
echo "node $NODE_RANK: NOTE: torch.distributed.launch is deprecated upstream in favour of torchrun"
launch_args=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE"
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT")
# Look for the module's file without importing torch (fast, and works before CANN is set up).
if "$PYTHON" -c 'import importlib.util as u, os, sys; s = u.find_spec("torch"); sys.exit(0 if s is None or os.path.exists(os.path.join(os.path.dirname(s.origin), "distributed", "launch.py")) else 1)'; then
    start_child "torch.distributed.launch" "$PYTHON" -m torch.distributed.launch "${launch_args[@]}" \
        "${program[@]}" "$@"
else
    echo "node $NODE_RANK: torch.distributed.launch is gone from this torch; using torchrun with the same flags"
    start_child "torchrun" torchrun "${launch_args[@]}" "${program[@]}" "$@"
fi
{%- elif cookiecutter.launcher == "torchrun" %}
start_child "torchrun" torchrun --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    --max-restarts "${NPU_WIZARD_MAX_RESTARTS:-0}" \
    "${program[@]}" "$@"
{%- else %}
run_args=(--nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE"
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
    --max-restarts "${NPU_WIZARD_MAX_RESTARTS:-0}")
if command -v torch_npu_run >/dev/null 2>&1; then
    # torch_npu_run forces the parallel rendezvous: it needs the node rank, a fixed
    # node count and the master address and port, all given above.
{%- if cookiecutter.nodes|int >= 8 and cookiecutter.torch_npu_version|torch_npu_has("tiered_store_flag") %}
    # {{ cookiecutter.nodes|int }} nodes: a per-node proxy cuts the TCPStore connections from
    # one per rank to about sqrt(ranks), so the master is not flooded at start-up.
    run_args+=(--enable_tiered_parallel_tcpstore=true)
{%- elif cookiecutter.nodes|int >= 8 %}
    torch_npu_release={{ cookiecutter.torch_npu_version|sh }}
    echo "node $NODE_RANK: NOTE: torch_npu $torch_npu_release has no --enable_tiered_parallel_tcpstore (2.1.0.post12, 2.3.1.post6, 2.4.0.post4, 2.5.1 and later do): every rank connects to the master's store itself"
{%- endif %}
    start_child "torch_npu_run" torch_npu_run "${run_args[@]}" "${program[@]}" "$@"
else
    echo "node $NODE_RANK: torch_npu_run not found (torch_npu not installed: CPU simulation?); using torchrun with the same flags"
    start_child "torchrun" torchrun "${run_args[@]}" "${program[@]}" "$@"
fi
{%- endif %}

status=0
wait_children || status=$?
if ((status == 0)); then
    echo "node $NODE_RANK: finished; logs in $NPU_WIZARD_RUN_DIR/logs"
fi
exit "$status"
