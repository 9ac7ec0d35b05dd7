"""Every validation rule of the answers, table-driven: each message names its field."""

from __future__ import annotations

import pytest

from tests.factories import answers, answers_yaml
from wizard.answers.model import dump, from_context, load_text, resolve, to_context
from wizard.errors import AnswersError

BASE = {"project_name": "demo", "device": "cpu", "nodes": 1, "devices_per_node": 2, "amp": "off"}


def problems_of(raw: dict) -> list[str]:
    """The error lines resolve() reports for BASE updated with `raw`."""
    with pytest.raises(AnswersError) as caught:
        resolve({**BASE, **raw})
    return [str(p) for p in caught.value.problems]


def warnings_of(raw: dict) -> list[str]:
    """The warning lines of answers that resolve."""
    return [str(w) for w in resolve({**BASE, **raw}).warnings]


ERRORS = [
    # (name, raw answers, field, words in the message)
    ("slug", {"project_name": "My Project"}, "project_name", "lowercase"),
    ("template text is not a name", {"project_name": "{{ 7*7 }}"}, "project_name", "lowercase"),
    ("unknown series", {"hardware": "atlas-9000"}, "hardware", "atlas-training, atlas-a2, atlas-a3"),
    ("device", {"device": "gpu"}, "device", "npu, auto, cpu"),
    ("nodes zero", {"nodes": 0}, "nodes", "at least 1"),
    ("nodes not int", {"nodes": "two"}, "nodes", "an integer"),
    ("nodes float", {"nodes": 1.5}, "nodes", "an integer"),
    (
        "training series 3 cards",
        {"hardware": "atlas-training", "devices_per_node": 3, "amp": "fp16"},
        "devices_per_node",
        "1, 2, 4, 8",
    ),
    ("a2 16 cards", {"hardware": "atlas-a2", "devices_per_node": 16}, "devices_per_node", "1, 2, 3, 4, 5, 6, 7, 8"),
    ("a3 17 devices", {"hardware": "atlas-a3", "devices_per_node": 17}, "devices_per_node", "at most 16"),
    ("bf16 on training series", {"hardware": "atlas-training", "amp": "bf16"}, "amp", "no bf16 all_reduce"),
    ("amp value", {"amp": "fp8"}, "amp", "off, fp16, bf16"),
    ("launcher", {"launcher": "slurm"}, "launcher", "torchrun"),
    ("too few ips", {"nodes": 2, "network.host_ips": ["10.0.0.1"]}, "network.host_ips", "2 expected, 1 given"),
    (
        "repeated ip",
        {"nodes": 2, "network.host_ips": ["10.0.0.1", "10.0.0.1"]},
        "network.host_ips",
        "repeated: 10.0.0.1",
    ),
    ("not an ip", {"network.host_ips": ["10.0.0.300"]}, "network.host_ips", "not an IPv4 or IPv6 address"),
    (
        "master not a node",
        {"network.host_ips": ["10.0.0.1"], "network.master_addr": "10.0.0.9"},
        "network.master_addr",
        "one of the host IPs",
    ),
    ("master bad host", {"network.master_addr": "bad host!"}, "network.master_addr", "IPv4 or IPv6"),
    ("port range", {"network.master_port": 70000}, "network.master_port", "at most 65535"),
    ("port low", {"network.master_port": 80}, "network.master_port", "at least 1024"),
    ("master port inside hccl range", {"network.master_port": 60005}, "network.master_port", "HCCL port range"),
    (
        "hccl range past 65535",
        {"network.hccl_base_port": 65520, "network.hccl_port_count": 32},
        "network.hccl_base_port",
        "past port 65535",
    ),
    ("port count", {"network.hccl_port_count": 20}, "network.hccl_port_count", "16, 32"),
    ("connect timeout low", {"network.connect_timeout": 60}, "network.connect_timeout", "at least 120"),
    ("connect timeout high", {"network.connect_timeout": 8000}, "network.connect_timeout", "at most 7200"),
    (
        "training series exec zero",
        {"hardware": "atlas-training", "amp": "fp16", "network.exec_timeout": 0},
        "network.exec_timeout",
        "accepts (0, 17340] seconds",
    ),
    (
        "training series exec above its cap",
        {"hardware": "atlas-training", "amp": "fp16", "network.exec_timeout": 17408},
        "network.exec_timeout",
        "accepts (0, 17340] seconds",
    ),
    ("a2 exec above its cap", {"network.exec_timeout": 2147483648}, "network.exec_timeout", "at most 2147483647"),
    (
        "torch_npu_run missing",
        {
            "launcher": "torch-npu-run",
            "environment.torch_npu_version": "2.1.0.post6",
            "environment.torch_version": "2.1.0",
        },
        "launcher",
        "no torch_npu_run",
    ),
    (
        "torch_npu_run 2.3.1 too old",
        {
            "launcher": "torch-npu-run",
            "environment.torch_npu_version": "2.3.1.post1",
            "environment.torch_version": "2.3.1",
        },
        "launcher",
        "2.3.1.post2+",
    ),
    (
        "version pair",
        {"environment.torch_npu_version": "2.6.0.post3", "environment.torch_version": "2.5.1"},
        "environment.torch_version",
        "needs torch 2.6.0",
    ),
    ("version text", {"environment.torch_npu_version": "latest"}, "environment.torch_npu_version", "2.9.0.post6"),
    ("set_env path relative", {"environment.cann_set_env": "set_env.sh"}, "environment.cann_set_env", "absolute"),
    (
        "set_env path with shell",
        {"environment.cann_set_env": "/opt/$(reboot)/set_env.sh"},
        "environment.cann_set_env",
        "absolute",
    ),
    ("nic", {"network.nic": "eth0; rm -rf /"}, "network.nic", "interface name"),
    ("batch", {"training.batch_size": 0}, "training.batch_size", "at least 1"),
    ("lr negative", {"training.lr": -0.1}, "training.lr", "at least 0"),
    ("lr nan", {"training.lr": "nan"}, "training.lr", "finite"),
    ("model", {"training.model": "llama"}, "training.model", "mlp, convnet, resnet18, gpt"),
    (
        "data_dir quotes",
        {"training.dataset": "mnist", "training.data_dir": "my data"},
        "training.data_dir",
        "no spaces",
    ),
    ("engine", {"cluster.engine": "lsf"}, "cluster.engine", "manual, ssh, slurm, ascendjob, pytorchjob"),
    ("slurm time", {"cluster.engine": "slurm", "cluster.time": "12 hours"}, "cluster.time", "HH:MM:SS"),
    ("slurm partition", {"cluster.engine": "slurm", "cluster.partition": "a b"}, "cluster.partition", "letters"),
    ("slurm account", {"cluster.engine": "slurm", "cluster.account": "$(id)"}, "cluster.account", "letters"),
    ("slurm gres", {"cluster.engine": "slurm", "cluster.gres": "gpu 8"}, "cluster.gres", "gpu:910b:8"),
    ("slurm cpus", {"cluster.engine": "slurm", "cluster.cpus_per_task": 0}, "cluster.cpus_per_task", "at least 1"),
    (
        "slurm signal past the time limit",
        {"cluster.engine": "slurm", "cluster.time": "00:02:00", "cluster.signal_before": 120},
        "cluster.signal_before",
        "not below the time limit cluster.time (00:02:00, 120 s)",
    ),
    ("slurm signal negative", {"cluster.engine": "slurm", "cluster.signal_before": -1}, "cluster.signal_before", "0"),
    (
        "ssh hosts count",
        {"nodes": 2, "network.host_ips": ["10.0.0.1", "10.0.0.2"], "cluster.engine": "ssh", "cluster.ssh_hosts": ["a"]},
        "cluster.ssh_hosts",
        "2 expected, 1 given",
    ),
    (
        "ssh host option",
        {
            "nodes": 2,
            "network.host_ips": ["10.0.0.1", "10.0.0.2"],
            "cluster.engine": "ssh",
            "cluster.ssh_hosts": ["-oProxyCommand=id", "b"],
        },
        "cluster.ssh_hosts",
        "not a host name",
    ),
    ("ssh remote_dir", {"cluster.engine": "ssh", "cluster.remote_dir": "rel/dir"}, "cluster.remote_dir", "absolute"),
]


