"""The `cluster` section: which engine starts the nodes, and that engine's few settings."""

from __future__ import annotations

from wizard.answers.spec import Choice, Question, Values

SCHEDULERS = ("slurm", "ascendjob", "pytorchjob")
"""Engines that choose the nodes at run time: no host IPs are asked, each node finds its own."""
MASTER_PORT_SPAN = 1000
"""Under a scheduler MASTER_PORT = master_port + job id modulo this, so packed jobs differ."""
HCCL_SLOTS = 64
"""Under a scheduler each job's HCCL ports are slot (job id modulo this) of the range from the base port."""
OPERATOR_MASTER_PORTS = {"ascendjob": 2222, "pytorchjob": 23456}
"""The master port a Kubernetes operator gives its pods (its default container port), not the answers' master_port."""


def engine_of(values: Values) -> str:
    """The engine the answers so far name (manual until one is chosen)."""
    return str(values.get("cluster.engine") or "manual")


def scheduled(values: Values) -> bool:
    """Whether a scheduler places the nodes (so host addresses are found at run time)."""
    return engine_of(values) in SCHEDULERS


def _on(engine: str):  # noqa: ANN202 - a `when` predicate
    return lambda values: engine_of(values) == engine


ENGINE = Question(
    name="cluster.engine",
    prompt="Engine",
    kind="choice",
    default="manual",
    choices=(
        Choice("manual", "By hand", "One launch script per node: start each yourself, or npu-wizard run on each node."),
        Choice(
            "ssh",
            "ssh",
            "npu-wizard run copies the project to every host over ssh, starts every node and stops them all.",
        ),
        Choice("slurm", "Slurm", "slurm/job.sbatch: npu-wizard run submits it with sbatch and follows the job."),
        Choice("ascendjob", "AscendJob", "MindCluster's Kubernetes AscendJob (Volcano gang scheduling)."),
        Choice("pytorchjob", "PyTorchJob", "Kubeflow's Kubernetes PyTorchJob."),
    ),
    step="cluster",
    help="What starts, follows and stops the nodes of the job. Under a scheduler (Slurm, "
    "Kubernetes) the nodes are chosen when the job starts: no host IPs are asked.",
)

SETTINGS: tuple[Question, ...] = (
    Question(
        name="cluster.ssh_hosts",
        prompt="ssh hosts (optional)",
        kind="host_list",
        optional=True,
        when=_on("ssh"),
        step="cluster",
        help="The host of each node as ssh reaches it (names from ~/.ssh/config work), node 0 "
        "first. Leave empty to use the nodes' host IPs.",
    ),
    Question(
        name="cluster.remote_dir",
        prompt="Folder on the hosts (optional)",
        kind="path",
        optional=True,
        when=_on("ssh"),
        step="cluster",
        help="Where the project is copied on every host (rsync, only what changed). Leave "
        "empty to use the project's absolute path on this machine.",
    ),
    Question(
        name="cluster.partition",
        prompt="Slurm partition (optional)",
        kind="slurm_name",
        optional=True,
        when=_on("slurm"),
        step="cluster",
        help="sbatch --partition. Leave empty for the cluster's default partition.",
    ),
    Question(
        name="cluster.time",
        prompt="Time limit",
        kind="slurm_time",
        default="01:00:00",
        when=_on("slurm"),
        step="cluster",
        help="sbatch --time as HH:MM:SS, or whole minutes as Slurm reads 240: Slurm ends the job when it runs longer.",
    ),
    Question(
        name="cluster.signal_before",
        prompt="Save this many seconds before the time limit",
        kind="int",
        default=120,
        minimum=0,
        maximum=65535,
        when=_on("slurm"),
        step="cluster",
        help="sbatch --signal=B:USR1@N: Slurm warns the job N seconds before its time limit; every rank "
        "then saves a checkpoint at its next logged step and the job is requeued (--requeue) to resume "
        "from it. Allow a logged window and a save. 0: no warning, no requeue.",
    ),
    Question(
        name="cluster.gres",
        prompt="GRES per node (optional)",
        kind="gres",
        optional=True,
        when=_on("slurm"),
        step="cluster",
        help="sbatch --gres, e.g. gpu:910b:8 where the NPUs are declared as a gpu GRES of type "
        "910b. Leave empty for CPU simulation or a cluster without a GRES for NPUs.",
    ),
    Question(
        name="cluster.account",
        prompt="Slurm account (optional)",
        kind="slurm_name",
        optional=True,
        when=_on("slurm"),
        step="cluster",
        help="sbatch --account, where the cluster charges jobs to accounts.",
    ),
    Question(
        name="cluster.cpus_per_task",
        prompt="CPUs per node (optional)",
        kind="int",
        optional=True,
        minimum=1,
        maximum=4096,
        when=_on("slurm"),
        step="cluster",
        help="sbatch --cpus-per-task: the CPU cores each node's launcher and its ranks may use.",
    ),
)
