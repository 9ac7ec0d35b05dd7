"""Every question of the wizard, in the order it asks them (schema 1)."""

from __future__ import annotations

from wizard.answers import hardware, hostfile
from wizard.answers.questions_cluster import ENGINE, SETTINGS, engine_of, scheduled
from wizard.answers.questions_k8s import KUBERNETES_QUESTIONS
from wizard.answers.questions_training import TRAINING_QUESTIONS
from wizard.answers.spec import Choice, Question, Values

STEP_TITLES: dict[str, str] = {
    "project": "Project",
    "hardware": "Hardware series",
    "topology": "Topology",
    "cluster": "Cluster",
    "launcher": "Launcher",
    "precision": "Mixed precision",
    "training": "Training",
    "environment": "Environment",
}


def _series_choices() -> tuple[Choice, ...]:
    return tuple(Choice(s.key, s.title, f"{s.chip}; {s.note}") for s in hardware.SERIES.values())


def _default_amp(values: Values) -> str:
    series = hardware.SERIES.get(values.get("hardware", ""))
    return "bf16" if series is not None and series.bf16 else "fp16"


def _default_devices(values: Values) -> int:
    series = hardware.SERIES.get(values.get("hardware", ""))
    return 8 if series is None else min(8, max(series.devices_per_node))


def _default_host_ips(values: Values) -> tuple[str, ...]:
    if values.get("network.hostfile"):
        return hostfile.nodes(hostfile.read(values["network.hostfile"]))
    return ("127.0.0.1",) * int(values.get("nodes") or 1)


def _default_spare_hosts(values: Values) -> tuple[str, ...] | None:
    if values.get("network.hostfile"):
        return hostfile.spares(hostfile.read(values["network.hostfile"])) or None
    return None


def _default_master_addr(values: Values) -> str:
    ips = values.get("network.host_ips") or ("127.0.0.1",)
    return ips[0]


def _default_port_count(values: Values) -> int:
    return hardware.hccl_port_count_for(values.get("environment.torch_npu_version", ""))


def _default_cann_set_env(values: Values) -> str:
    return hardware.cann_set_env_for(values.get("environment.torch_npu_version", ""))


def _default_torch(values: Values) -> str:
    npu = values.get("environment.torch_npu_version") or hardware.DEFAULT_TORCH_NPU
    return hardware.base_version(npu)


def _by_address(values: Values) -> bool:
    return not scheduled(values)


def _spares_refused(values: Values) -> str:
    return (
        f"the {engine_of(values)} engine chooses the nodes when the job starts, so there is no node address to "
        "replace: "
        + (
            "a restart (run --restarts) resubmits the job with the failed node excluded instead"
            if engine_of(values) == "slurm"
            else "the operator reschedules a failed pod by itself (run.restarts sets its retries)"
        )
    )


