"""What goes into a bundle: the run folder's files, what the ranks started with, doctor, and this host's NPU tools.

Each `Member` is bounded; every part that is not there is named in the manifest with the reason.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from runtime import stacks
from wizard.bundle.nodes import MEMBER_LIMIT, add_other_nodes
from wizard.bundle.redact import Redactor
from wizard.errors import TargetError
from wizard.monitor.run_files import Read, RunFileError, entries, is_folder, kind_of, read_part, refusal

RUN_FILES = ("run.json", "summary.json", "bandwidth.json", "report.html")
WHY_ABSENT = {
    "summary.json": "the runner writes it when the job ends (still running, or the runner was killed)",
    "bandwidth.json": "written only by npu-wizard run --bandwidth",
    "report.html": "not drawn yet (npu-wizard report RUN, or run --report)",
}
FOLDERS = ("events", "logs", "hang")
ATTEMPT_FOLDERS = ("logs", "hang")  # where the runner keeps a failed attempt's files, in attempt-N/
ATTEMPT_NAME = re.compile(r"attempt-\d+")
HCCL_FOLDER = "hccl"  # torch_npu's flight recorder dumps (launch/run-node.sh points TORCH_HCCL_DEBUG_INFO_* there)
MAX_FILES = 8192  # files of one folder the bundle takes at most
TOTAL_LIMIT = 256 * 1024 * 1024  # bytes of all members together: what is left over is named, not taken
COMMAND_S = 20.0  # seconds one host tool may take
DOCTOR_S = 60.0
PLOGS_PER_PID = 2
PLOG_NAME = re.compile(r"plog-(\d+)_.*\.log$")


@dataclass
class Bundle:
    """The members (name in the archive, bytes) and the manifest's lines."""

    members: list[tuple[str, bytes]] = field(default_factory=list)
    used: int = 0
    included: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    secrets_note: str = ""  # what the manifest says of the job's own secret values

    def add(self, name: str, data: bytes, cut: int | None = None, *, note: str = "", header: bool = True) -> None:
        """Add a member; one cut to its tail (`cut`: the file's whole size) says so in the manifest and, unless
        JSON lines (no `header`), atop."""
        if cut is not None:
            size = cut
            note = f"{note}; " if note else ""
            note += f"the last {len(data)} of {size} bytes (the start left out)"
            if header:
                data = f"[npu-wizard bundle: only the tail of this file, {len(data)} of {size} bytes]\n".encode() + data
        self.members.append((name, data))
        self.used += len(data)
        self.included.append(f"{name} ({len(data)} bytes{'; ' + note if note else ''})")

    def lack(self, name: str, why: str) -> None:
        self.missing.append(f"{name}: {why}")


def collect(run_dir: Path, redactor: Redactor, env: dict[str, str]) -> Bundle:
    """Read everything a bundle of `run_dir` holds (a non-regular file where one is read is refused)."""
    bundle = Bundle()
    checked = _check_folders(run_dir)
    for name in RUN_FILES:
        read = read_part(run_dir / name, MEMBER_LIMIT)
        if read is None:
            bundle.lack(name, WHY_ABSENT.get(name, "not in the run folder"))
        elif name.endswith(".json") and not read.cut:
            bundle.add(name, redactor.json_document(read.data))
        else:
            bundle.add(name, redactor.text(read.data.decode("utf-8", "replace")).encode(), _cut(read))
    for folder in FOLDERS:
        _add_folder(bundle, run_dir, folder, checked[folder], redactor)
    _add_hccl_dumps(bundle, run_dir, redactor)
    started = _started_events(run_dir)
    _add_started(bundle, started, redactor)
    project = _project_of(run_dir)
    _add_answers(bundle, project, redactor)
    _add_doctor(bundle, project, redactor, env)
    here = [event for events in started.values() for event in events if event.get("host") == socket.gethostname()]
    _add_plogs(bundle, here, redactor, env)
    _add_host_tools(bundle, here, redactor, env)
    add_other_nodes(bundle, run_dir, project, started, redactor, env)
    return bundle


def _cut(read: Read) -> int | None:
    """The whole size of a file read only in part, else None."""
    return read.size if read.cut else None


def _check_folders(run_dir: Path) -> dict[str, list[str]]:
    """The regular files of each folder the bundle reads, then those of its attempt-N folders (newest first);
    anything else in one is refused before a byte is read."""
    names = {}
    for folder in FOLDERS:
        found, attempts = [], []
        if is_folder(run_dir / folder):
            for name, mode in entries(run_dir / folder):
                if folder in ATTEMPT_FOLDERS and stat.S_ISDIR(mode) and ATTEMPT_NAME.fullmatch(name):
                    attempts.append(name)
                elif not stat.S_ISREG(mode):
                    raise RunFileError(refusal(run_dir / folder / name, mode))
                else:
                    found.append(name)
        for attempt in sorted(attempts, key=lambda name: -int(name.removeprefix("attempt-"))):
            found += [f"{attempt}/{name}" for name in _regular_files(run_dir / folder / attempt)]
        names[folder] = found
    for name in RUN_FILES:
        try:
            mode = os.lstat(run_dir / name).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            raise RunFileError(refusal(run_dir / name, mode))
    return names


