"""Random and corrupted answers files never crash with a traceback and never write a thing."""

from __future__ import annotations

import contextlib
import io
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wizard.answers.questions import QUESTIONS
from wizard.cli import main

EXAMPLE = (Path(__file__).parent.parent / "examples" / "cpu-demo.yaml").read_text()
KEYS = [q.name.rsplit(".", 1)[-1] for q in QUESTIONS] + ["schema", "network", "training", "environment", "nodez"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["off", "fp16", "bf16", "cpu", "npu", "torchrun", "shell", "127.0.0.1", "::1", "{{ 7*7 }}", "-"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12,
)
documents = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=10), values, max_size=10)


def check_answers_text(text: str) -> None:
    """Run `npu-wizard --answers FILE -o OUT` in-process and check its outcome is clean."""
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        answers_file = scratch / "a.yaml"
        answers_file.write_text(text, encoding="utf-8", errors="surrogatepass")
        out = scratch / "out"
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            code = main(["--answers", str(answers_file), "-o", str(out)])
        assert_clean_outcome(code, out)
    finally:
        shutil.rmtree(scratch)


def assert_clean_outcome(code: int, out: Path) -> None:
    """Either a complete project (exit 0) or an input error with nothing written (exit 1)."""
    assert code in (0, 1)
    if code == 1:
        assert not out.exists()
    else:
        projects = list(out.iterdir())
        assert len(projects) == 1 and (projects[0] / "answers.yaml").is_file()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_answer_documents(document: dict) -> None:
    import yaml

    check_answers_text(yaml.safe_dump(document, allow_unicode=True))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_example_files(data: st.DataObject) -> None:
    text = EXAMPLE
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        position = data.draw(st.integers(min_value=0, max_value=len(text)))
        action = data.draw(st.sampled_from(["delete", "insert", "replace"]))
        chunk = data.draw(st.text(min_size=1, max_size=4))
        if action == "delete":
            text = text[:position] + text[position + len(chunk) :]
        elif action == "insert":
            text = text[:position] + chunk + text[position:]
        else:
            text = text[:position] + chunk + text[position + len(chunk) :]
    check_answers_text(text)
