"""NPU_WIZARD_REHEARSE: a documented rehearsal of a hang or a compile failure, and no test-only hook shipped.

Issue 36 item 33: the ranks read NPU_WIZARD_TEST_HANG, ..._TEST_STATUS_BUFFER and ..._TEST_COMPILE_FAILS in
every user's project. The hangs and the compile failure became a rehearsal a user may run (docs/rehearse.md);
the status buffer size, which only a test needs, is a test double (tests/doubles/small_socket_buffers/).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import rehearsal
from tests.factories import answers
from wizard.cli import main
from wizard.render.render import render

REPO = Path(__file__).resolve().parent.parent


def test_a_rehearsal_plans_each_ranks_hangs_and_the_compile_failure() -> None:
    value = "hang:*:4:data, hang:3:10 ,hang:1:16:barrier,compile-fails,release=/tmp/go"
    env = {rehearsal.ENV_REHEARSE: value}
    assert rehearsal.planned({**env, "RANK": "3"}) == rehearsal.Hangs({4: "data", 10: "sleep"}, Path("/tmp/go"))
    assert rehearsal.planned({**env, "RANK": "1"}).at == {4: "data", 16: "barrier"}
    assert rehearsal.compile_fails(env) and not rehearsal.compile_fails({})
    assert rehearsal.planned({"RANK": "0"}) is None
    assert rehearsal.planned({rehearsal.ENV_REHEARSE: "hang:2:5", "RANK": "0"}) is None


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("hang:x:3", "RANK is a rank's number (from 0) or * for every rank"),
        ("hang:1:0", "STEP is a step of the rank, from 1"),
        ("hang:1:3:nap", "HOW is one of sleep, barrier, data"),
        ("hang:1", "expected hang:RANK:STEP or hang:RANK:STEP:HOW"),
        ("1:3:sleep", "expected hang:RANK:STEP[:sleep|barrier|data], compile-fails or release=FOLDER"),
    ],
)
def test_a_value_that_is_no_rehearsal_is_refused_in_one_line_saying_what_is_allowed(value: str, why: str) -> None:
    with pytest.raises(rehearsal.RehearsalError) as refused:
        rehearsal.parse(value)
    assert str(refused.value).startswith(f"NPU_WIZARD_REHEARSE: {value!r} is no rehearsal: {why}")
    assert str(refused.value).endswith("(see docs/rehearse.md)") and "\n" not in str(refused.value)


def test_run_refuses_a_bad_rehearsal_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    project = render(answers(), tmp_path).project_dir
    monkeypatch.setenv(rehearsal.ENV_REHEARSE, "hang:1:3:nap")
    assert main(["run", str(project), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "NPU_WIZARD_REHEARSE: 'hang:1:3:nap' is no rehearsal: HOW is one of sleep, barrier, data" in err
    assert err.rstrip().endswith("; nothing was started") and not (project / "runs").exists()


def test_the_rehearsal_is_documented_in_docs_and_in_run_help(capsys: pytest.CaptureFixture[str]) -> None:
    text = (REPO / "docs" / "rehearse.md").read_text()
    for item in ("hang:RANK:STEP", ":sleep", ":barrier", ":data", "compile-fails", "release=FOLDER"):
        assert item in text
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "NPU_WIZARD_REHEARSE" in " ".join(capsys.readouterr().out.split())


def test_a_rendered_project_ships_no_test_only_name(tmp_path: Path) -> None:
    project = render(answers(), tmp_path).project_dir
    shipped = [path for path in project.rglob("*") if path.is_file()]
    assert [p for p in shipped if "NPU_WIZARD_TEST_" in p.read_text(errors="replace")] == []
    assert [p for p in shipped if "test-only" in p.read_text(errors="replace").lower()] == []
    assert (project / "runtime" / "rehearsal.py").is_file()
