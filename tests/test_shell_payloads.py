"""Nothing a user types runs as a command.

Two layers, each tested on its own. The answer checks refuse shell syntax in
every free-text field, naming the field. And the `sh` filter quotes every value
a template writes into a script, proven on renders that skip the checks
(`Answers` built directly): `bash -n` passes, the real launch script runs
(`--smoke`, CPU, preflight skipped) and no payload's marker file appears.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from tests.factories import answers
from tests.runs import free_port, wait_for
from wizard.answers.model import Answers, to_context
from wizard.errors import AnswersError, TargetError
from wizard.render.render import render
from wizard.render.shellquote import sh, template_environment
from wizard.render.templates import project_template

MARKER = "PWNED"

# Each runs `touch PWNED...` if a script ever executes the value as shell.
PAYLOADS: dict[str, str] = {
    "command-substitution": f"$(touch {MARKER}-1)",
    "backticks": f"`touch {MARKER}-2`",
    "single-quote": f"x'; touch {MARKER}-3; '",
    "double-quote": f'x"; touch {MARKER}-4; "',
    "newline": f"x\ntouch {MARKER}-5\n",
    "semicolon": f"x; touch {MARKER}-6",
    "jinja": "{{ cycler.__init__.__globals__.os.system('touch " + MARKER + "-7') }}",
}

# Every free-text answer, with the raw form a YAML file gives it.
FREE_TEXT: dict[str, Any] = {
    "project_name": lambda payload: payload,
    "network.host_ips": lambda payload: ["::1%" + payload],
    "network.master_addr": lambda payload: payload,
    "network.nic": lambda payload: payload,
    "training.data_dir": lambda payload: payload,
    "environment.torch_npu_version": lambda payload: "2.9.0" + payload,
    "environment.torch_version": lambda payload: "2.9.0" + payload,
    "environment.cann_set_env": lambda payload: "/opt/" + payload,
}


def markers(root: Path) -> list[Path]:
    """Marker files a payload would have made anywhere under `root`."""
    return sorted(root.rglob(f"{MARKER}*"))


# ---- the checks ----------------------------------------------------------------


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
@pytest.mark.parametrize("field", FREE_TEXT)
def test_the_checks_refuse_shell_syntax_in_every_free_text_field(field: str, payload: str) -> None:
    extra = {"training.dataset": "imagefolder"} if field == "training.data_dir" else {}
    with pytest.raises(AnswersError) as refused:
        answers(**{field.replace(".", "__"): FREE_TEXT[field](payload)}, **extra)
    assert [problem.field for problem in refused.value.problems] == [field]


@pytest.mark.parametrize(
    "zone",
    ["$(id>PWNED)", "`id`", "eth0'", 'eth0"', "eth0\nid", "eth0;id", "a" * 16, "eth 0", ""],
)
@pytest.mark.parametrize("field", ["network.host_ips", "network.master_addr"])
def test_an_ipv6_zone_id_must_be_an_interface_name(field: str, zone: str) -> None:
    value = ["::1%" + zone] if field == "network.host_ips" else "::1%" + zone
    with pytest.raises(AnswersError) as refused:
        answers(**{field.replace(".", "__"): value})
    assert [problem.field for problem in refused.value.problems] == [field]


@pytest.mark.parametrize("zone", ["eth0", "enp1s0f0.100", "a" * 15, "1", "br-x_y:z"])
def test_an_interface_name_is_a_good_zone_id(zone: str) -> None:
    made = answers(network__host_ips=["::1%" + zone], network__master_addr="::1%" + zone)
    assert made["network.host_ips"] == ("::1%" + zone,)
    assert made["network.master_addr"] == "::1%" + zone


@pytest.mark.parametrize(
    ("field", "value", "limit"),
    [
        ("network.nic", "e" * 10_000, 255),
        ("environment.cann_set_env", "/" + "a" * 5000, 1024),
        ("training.data_dir", "d" * 5000, 1024),
        ("environment.torch_version", "2.9." + "0" * 100, 32),
        ("network.master_addr", "h" * 300, 253),
    ],
    ids=lambda value: value if isinstance(value, int) or len(value) < 40 else "long",
)
def test_free_text_answers_have_a_length_bound(field: str, value: str, limit: int) -> None:
    extra = {"training.dataset": "imagefolder"} if field == "training.data_dir" else {}
    with pytest.raises(AnswersError) as refused:
        answers(**{field.replace(".", "__"): value}, **extra)
    (problem,) = refused.value.problems
    assert problem.field == field
    assert problem.message == f"too long: at most {limit} characters"
    assert len(str(problem)) < 200


@pytest.mark.parametrize("version", ["２.９.０", "2.9.０", "2.9.0.post６", "٢.9.0"])
def test_versions_take_ascii_digits_only(version: str) -> None:
    with pytest.raises(AnswersError) as refused:
        answers(environment__torch_version=version)
    assert [problem.field for problem in refused.value.problems] == ["environment.torch_version"]


# ---- the filter ----------------------------------------------------------------


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_sh_gives_one_line_bash_reads_back_unchanged(payload: str, tmp_path: Path) -> None:
    quoted = sh(payload)
    assert "\n" not in quoted
    script = f'value={quoted}\nprintf %s "$value"\n# a comment: {quoted}\n'
    result = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert result.stdout == payload
    assert markers(tmp_path) == []


def test_sh_leaves_plain_values_as_they_read() -> None:
    assert [sh(v) for v in ("10.0.0.1", "::1%eth0", "/usr/local/Ascend/set_env.sh", "eth,enp")] == [
        "10.0.0.1",
        "::1%eth0",
        "/usr/local/Ascend/set_env.sh",
        "eth,enp",
    ]
    assert sh("^docker") == "'^docker'"


def test_plain_cookiecutter_loads_the_filter_from_cookiecutter_json() -> None:
    import json

    settings = json.loads((project_template() / "cookiecutter.json").read_text())
    from cookiecutter.environment import StrictEnvironment

    environment = StrictEnvironment(context={"cookiecutter": settings})
    assert environment.from_string("{{ x|sh }}").render(x="a b") == "'a b'"
    assert template_environment().from_string("{{ x|sh }}").render(x="a b") == "'a b'"


# ---- renders that skip the checks ------------------------------------------------


def unchecked(payload: str) -> Answers:
    """Valid CPU answers with every free-text value replaced by `payload`, the checks skipped."""
    values = dict(answers(launcher="shell", devices_per_node=1).values)
    values.update(
        {
            # (Template syntax in a project name is refused before any render: tested below.)
            "project_name": "p" + payload.replace("{", "(").replace("}", ")"),
            "network.host_ips": ("::1%" + payload,),
            "network.master_addr": "::1%" + payload,
            "network.nic": payload,
            "network.master_port": free_port(),
            "environment.torch_npu_version": "2.9.0" + payload,
            "environment.torch_version": "2.9.0" + payload,
            "environment.cann_set_env": "/opt/" + payload,
            "training.dataset": "imagefolder",
            "training.data_dir": payload,
        }
    )
    return Answers(MappingProxyType(values))


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_every_value_is_quoted_where_the_checks_were_skipped(payload: str, tmp_path: Path) -> None:
    project = render(unchecked(payload), tmp_path / "out").project_dir
    scripts = sorted(project.rglob("*.sh"))
    assert [p.relative_to(project).as_posix() for p in scripts] == [
        "launch/node0.sh",
        "launch/run-node.sh",
        "sysctl/reserve-ports.sh",
    ]
    for script in scripts:
        subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run([sys.executable, "-m", "py_compile", str(project / "train.py")], check=True)

    fakes = tmp_path / "fakebin"
    fakes.mkdir()
    (fakes / "sysctl").write_text("#!/bin/sh\nexit 0\n")  # a test double: never touch this host's settings
    (fakes / "sysctl").chmod(0o755)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("NPU_WIZARD_", "MASTER_", "HCCL_", "CANN_"))},
        "PATH": f"{fakes}:{Path(sys.executable).parent}:/usr/bin:/bin",
        "PYTHON": sys.executable,
        "NPU_WIZARD_SKIP_PREFLIGHT": "1",
        "NPU_WIZARD_DEVICE": "cpu",
        "NPU_WIZARD_RUN_DIR": str(tmp_path / "run"),
        "NPU_WIZARD_RESERVED_PORTS_FILE": str(tmp_path / "reserved"),
        "NPU_WIZARD_SYSCTL_DIR": str(tmp_path / "sysctl.d"),
    }
    (tmp_path / "reserved").write_text("\n")
    log = tmp_path / "run" / "logs" / "node-0.log"
    launch = subprocess.Popen(
        ["bash", str(project / "launch" / "node0.sh"), "--smoke"],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Once the rank is started every line that holds a value has run; the rank
        # itself may wait for the (unchecked, unreachable) master: stop it then.
        wait_for(lambda: log.is_file() and "started ranks 0-0 of 1" in log.read_text(), 120, "the rank to start")
        os.killpg(launch.pid, signal.SIGTERM)
        launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
    reserve = subprocess.run(
        ["bash", str(project / "sysctl" / "reserve-ports.sh"), "--permanent"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert markers(tmp_path) == [], log.read_text()
    # The values arrived whole.
    text = log.read_text()
    assert f"node 0/1 (NIC {payload}): shell, 1 process(es), master ::1%{payload}:" in text
    if os.geteuid() == 0:
        assert reserve.returncode == 0, reserve.stderr
        assert [p.name for p in (tmp_path / "sysctl.d").iterdir()] == [f"90-{project.name}-ports.conf"]
    else:
        assert reserve.returncode == 1 and "needs root" in reserve.stderr


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_choice_values_are_quoted_too_and_the_preview_as_the_render(payload: str, tmp_path: Path) -> None:
    from wizard.render.project import SHARED_SCRIPT, node_scripts
    from wizard.tui.preview import build_preview

    folder = project_template() / "{{cookiecutter.project_name}}"
    context = to_context(answers(launcher="shell"))
    keys = ("project_name", "host_ips", "master_addr", "nic", "launcher", "device", "cann_set_env")
    context.update(dict.fromkeys(keys, payload))
    shared = template_environment().from_string((folder / SHARED_SCRIPT).read_text())
    texts = [text for _node, text in node_scripts((folder / "launch" / "_node.sh.j2").read_text(), context)]
    texts += [shared.render(cookiecutter=context), build_preview(unchecked(payload), tmp_path).launch_script]
    for index, text in enumerate(texts):
        script = tmp_path / f"script{index}.sh"
        script.write_text(text)
        subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.parametrize("opening", ["{{", "{%", "{#"])
@pytest.mark.parametrize("where", ["output", "project_name"])
def test_template_syntax_in_the_output_path_is_refused_before_cookiecutter_reads_it(
    where: str, opening: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cookiecutter renders the path it writes to as a template: this one would run `touch`.
    closing = {"{{": "}}", "{%": "%}", "{#": "#}"}[opening]
    code = "cycler.__init__.__globals__.os.system('touch " + MARKER + "')"
    payload = f"x{opening} {code} {closing}" if opening != "{%" else f"x{{% set _ = {code} %}}"
    monkeypatch.chdir(tmp_path)
    values = dict(answers().values)
    output = tmp_path / "out"
    if where == "output":
        output = tmp_path / payload
    else:
        values["project_name"] = payload
    with pytest.raises(TargetError, match=f"a path with '{re.escape(opening)}' cannot be rendered into"):
        render(Answers(MappingProxyType(values)), output)
    assert markers(tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_every_value_a_shell_template_writes_goes_through_sh_or_int() -> None:
    folder = project_template() / "{{cookiecutter.project_name}}"
    templates = sorted([*folder.rglob("*.sh"), *folder.rglob("*.sh.j2")])
    assert templates
    bare = []
    for template in templates:
        for number, line in enumerate(template.read_text().splitlines(), 1):
            for expression in re.findall(r"{{-?\s*(.*?)\s*-?}}", line):
                numeric = "|int" in expression.replace(" ", "") or expression in ("node_rank", "loop.index0")
                if not (expression.replace(" ", "").endswith("|sh") or numeric):
                    bare.append(f"{template.relative_to(folder)}:{number}: {{{{ {expression} }}}}")
    assert bare == []