QUESTIONS: tuple[Question, ...] = (
    Question(
        name="project_name",
        prompt="Project name",
        kind="slug",
        default="ddp-npu",
        step="project",
        help="The name of the generated folder and of the job in logs.",
    ),
    Question(
        name="hardware",
        prompt="Hardware series",
        kind="choice",
        default="atlas-a2",
        choices=_series_choices(),
        step="hardware",
        help="The Ascend series of the training servers; it decides how many devices a node "
        "may use and whether bf16 is available.",
    ),
    Question(
        name="device",
        prompt="Device",
        kind="choice",
        default="npu",
        choices=(
            Choice("npu", "NPU", "Ascend NPUs through torch_npu and HCCL; fails clearly when none is usable."),
            Choice("auto", "Auto", "NPU if usable, else CUDA, else CPU; the run says which it took."),
            Choice("cpu", "CPU simulation", "Every rank on the CPU with gloo: to try the project anywhere."),
        ),
        step="hardware",
        help="Where the ranks run. A run may override it with NPU_WIZARD_DEVICE or --device.",
    ),
    Question(
        name="nodes",
        prompt="Number of nodes",
        kind="int",
        default=1,
        minimum=1,
        maximum=4096,
        step="topology",
        help="How many servers take part; each runs one launch script.",
    ),
    Question(
        name="devices_per_node",
        prompt="Devices per node",
        kind="int",
        default_from=_default_devices,
        minimum=1,
        maximum=16,
        step="topology",
        help="Processes (one per device) on each node. The series decides which counts work.",
    ),
    ENGINE,
    *SETTINGS,
    *KUBERNETES_QUESTIONS,
    Question(
        name="network.hostfile",
        prompt="Hostfile (for many nodes)",
        kind="hostfile",
        optional=True,
        replaces="network.host_ips",
        when=_by_address,
        step="topology",
        help="A file of the nodes' addresses instead of typing them: one IP per line, node 0 first, "
        "optionally slots=N (devices per node), # for comments; ranges like 10.0.0.11-10.0.0.74 too. "
        "A relative path is taken from the answers file's folder. Its addresses become host_ips.",
    ),
    Question(
        name="network.host_ips",
        prompt="Host IP of each node",
        kind="ip_list",
        default_from=_default_host_ips,
        when=_by_address,
        step="topology",
        help="The address of each node on the network HCCL should use (HCCL_IF_IP), node 0 "
        "first. Loopback addresses simulate every node on this host.",
    ),
    Question(
        name="network.spare_hosts",
        prompt="Spare hosts (optional)",
        kind="ip_list",
        optional=True,
        default_from=_default_spare_hosts,
        when=_by_address,
        refused=_spares_refused,
        step="cluster",  # after the engine, which decides whether a spare can take a node's place
        help="Hosts that stand by for a failed node, by address: when a node fails twice in a row or its health "
        "check, `npu-wizard run --restarts N` starts that node's launch script on the next spare (the ssh engine "
        "copies the project there first). Not one of the host IPs. A hostfile marks them with the word spare.",
    ),
    Question(
        name="network.master_addr",
        prompt="Master address",
        kind="host",
        default_from=_default_master_addr,
        when=_by_address,
        step="topology",
        help="Where rank 0 listens for the others to meet (MASTER_ADDR): node 0's host IP.",
    ),
    Question(
        name="network.master_port",
        prompt="Master port",
        kind="int",
        default=29500,
        minimum=1024,
        maximum=65535,
        step="topology",
        help="A free TCP port on the master node (MASTER_PORT), outside the HCCL port range "
        "and, ideally, outside the ephemeral range 32768-60999. Under Slurm the job adds its "
        "job id modulo 1000, so jobs sharing a node keep apart (a clash stops the job at start, naming "
        "the port). Kubernetes pods use the operator's port instead.",
    ),
    Question(
        name="network.nic",
        prompt="Network interface (optional)",
        kind="nic",
        optional=True,
        step="topology",
        help="HCCL_SOCKET_IFNAME, to pick the NIC by name instead of by IP: 'eth0' or "
        "'eth,enp' (prefixes), '=eth0' (exact), '^docker' (exclude). The launch scripts then "
        "leave HCCL_IF_IP unset (HCCL would take it over the name). Leave empty to use HCCL_IF_IP.",
    ),
    Question(
        name="network.hccl_base_port",
        prompt="HCCL base port",
        kind="int",
        default=60000,
        minimum=1024,
        maximum=65520,
        step="topology",
        help="HCCL_IF_BASE_PORT: the first host port HCCL listens on; the ports from here on "
        "are reserved by the sysctl snippet. Under Slurm each job takes one of 64 slots of "
        "port-count ports from here, by job id.",
    ),
    Question(
        name="launcher",
        prompt="Launch method",
        kind="choice",
        default="torchrun",
        choices=(
            Choice(
                "torchrun",
                "torchrun",
                "PyTorch's launcher: one command per node, ranks from the environment, elastic restarts.",
            ),
            Choice(
                "torch-npu-run",
                "torch_npu_run",
                "torch_npu's launcher for clusters: torchrun's flags with a parallel rendezvous; "
                "recommended for many nodes. Falls back to torchrun where torch_npu is absent.",
            ),
            Choice(
                "shell",
                "Shell loop",
                "The launch script starts one process per device itself and stops them all when one fails.",
            ),
            Choice("mp-spawn", "mp.spawn", "train.py spawns one process per device with torch.multiprocessing."),
            Choice(
                "torch-launch",
                "torch.distributed.launch",
                "Deprecated upstream in favour of torchrun; kept for old scripts.",
            ),
        ),
        step="launcher",
        help="How each node starts its processes. Every method gives the same ranks.",
    ),
    Question(
        name="amp",
        prompt="Mixed precision",
        kind="choice",
        default_from=_default_amp,
        choices=(
            Choice("off", "Off", "float32 everywhere."),
            Choice("fp16", "fp16", "float16 autocast with dynamic loss scaling (GradScaler)."),
            Choice("bf16", "bf16", "bfloat16 autocast; no loss scaling needed. Not on the Atlas training series."),
        ),
        step="precision",
        help="Autocast for the forward pass. In YAML, quote it or write off/fp16/bf16.",
    ),
    *TRAINING_QUESTIONS,
    Question(
        name="environment.torch_npu_version",
        prompt="torch_npu version",
        kind="version",
        default=hardware.DEFAULT_TORCH_NPU,
        step="environment",
        help="The torch_npu release for requirements.txt; it decides the CANN release and "
        "whether torch_npu_run exists.",
    ),
    Question(
        name="environment.torch_version",
        prompt="torch version",
        kind="version",
        default_from=_default_torch,
        step="environment",
        help="The torch release; torch_npu X.Y.Z[.postN] needs torch X.Y.Z.",
    ),
    Question(
        name="environment.cann_set_env",
        prompt="CANN set_env.sh",
        kind="path",
        default_from=_default_cann_set_env,
        step="environment",
        help="The script that sets up CANN, by default where the CANN that torch_npu pairs with "
        "installs (8.5 and later: /usr/local/Ascend/cann/set_env.sh, before: "
        "/usr/local/Ascend/ascend-toolkit/set_env.sh). Launch scripts try it first, then the "
        "other known places.",
    ),
    Question(
        name="run.python",
        prompt="Python for the ranks",
        kind="path",
        optional=True,
        step="environment",
        help="The interpreter the launch scripts run (and the torchrun beside it), the same path on every node. "
        "Empty: npu-wizard run starts them with the Python it runs in itself; a launch script started by hand "
        "(or in a container) uses python3. PYTHON in the environment overrides both.",
    ),
    Question(
        name="network.hccl_port_count",
        prompt="HCCL port count",
        kind="choice_int",
        default_from=_default_port_count,
        choices=(
            Choice("16", "16", "CANN 8.0 and 8.1"),
            Choice("32", "32", "CANN 8.2.RC1 and later (reserving 32 is harmless on older CANN)"),
        ),
        step="environment",
        help="How many host ports from the base port HCCL uses: 16 on CANN 8.0/8.1, 32 from 8.2.RC1.",
    ),
    Question(
        name="network.connect_timeout",
        prompt="HCCL connect timeout (s)",
        kind="int",
        default=120,
        minimum=120,
        maximum=7200,
        step="environment",
        help="HCCL_CONNECT_TIMEOUT: how long ranks wait for each other at setup; raise to "
        "1200 or more on large jobs. Best kept below the exec timeout.",
    ),
    Question(
        name="network.exec_timeout",
        prompt="HCCL exec timeout (s)",
        kind="int",
        default=1836,
        minimum=0,
        maximum=hardware.EXEC_TIMEOUT_MAX,
        step="environment",
        help="HCCL_EXEC_TIMEOUT: how long a collective waits for the slowest rank. On A2/A3 "
        "0 to 2147483647, 0 meaning never; on the Atlas training series 1 to 17340, floored "
        "to a multiple of 68.",
    ),
)

BY_NAME: dict[str, Question] = {q.name: q for q in QUESTIONS}
STEPS: tuple[str, ...] = tuple(dict.fromkeys(q.step for q in QUESTIONS))
