"""Offline checks of Kubernetes manifests: CRD schemas with jsonschema, core kinds with kubernetes-validate.

No API server can run here, so a manifest is checked the two ways that need
none: an AscendJob or PyTorchJob against its CustomResourceDefinition's
openAPIV3Schema (the CRDs are test data in the repository, tests/k8s_schemas/,
their source and version in its README), and core kinds (ConfigMap, and each
job's pod template as a Pod) against the Kubernetes schemas that
kubernetes-validate bundles.

The CRD schemas leave unknown fields open, and an API server silently drops
(prunes) a field its schema does not name: a misspelt field would pass
jsonschema and then vanish on the cluster. `strict` closes every object the
schema describes, so such a field is an error here.
"""

from __future__ import annotations

import copy
import functools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "tests" / "k8s_schemas"
CRD_FILES = {"AscendJob": "ascendjob-crd.yaml", "PyTorchJob": "pytorchjob-crd.yaml"}
# The oldest and newest Kubernetes releases kubernetes-validate bundles that clusters run today.
KUBERNETES_VERSIONS = ("1.25", "1.33")


def crd_dir() -> Path:
    """The folder with the CRDs: $NPU_WIZARD_K8S_CRDS (other operator releases), else tests/k8s_schemas/."""
    named = os.environ.get("NPU_WIZARD_K8S_CRDS")
    folder = Path(named) if named else SCHEMA_DIR
    missing = [name for name in CRD_FILES.values() if not (folder / name).is_file()]
    if missing:
        # never a skip: the schemas are part of the repository, so a missing one is a broken checkout or setting
        where = "$NPU_WIZARD_K8S_CRDS" if named else "the repository"
        pytest.fail(f"the CRD schemas {', '.join(missing)} are not in {folder} ({where})")
    return folder


@functools.cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The openAPIV3Schema of a custom kind, closed against unknown fields."""
    (document,) = load_all(crd_dir() / CRD_FILES[kind])
    assert document["spec"]["names"]["kind"] == kind
    (version,) = [v for v in document["spec"]["versions"] if v.get("storage", True)]
    return strict(version["schema"]["openAPIV3Schema"])


def strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the schema in which every described object refuses fields it does not name."""
    closed = copy.deepcopy(dict(schema))
    for node in _schemas(closed):
        if (
            "properties" in node
            and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")
        ):
            node["additionalProperties"] = False
    return closed


def _schemas(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _schemas(value)


def problems(manifest: Mapping[str, Any]) -> list[str]:
    """Every schema problem of one manifest, as 'path: message'; empty when it validates."""
    kind = manifest.get("kind")
    if kind in CRD_FILES:
        validator = jsonschema.Draft4Validator(crd_schema(kind))
        found = [f"{_path(e.absolute_path)}: {e.message}" for e in validator.iter_errors(dict(manifest))]
        for where, template in pod_templates(manifest):
            found += [f"{where}.{problem}" for problem in core_problems(as_pod(template))]
        return found
    return core_problems(manifest)


def core_problems(manifest: Mapping[str, Any]) -> list[str]:
    """Problems of a core kind against every bundled Kubernetes release we check, strict about unknown fields."""
    found = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(dict(manifest), version, strict=True)
        except kubernetes_validate.ValidationError as error:
            found.append(f"{_path(error.absolute_path)}: {error.message} (Kubernetes {version})")
    return found


def pod_templates(manifest: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each replica's pod template of a training job, with where it sits."""
    spec = manifest.get("spec") or {}
    key = "replicaSpecs" if "replicaSpecs" in spec else "pytorchReplicaSpecs"
    return [
        (f"spec.{key}.{role}.template", replica["template"])
        for role, replica in (spec.get(key) or {}).items()
        if isinstance(replica, dict) and "template" in replica
    ]


def as_pod(template: Mapping[str, Any]) -> dict[str, Any]:
    """A pod template as the Pod the operator would create from it."""
    metadata = {"name": "check", **(template.get("metadata") or {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template.get("spec") or {}}


def load_all(path: Path) -> list[dict[str, Any]]:
    """Every document of a YAML file."""
    # libyaml: a ConfigMap of a whole project reads 40x faster, a CRD (half a megabyte of YAML) 10x
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [document for document in yaml.load_all(path.read_text(), Loader=loader) if document is not None]


def _path(parts: Any) -> str:
    return ".".join(str(part) for part in parts) or "(top)"