def _regular_files(folder: Path) -> list[str]:
    """The names in `folder`, each a regular file (anything else is refused); one level, never deeper."""
    names = []
    for name, mode in entries(folder):
        if not stat.S_ISREG(mode):
            raise RunFileError(refusal(folder / name, mode))
        names.append(name)
    return names


def _add_folder(bundle: Bundle, run_dir: Path, folder: str, names: list[str], redactor: Redactor) -> None:
    if not names:
        why = {
            "events": "no rank wrote an event (none started)",
            "logs": "no node or rank wrote a log",
            "hang": "no hang stacks or recorder dumps (the run did not hang, or they were not collected)",
        }[folder]
        bundle.lack(f"{folder}/", why)
        return
    left_out = max(0, len(names) - MAX_FILES)
    for index, name in enumerate(names[:MAX_FILES]):
        if bundle.used >= TOTAL_LIMIT:
            left_out = len(names) - index
            break
        read = read_part(run_dir / folder / name, MEMBER_LIMIT)
        if read is None:  # gone since it was listed
            bundle.lack(f"{folder}/{name}", "removed while the bundle was written")
        elif name.endswith((".jsonl", ".json")):
            bundle.add(f"{folder}/{name}", redactor.json_lines(read.data), _cut(read), header=False)
        else:
            bundle.add(f"{folder}/{name}", redactor.text(read.data.decode("utf-8", "replace")).encode(), _cut(read))
    if left_out:
        bundle.lack(
            f"{folder}/",
            f"{left_out} of its {len(names)} files left out (a bundle takes {MAX_FILES} files of a folder and "
            f"{TOTAL_LIMIT // 2**20} MiB in all)",
        )


def _add_hccl_dumps(bundle: Bundle, run_dir: Path, redactor: Redactor) -> None:
    """torch_npu's flight recorder dumps (hccl/rank-R, pickled: bundled as JSON) and Python stacks; not its FIFOs."""
    folder = run_dir / HCCL_FOLDER
    if not is_folder(folder):
        return  # a CPU run, or a torch_npu without the recorder: the launch script made no such folder
    for name, mode in entries(folder)[:MAX_FILES]:
        member = f"{HCCL_FOLDER}/{name}"
        if stat.S_ISFIFO(mode) and name.endswith(".pipe"):
            bundle.lack(member, "torch_npu's pipe that asks a rank for a dump (a FIFO, nothing to bundle)")
            continue
        read = read_part(folder / name, MEMBER_LIMIT) if stat.S_ISREG(mode) else None
        if read is None:
            bundle.lack(member, f"{kind_of(mode) if not stat.S_ISREG(mode) else 'removed'}: left out")
        elif name.endswith("_py_traceback") or read.cut:
            bundle.add(member, redactor.text(read.data.decode("utf-8", "replace")).encode(), _cut(read))
        else:
            try:
                dump = stacks.plain_unpickle(read.data)
            except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as error:
                bundle.lack(member, f"not a dump torch_npu's recorder wrote ({error}): left out")
                continue
            text = json.dumps(dump, default=str).encode()
            bundle.add(f"{member}.json", redactor.json_document(text), note="torch_npu's pickled dump, as JSON")


