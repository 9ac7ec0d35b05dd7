"""Test double of TorchAir, torch_npu's graph backend (installed as `torchair` beside the torch_npu double).

No NPU exists on the test machine. The real torch_npu ships TorchAir inside
itself (`torch_npu/dynamo/torchair`, from the Ascend/pytorch branches of
CANN 8.0.0 on) and makes `import torchair` find it. This double keeps the
part the generated train.py uses: `CompilerConfig`, whose `mode` option
("max-autotune" or "reduce-overhead") exists only from the 7.0.0 branches
(an unknown option raises ValueError, as TorchAir's NpuBaseConfig does), and
`get_npu_backend(compiler_config=...)`, whose backend records each graph it is
given and runs it as it is. Each call is one JSON line in torchair.jsonl under
$TORCH_NPU_DOUBLE_RECORD.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

RELEASE: dict[str, Any] = json.loads(Path(__file__).with_name("release.json").read_text())
MODES = ("max-autotune", "reduce-overhead")


def _record(entry: dict[str, Any]) -> None:
    folder = os.environ.get("TORCH_NPU_DOUBLE_RECORD")
    if folder:
        with open(Path(folder) / "torchair.jsonl", "a") as file:
            file.write(json.dumps(entry, default=repr) + "\n")


class CompilerConfig:
    """TorchAir's compiler configuration: `mode` from the 7.0.0 branches on, nothing else modelled."""

    def __init__(self) -> None:
        options = {"mode": "max-autotune"} if RELEASE["torchair_reduce_overhead"] else {}
        object.__setattr__(self, "_options", options)

    def __getattr__(self, key: str) -> Any:
        options = object.__getattribute__(self, "_options")
        if key not in options:
            raise AttributeError(key)
        return options[key]

    def __setattr__(self, key: str, value: Any) -> None:
        if key not in self._options:
            raise ValueError(f"CompilerConfig has no option {key}, all options {sorted(self._options)}")
        if value not in MODES:
            raise ValueError(f"Value {value!r} is not in the optional values {list(MODES)}")
        self._options[key] = value


def get_npu_backend(*, compiler_config: CompilerConfig | None = None, custom_decompositions: Any = None) -> Any:
    """A torch.compile backend that records the mode and each graph, then runs the graph as it is."""
    config = compiler_config if compiler_config is not None else CompilerConfig()
    mode = config._options.get("mode", "max-autotune")
    _record({"call": "get_npu_backend", "mode": mode})

    def npu_backend(graph: Any, example_inputs: list[Any]) -> Callable[..., Any]:
        _record({"call": "compile", "mode": mode, "inputs": len(example_inputs)})
        return graph.forward

    return npu_backend
