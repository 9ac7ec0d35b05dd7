"""Small factories for answers used across the tests."""

from __future__ import annotations

from typing import Any

import yaml

from wizard.answers.model import Answers, resolve


def answers(**overrides: Any) -> Answers:
    """Valid CPU answers (1 node x 2 processes) with dotted-name overrides."""
    raw: dict[str, Any] = {
        "project_name": "demo",
        "device": "cpu",
        "nodes": 1,
        "devices_per_node": 2,
        "launcher": "torchrun",
        "amp": "off",
    }
    raw.update({name.replace("__", "."): value for name, value in overrides.items()})
    return resolve(raw)


def answers_yaml(document: dict[str, Any]) -> str:
    """An answers file's text from a nested mapping."""
    return yaml.safe_dump({"schema": 1, **document}, sort_keys=False)
