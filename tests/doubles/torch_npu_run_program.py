"""torch_npu_run of the torch_npu test double (installed beside it by tests/doubles/torch_npu_double.py).

It parses its argv with torchrun's flags as the installed torch defines them,
read from `torchrun_flags.json`: a copy of `get_args_parser()`'s actions that
the double recorded from that torch when it was installed, so that a call
which only records costs no `import torch` (about 2 CPU seconds a call). The
release adds `--enable_tiered_parallel_tcpstore` on the 7.0.0 branches on; a
release built for torch 2.1 knows only torch 2.1's flags. An unknown flag exits
2 with argparse's "unrecognized arguments", as the release would. With
`TORCH_NPU_DOUBLE_RUN=torchrun` the workers then run through the real torchrun,
parsed again by torch's own parser; so is a command line using a flag of a kind
the copy does not rebuild (`--print-completion`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

# torchrun's options in torch 2.1 (torch/distributed/run.py of 2.1.2): a release built for
# torch 2.1 rejects the options later torch added, even when a newer torch runs the double.
TORCHRUN_2_1_OPTIONS = frozenset(
    """-h --help --nnodes --nproc-per-node --nproc_per_node --rdzv-backend --rdzv_backend
    --rdzv-endpoint --rdzv_endpoint --rdzv-id --rdzv_id --rdzv-conf --rdzv_conf --standalone
    --max-restarts --max_restarts --monitor-interval --monitor_interval --start-method
    --start_method --role -m --module --no-python --no_python --run-path --run_path --log-dir
    --log_dir -r --redirects -t --tee --node-rank --node_rank --master-addr --master_addr
    --master-port --master_port --local-addr --local_addr""".split()
)
TIERED_FLAG = "--enable_tiered_parallel_tcpstore"


def comma_separated_list(value: str) -> list[str]:
    """torchrun's list type: items split at ",", a doubled ",," standing for a comma."""
    return [item.replace("\0", ",") for item in value.replace(",,", "\0").split(",")]


TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "comma_separated_list": comma_separated_list}


class UseTorchsParser(Exception):
    """A command line used a flag the recorded copy cannot replay; torch's own parser takes it."""


class Unreplayable(argparse.Action):
    """A flag of a kind the copy does not rebuild (--print-completion): using it hands over to torch's parser."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        raise UseTorchsParser(option_string)


class FromEnv(argparse.Action):
    """torch's `env` action: the value from PET_<DEST> before the default."""

    def __init__(self, dest: str, default: Any = None, required: bool = False, **kwargs: Any) -> None:
        default = os.environ.get(f"PET_{dest.upper()}", default)
        super().__init__(dest=dest, default=default, required=required and not default, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)


class FlagFromEnv(argparse.Action):
    """torch's `check_env` action: a flag, set also by a non-zero PET_<DEST>."""

    def __init__(self, dest: str, default: bool = False, **kwargs: Any) -> None:
        kwargs.pop("nargs", None)
        kwargs.pop("const", None)
        default = bool(int(os.environ.get(f"PET_{dest.upper()}", "1" if default else "0")))
        super().__init__(dest=dest, const=True, default=default, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)


def _kept(flags: dict[str, Any], release: dict[str, Any]) -> list[dict[str, Any]]:
    """The recorded actions this release accepts (a torch 2.1 release: only torch 2.1's options)."""
    actions = flags["actions"]
    if not release["torch"].startswith("2.1."):
        return actions
    kept = []
    for action in actions:
        options = [option for option in action["options"] if option in TORCHRUN_2_1_OPTIONS]
        if action["options"] and not options:
            continue
        kept.append({**action, "options": options})
    return kept