def _started_events(run_dir: Path) -> dict[int, list[dict]]:
    """Each rank's `started` events (one per start: restarts add more), from the head and tail of its events."""
    found: dict[int, list[dict]] = {}
    for path in sorted((run_dir / "events").glob("rank-*.jsonl")) if (run_dir / "events").is_dir() else []:
        head, tail = read_part(path, MEMBER_LIMIT, head=True), read_part(path, MEMBER_LIMIT)
        lines = (head.data if head else b"").splitlines()
        if head and head.cut and tail:
            lines += tail.data.splitlines()
        for line in dict.fromkeys(lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "started" and isinstance(event.get("rank"), int):
                found.setdefault(event["rank"], []).append(event)
    return dict(sorted(found.items()))


def _add_started(bundle: Bundle, started: dict[int, list[dict]], redactor: Redactor) -> None:
    """Each rank's versions and variables, as its last start recorded them."""
    for name, key in (("versions.json", "versions"), ("environment.json", "environment")):
        last = {rank: events[-1] for rank, events in started.items()}
        per_rank = {f"rank {rank}": event[key] for rank, event in last.items() if isinstance(event.get(key), dict)}
        if per_rank:
            bundle.add(name, (json.dumps(redactor.value(per_rank), indent=2) + "\n").encode())
        else:
            bundle.lack(name, f"no rank's started event records its {key} (no rank started, or an older runtime)")


def _project_of(run_dir: Path) -> Path | None:
    """The project the run folder lies in (PROJECT/runs/RUN, as npu-wizard run makes it); None where it lies in none.

    run.json's `project` is anyone's to write: followed, a crafted one would lend the bundle another project's
    answers (and its doctor, its ssh hosts), so it is never read here.
    """
    run_dir = run_dir.resolve()
    project = run_dir.parent.parent
    return project if run_dir.parent.name == "runs" and (project / "answers.yaml").is_file() else None


def _add_answers(bundle: Bundle, project: Path | None, redactor: Redactor) -> None:
    read = read_part(project / "answers.yaml", MEMBER_LIMIT) if project else None
    if project is None:
        bundle.lack(
            "answers.yaml",
            "the run folder lies in no project folder (PROJECT/runs/RUN with an answers.yaml); "
            "the project run.json names is not taken on its word",
        )
    elif read is None:
        bundle.lack("answers.yaml", "the run's project folder has no answers.yaml")
    else:
        bundle.add("answers.yaml", redactor.text(read.data.decode("utf-8", "replace")).encode(), _cut(read))


def _add_doctor(bundle: Bundle, project: Path | None, redactor: Redactor, env: dict[str, str]) -> None:
    if project is None:
        bundle.lack("doctor.json", "skipped: the run folder lies in no project folder to check")
        return
    ran = _bounded_run([sys.executable, "-m", "wizard", "doctor", str(project), "--json"], DOCTOR_S, env)
    if isinstance(ran, str):
        bundle.lack("doctor.json", f"npu-wizard doctor {project} --json {ran}")
    else:
        bundle.add("doctor.json", redactor.text(ran.decode("utf-8", "replace")).encode())


def _add_plogs(bundle: Bundle, here: list[dict], redactor: Redactor, env: dict[str, str]) -> None:
    """The newest plog files of each rank of this host, by its pid, where CANN writes them."""
    recorded = [e["environment"] for e in here if isinstance(e.get("environment"), dict)]
    named = next((str(v["ASCEND_PROCESS_LOG_PATH"]) for v in recorded if v.get("ASCEND_PROCESS_LOG_PATH")), None)
    # where the ranks wrote (their own variable), else where this shell says, else CANN's default
    root = Path(named or env.get("ASCEND_PROCESS_LOG_PATH") or Path.home() / "ascend" / "log")
    pids = {event.get("pid") for event in here}
    folders = [root / "debug" / "plog", root / "run" / "plog", root / "plog"]
    found: dict[int, list[Path]] = {}
    for folder in folders:
        try:
            listed = entries(folder) if folder.is_dir() and not folder.is_symlink() else []
        except TargetError as error:  # a plog folder this user may not read: said, the rest is bundled
            bundle.lack(f"plog/ ({folder})", str(error))
            continue
        for name, mode in listed:
            match = PLOG_NAME.match(name)
            if match and stat.S_ISREG(mode) and int(match.group(1)) in pids:
                found.setdefault(int(match.group(1)), []).append(folder / name)
    if not found:
        bundle.lack("plog/", f"no plog file of this host's ranks' pids under {root} (debug/plog, run/plog, plog)")
        return
    for _pid, paths in sorted(found.items()):
        for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)[:PLOGS_PER_PID]:
            read = read_part(path, MEMBER_LIMIT)
            if read is not None:
                text = redactor.text(read.data.decode("utf-8", "replace")).encode()
                bundle.add(f"plog/{path.parent.parent.name}-{path.name}", text, _cut(read), note=str(path))


def _add_host_tools(bundle: Bundle, here: list[dict], redactor: Redactor, env: dict[str, str]) -> None:
    """`npu-smi info` and `hccn_tool -i N -link -g / -ip -g` of this host's devices, where the tools are."""
    commands = [("host/npu-smi-info.txt", ["npu-smi", "info"])]
    for device in sorted({_device_id(event) for event in here} - {None}):
        for what in ("link", "ip"):
            commands.append((f"host/hccn_tool-{device}-{what}.txt", ["hccn_tool", "-i", str(device), f"-{what}", "-g"]))
    for tool in ("npu-smi", "hccn_tool"):
        if shutil.which(tool, path=env.get("PATH")) is None:
            bundle.lack(f"host/{tool}", f"{tool} is not on this host's PATH (not an NPU host)")
    for name, argv in commands:
        if shutil.which(argv[0], path=env.get("PATH")) is None:
            continue
        ran = _bounded_run(argv, COMMAND_S, env)
        if isinstance(ran, str):
            bundle.lack(name, f"{' '.join(argv)} {ran}")
        else:
            bundle.add(name, redactor.text(ran.decode("utf-8", "replace")).encode(), note=" ".join(argv))


def _device_id(event: dict) -> int | None:
    """The NPU of a rank: its device label npu:N, else its local rank."""
    match = re.fullmatch(r"npu:(\d+)", str(event.get("device", "")))
    if match:
        return int(match.group(1))
    local = event.get("local_rank")
    return local if isinstance(local, int) and local >= 0 else None


def _bounded_run(argv: list[str], timeout: float, env: dict[str, str]) -> bytes | str:
    """The output (stdout then stderr, the last MEMBER_LIMIT bytes) of `argv`, or why there is none."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"did not answer within {timeout:.0f} s (stopped)"
    except OSError as error:
        return f"could not start: {error.strerror or error}"
    output = (done.stdout + done.stderr)[-MEMBER_LIMIT:]
    return output if output else f"exited {done.returncode} and said nothing"