@pytest.mark.parametrize(("raw", "field", "words"), [case[1:] for case in ERRORS], ids=[c[0] for c in ERRORS])
def test_each_rule_names_its_field_value_and_what_is_allowed(raw: dict, field: str, words: str) -> None:
    lines = problems_of(raw)
    matching = [line for line in lines if line.startswith(f"{field}: ")]
    assert matching, lines
    assert any(words in line for line in matching), matching


WARNINGS = [
    ("amp off on training series", {"hardware": "atlas-training", "amp": "off"}, "amp", "fp16 mixed precision"),
    ("ephemeral master port", {"network.master_port": 40000}, "network.master_port", "ephemeral range 32768-60999"),
    ("master is a name", {"network.master_addr": "node0.cluster"}, "network.master_addr", "resolve"),
    (
        "master not node 0",
        {"nodes": 2, "network.host_ips": ["10.0.0.1", "10.0.0.2"], "network.master_addr": "10.0.0.2"},
        "network.master_addr",
        "node 0",
    ),
    (
        "loopback cluster on npu",
        {"device": "npu", "nodes": 2, "network.host_ips": ["127.0.0.1", "127.0.0.1"]},
        "network.host_ips",
        "loopback",
    ),
    ("deprecated launcher", {"launcher": "torch-launch"}, "launcher", "deprecated"),
    ("status port in hccl range", {"network.master_port": 59999}, "network.master_port", "status stream"),
    (
        "unknown pairing",
        {"environment.torch_npu_version": "2.9.0.post99", "environment.torch_version": "2.9.0"},
        "environment.torch_npu_version",
        "CANN pairing",
    ),
    ("inapplicable answer", {"training.data_dir": "data"}, "training.data_dir", "does not apply"),
    (
        "connect not below exec",
        {"network.connect_timeout": 2000, "network.exec_timeout": 1836},
        "network.connect_timeout",
        "not below network.exec_timeout (1836)",
    ),
    (
        "training series exec floored",
        {"hardware": "atlas-training", "amp": "fp16", "network.exec_timeout": 1800},
        "network.exec_timeout",
        "floors it to a multiple of 68 (at least 68): HCCL will wait 1768s",
    ),
    (
        "training series exec below 68",
        {"hardware": "atlas-training", "amp": "fp16", "network.exec_timeout": 50, "network.connect_timeout": 120},
        "network.exec_timeout",
        "HCCL will wait 68s",
    ),
]