def recorded_parser(flags: dict[str, Any], release: dict[str, Any]) -> argparse.ArgumentParser:
    """torchrun's parser rebuilt from the recorded actions, with this release's own flag."""
    parser = argparse.ArgumentParser(
        prog="torch_npu_run", description=flags["description"], allow_abbrev=flags["allow_abbrev"], add_help=False
    )
    for action in _kept(flags, release):
        names = action["options"] or [action["dest"]]
        kind = action["kind"]
        shown = {"help": action["help"], "metavar": action["metavar"]}
        if kind == "help":
            parser.add_argument(*names, action="help", help=action["help"])
            continue
        if kind == "check_env":
            parser.add_argument(
                *names, dest=action["dest"], action=FlagFromEnv, default=action["default"], help=action["help"]
            )
            continue
        settings: dict[str, Any] = {"nargs": action["nargs"], "choices": action["choices"], **shown}
        if action["type"] is not None and kind != "other":
            settings["type"] = TYPES[action["type"]]
        if action["options"]:
            settings["dest"] = action["dest"]
            settings["required"] = action["required"]
        if kind == "env":
            parser.add_argument(*names, action=FromEnv, default=action["default"], **settings)
        elif kind == "store":
            parser.add_argument(*names, default=action["default"], **settings)
        else:  # it takes its values the same way; what it does with them is torch's to say
            parser.add_argument(*names, action=Unreplayable, default=action["default"], **settings)
    if release["tiered_store_flag"]:
        parser.add_argument(TIERED_FLAG, action=FromEnv, type=str, default="false")
    return parser


def torch_parser(release: dict[str, Any]) -> Any:
    """The installed torch's own torchrun parser for this release (imports torch)."""
    from torch.distributed import run as torch_run
    from torch.distributed.argparse_util import env

    parser = torch_run.get_args_parser()
    parser.prog = "torch_npu_run"
    if release["torch"].startswith("2.1."):
        for action in list(parser._actions):
            later = [option for option in action.option_strings if option not in TORCHRUN_2_1_OPTIONS]
            for option in later:
                parser._option_string_actions.pop(option, None)
            if later and len(later) == len(action.option_strings):
                parser._remove_action(action)
                for group in parser._action_groups:
                    if action in group._group_actions:
                        group._group_actions.remove(action)
            else:
                action.option_strings = [option for option in action.option_strings if option not in later]
    if release["tiered_store_flag"]:
        parser.add_argument(TIERED_FLAG, action=env, type=str, default="false")
    return parser


def _record(name: str, entry: dict[str, Any]) -> None:
    folder = os.environ.get("TORCH_NPU_DOUBLE_RECORD")
    if folder:
        with open(Path(folder) / f"{name}.jsonl", "a") as file:
            file.write(json.dumps(entry, default=repr) + "\n")


def main(root: str, argv: list[str] | None = None) -> int:
    """torch_npu_run of the release installed at `root`: its flags, then record (or run torchrun)."""
    release = json.loads((Path(root) / "site" / "torch_npu" / "release.json").read_text())
    flags = json.loads((Path(root) / "torchrun_flags.json").read_text())
    if "error" in flags:
        print(f"torch_npu_run (test double): {flags['error']}", file=sys.stderr)
        return 1
    argv = sys.argv[1:] if argv is None else argv
    try:
        try:
            args = recorded_parser(flags, release).parse_args(argv)
        except UseTorchsParser:
            args = torch_parser(release).parse_args(argv)
    except SystemExit as leaving:
        _record("torch_npu_run.rejected", {"argv": argv, "version": release["version"], "code": leaving.code})
        raise
    worker_env = {"TORCH_NPU_ELASTIC_USE_AGENT_STORE": "True"}
    if release["parallel_store_env"]:
        worker_env["TORCH_NPU_USE_PARALLEL_TCPSTORE"] = "True"
    if release["tiered_store_flag"] and release["parallel_store_env"]:
        worker_env["ENABLE_TIERED_PARALLEL_TCPSTORE"] = str(args.enable_tiered_parallel_tcpstore)
    _record(
        "torch_npu_run",
        {"argv": argv, "env": dict(os.environ), "version": release["version"], "worker_env": worker_env},
    )
    if os.environ.get("TORCH_NPU_DOUBLE_RUN") != "torchrun":
        return 0
    from torch.distributed import run as torch_run

    for name, value in worker_env.items():
        os.environ.setdefault(name, value)
    torch_run.run(torch_parser(release).parse_args(argv))
    return 0
