"""The compiled training step (training.compile): compiled where it can be, eager where not.

On the CPU and CUDA the step compiles with torch.compile's own backend;
reduce-overhead adds CUDA graphs on CUDA (the CPU has none to add). On an NPU
the backend is torch_npu's graph backend TorchAir (`import torchair` finds the
copy inside torch_npu): default is its Ascend IR graph mode (max-autotune),
reduce-overhead its aclgraph capture mode. TorchAir compiles the backward with
the same compiler as the forward; aclgraph captures no backward and no random
ops. TorchAir is documented as a beta aimed at inference, and on the 26.x
releases reduce-overhead through its `mode` option is deprecated in favour of
the `npugraph_ex` backend.

torch.compile is lazy: a model that cannot compile fails at its first call,
not at torch.compile, and its backward (compiled by TorchAir too) at the first
`backward`; a new input shape compiles again at a later call. So every call is
a test until one fails: then the same inputs run eagerly (forward and, from
`backward`, backward too), and so does every later step, said in one line. An
error of the model itself fails the eager call too, and is raised from there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from . import events, rehearsal

MODES = ("off", "default", "reduce-overhead")


class CompiledStep:
    """Calls `step` compiled for `mode`; eager when compiling it failed."""

    def __init__(self, step: Callable[..., Any], mode: str, device_type: str) -> None:
        _check(mode)
        self.eager = step
        self.mode = mode
        self.device_type = device_type
        self.fallback: str | None = None  # why a step asked to compile runs eagerly
        self._backward_proven = False  # a backward of the compiled step has run once
        self._compiled: Callable[..., Any] | None = None
        if mode != "off":
            try:
                self._compiled = torch.compile(
                    step, **compile_options(mode, device_type)
                )
            # no backend for this mode in the installed torch_npu (ImportError, ValueError),
            # or no dynamo for this Python in the installed torch (RuntimeError)
            except (ImportError, AttributeError, ValueError, RuntimeError) as error:
                self._fall_back(error)

    @property
    def compiled(self) -> bool:
        """Whether steps run compiled (so far)."""
        return self._compiled is not None

    def __call__(self, *args: Any) -> Any:
        """Run one step."""
        if self._compiled is None:
            return self.eager(*args)
        _mark_step(self.mode, self.device_type)
        try:
            return self._compiled(*args)
        # compilers fail with errors of many types (dynamo's, inductor's, a C++ compiler's, TorchAir's),
        # at the first call or at a recompile for new shapes; a model's own error fails the eager call too
        except Exception as error:  # noqa: BLE001
            self._fall_back(error)
            return self.eager(*args)

    def backward(
        self,
        loss: Any,
        backward: Callable[[Any], None],
        forward_again: Callable[[], Any],
    ) -> Any:
        """Run `backward(loss)`; where the first compiled one fails, `forward_again()` (eager now) and its backward."""
        if self._compiled is None or self._backward_proven:
            backward(loss)
            return loss
        try:
            backward(loss)
        # TorchAir compiles the backward at the first backward: it fails there as the forward can
        except Exception as error:  # noqa: BLE001
            self._fall_back(error)
            loss = forward_again()
            backward(loss)
            return loss
        self._backward_proven = True
        return loss

    def _fall_back(self, error: BaseException) -> None:
        # dynamo wraps the backend's own error (BackendCompilerFailed): name that one
        inner = getattr(error, "inner_exception", None) or error.__cause__
        while isinstance(inner, BaseException):
            error = inner
            inner = getattr(error, "inner_exception", None) or error.__cause__
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        self.fallback = f"{type(error).__name__}: {first_line}"
        self._compiled = None
        events.warn(
            f"training.compile {self.mode}: the step did not compile on {self.device_type} "
            f"({self.fallback}); training eagerly",
            "compile",
        )


def compile_options(mode: str, device_type: str) -> dict[str, Any]:
    """The keyword arguments of torch.compile for `mode` on `device_type`."""
    _check(mode)
    if rehearsal.compile_fails():
        return {"backend": _failing_backend}
    if device_type == "npu":
        return {"backend": npu_backend(mode)}
    return {} if mode == "default" else {"mode": mode}


def npu_backend(mode: str) -> Any:
    """TorchAir's backend: Ascend IR graphs for default, aclgraph capture for reduce-overhead."""
    from . import device

    device.torch_npu_module()  # torch_npu makes `import torchair` find its own copy
    import torchair

    config = torchair.CompilerConfig()
    if mode == "reduce-overhead":
        # the 6.0.0 branches' TorchAir has no `mode` option: ValueError
        config.mode = "reduce-overhead"
    return torchair.get_npu_backend(compiler_config=config)


def _mark_step(mode: str, device_type: str) -> None:
    # CUDA graph trees keep a step's outputs until told a new step begins
    if mode == "reduce-overhead" and device_type == "cuda":
        mark = getattr(torch.compiler, "cudagraph_mark_step_begin", None)
        if mark is not None:
            mark()


def _failing_backend(graph: Any, example_inputs: Any) -> Any:
    raise RuntimeError(
        f"this backend always fails ({rehearsal.ENV_REHEARSE}={rehearsal.COMPILE_FAILS}, a rehearsal)"
    )


def _check(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(
            f"training.compile {mode!r}: expected one of {', '.join(MODES)}"
        )