@pytest.mark.parametrize(("raw", "field", "words"), [case[1:] for case in WARNINGS], ids=[c[0] for c in WARNINGS])
def test_warnings_name_their_field_and_do_not_block(raw: dict, field: str, words: str) -> None:
    lines = warnings_of(raw)
    assert any(line.startswith(f"{field}: ") and words in line for line in lines), lines


def test_every_problem_is_reported_at_once() -> None:
    lines = problems_of({"nodes": 0, "amp": "fp8", "launcher": "slurm", "network.master_port": 1})
    fields = [line.split(":")[0] for line in lines]
    assert fields == ["nodes", "network.master_port", "launcher", "amp"]


def test_loopback_addresses_may_repeat_to_simulate_nodes_on_one_host() -> None:
    simulated = answers(nodes=2, network__host_ips=["127.0.0.1", "127.0.0.1"])
    assert simulated["network.host_ips"] == ("127.0.0.1", "127.0.0.1")


def test_unknown_keys_get_a_did_you_mean() -> None:
    with pytest.raises(AnswersError) as caught:
        load_text(answers_yaml({"node": 2, "network": {"master_prot": 29500}, "traning": {}}))
    lines = [str(p) for p in caught.value.problems]
    assert "node: 2: unknown key; did you mean 'nodes'?" in lines
    assert "network.master_prot: 29500: unknown key; did you mean 'network.master_port'?" in lines
    assert "traning: {}: unknown key; did you mean 'training'?" in lines


