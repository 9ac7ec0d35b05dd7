"""RANK_TABLE_FILE: where it is set and readable, torch_npu initialises HCCL from that rank table.

Then HCCL_IF_IP and the HCCL port plan the launch script sets do not govern the
global communicator, and a spare host, which is in no table, cannot take a
node's place. The launch scripts keep the variable (a cluster that hands out
rank tables means it); the preflight and doctor say what it changes, and refuse
it on a spare host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .checks import FAIL, PASS, WARN, Result

NAME = "rank table"
VARIABLE = "RANK_TABLE_FILE"
IGNORED = "HCCL_IF_IP and the HCCL port plan (HCCL_IF_BASE_PORT, HCCL_HOST_SOCKET_PORT_RANGE, HCCL_NPU_SOCKET_PORT_RANGE)"


def check_rank_table(env: Mapping[str, str], *, spare: bool = False) -> Result:
    """Whether RANK_TABLE_FILE switches torch_npu to rank-table init; FAIL where `spare` hosts would take part."""
    path = env.get(VARIABLE, "")
    if not path:
        return Result(
            NAME,
            PASS,
            f"{VARIABLE} unset: HCCL follows npu-wizard's addresses and ports",
        )
    if not os.access(path, os.R_OK):
        return Result(
            NAME,
            WARN,
            f"{VARIABLE}={path} is set but cannot be read: torch_npu ignores it",
            f"unset {VARIABLE}",
        )
    said = f"{VARIABLE}={path}: torch_npu initialises HCCL from this rank table, so {IGNORED} do not govern the job's communicator"
    if spare:
        return Result(
            NAME,
            FAIL,
            f"{said}; a spare host is not in the rank table",
            f"unset {VARIABLE} where spare hosts may take a node's place",
        )
    return Result(
        NAME,
        WARN,
        said,
        f"unset {VARIABLE} to use npu-wizard's plan, or keep the table in line with the hosts",
    )
