"""`run.restarts`: the answers' default for `npu-wizard run --restarts` (and the Kubernetes operators' retries)."""

from __future__ import annotations

import pytest
import yaml

from tests.factories import answers
from wizard.answers.model import dump, load_text
from wizard.errors import AnswersError


def test_restarts_default_to_0_and_are_recorded_in_their_own_section() -> None:
    assert answers()["run.restarts"] == 0
    given = load_text("project_name: demo\nrun:\n  restarts: 3\n")

    assert given["run.restarts"] == 3
    assert yaml.safe_load(dump(given))["run"] == {"restarts": 3, "python": None}  # run.python: run's own


@pytest.mark.parametrize(("value", "message"), [(-1, "must be at least 0"), (1001, "must be at most 1000")])
def test_restarts_outside_0_to_1000_are_refused(value: int, message: str) -> None:
    with pytest.raises(AnswersError) as refused:
        load_text(f"project_name: demo\nrun:\n  restarts: {value}\n")
    assert [(p.field, p.message) for p in refused.value.problems] == [("run.restarts", message)]
