"""The CRD schemas the manifest tests validate against travel with the repository.

A clone that has nothing beside it (no ../shared/k8s, no $NPU_WIZARD_K8S_CRDS)
must run the Kubernetes schema tests, not skip them: a copy of tests/ in a
folder of its own runs two of them for real in a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.kube_schemas import CRD_FILES, ROOT, load_all

SCHEMAS = ROOT / "tests" / "k8s_schemas"


def test_the_crd_schemas_and_their_source_are_in_the_repository() -> None:
    readme = (SCHEMAS / "README.md").read_text()
    for kind, name in CRD_FILES.items():
        (document,) = load_all(SCHEMAS / name)
        assert document["spec"]["names"]["kind"] == kind
        assert name in readme
    assert "Kubeflow Training Operator v1.9.0" in readme
    assert "ascend-operator" in readme


def test_a_clone_with_nothing_beside_it_runs_the_schema_tests(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "tests", clone / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", clone / "pyproject.toml")
    assert not any((parent / "shared" / "k8s").exists() for parent in clone.parents)
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "NPU_WIZARD_K8S_CRDS")}
    selected = "test_a_broken_manifest_fails_the_same_check and misspelt and pod"

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rs"]
        + ["tests/test_k8s_manifests.py", "-k", selected],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )

    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "2 passed" in output and "skipped" not in output, output