def test_schema_other_than_1_is_refused() -> None:
    with pytest.raises(AnswersError, match="schema: 2: this npu-wizard reads schema 1"):
        load_text("schema: 2\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: [1\n", "not valid YAML at line 2"),
        ("- a\n- b\n", "must be a mapping"),
        ("network: 5\n", "network: 5: must be a mapping of its own keys"),
    ],
)
def test_malformed_files_are_problems_not_tracebacks(text: str, message: str) -> None:
    with pytest.raises(AnswersError, match=message.replace("[", r"\[")):
        load_text(text)


def test_yaml_bare_off_means_amp_off() -> None:
    loaded = load_text("device: cpu\namp: off\nhardware: atlas-a2\n")
    assert loaded["amp"] == "off"


def test_defaults_follow_earlier_answers() -> None:
    training = resolve({"hardware": "atlas-training"})
    assert training["amp"] == "fp16"
    assert training["devices_per_node"] == 8
    a3 = resolve({"hardware": "atlas-a3", "environment.torch_npu_version": "2.5.1"})
    assert a3["amp"] == "bf16"
    assert a3["environment.torch_version"] == "2.5.1"
    assert a3["network.hccl_port_count"] == 16
    assert resolve({})["network.hccl_port_count"] == 32


@pytest.mark.parametrize(
    ("torch_npu", "ports"),
    [("2.4.0.post2", 16), ("2.5.1", 16), ("2.6.0", 32), ("2.1.0.post13", 32), ("2.8.0", 32), ("2.9.0.post99", 32)],
)
def test_hccl_port_count_is_32_from_cann_8_2_rc1_and_when_the_cann_is_unknown(torch_npu: str, ports: int) -> None:
    raw = {"environment.torch_npu_version": torch_npu, "environment.torch_version": torch_npu.split(".post")[0]}
    assert resolve(raw)["network.hccl_port_count"] == ports


@pytest.mark.parametrize("seconds", [0, 1836, 100_000, 2147483647])
def test_a2_and_a3_accept_exec_timeouts_up_to_2147483647_with_0_for_never(seconds: int) -> None:
    for series in ("atlas-a2", "atlas-a3"):
        loaded = resolve({**BASE, "hardware": series, "network.exec_timeout": seconds})
        assert loaded["network.exec_timeout"] == seconds
        assert not [w for w in loaded.warnings if w.field == "network.exec_timeout"]


def test_a_multiple_of_68_on_the_training_series_passes_without_a_warning() -> None:
    loaded = resolve({**BASE, "hardware": "atlas-training", "amp": "fp16", "network.exec_timeout": 17340})
    assert not [w for w in loaded.warnings if w.field == "network.exec_timeout"]


def test_learning_rate_scaling_inputs_apply_only_without_lr() -> None:
    explicit = answers(training__lr=0.4)
    assert explicit.get("training.base_lr") is None
    assert answers().get("training.base_lr") == 0.05


def test_dump_then_load_gives_the_same_answers() -> None:
    original = answers(nodes=2, network__host_ips=["10.0.0.1", "10.0.0.2"], amp="bf16", training__lr=0.1)
    assert load_text(dump(original)).values == original.values


def test_context_round_trip_gives_the_same_answers() -> None:
    original = answers(training__dataset="mnist", training__data_dir="data/mnist", network__nic="eth0")
    assert from_context(to_context(original)).values == original.values


def test_answers_are_immutable() -> None:
    with pytest.raises(TypeError):
        answers().values["nodes"] = 3  # type: ignore[index]


def test_a_misplaced_or_misspelt_key_points_to_its_full_name() -> None:
    with pytest.raises(AnswersError) as caught:
        load_text(answers_yaml({"epochz": 3, "network": {"batch_size": 8}}))
    lines = [str(p) for p in caught.value.problems]
    assert "epochz: 3: unknown key; did you mean 'training.epochs'?" in lines
    assert "network.batch_size: 8: unknown key; did you mean 'training.batch_size'?" in lines
