"""The sandbox protocol and the types both backends share. Where the agent's commands run: a local
temporary directory (`local_backend.py`) or a Docker container (`docker_backend.py`).

Both backends give the tools in `tools.py` the same five primitives, so the tools, their observation strings
and the grading are one code path:

    exec(argv, timeout) -> ExecResult     run a program as the agent, in the repository, with limits
    read_file(path) / write_file(path)    bytes in and out, with the agent's permissions
    path_kind(path)                       "file" | "dir" | "missing" | "other"
    run_tests(timeout, key) -> TestRun    copy the hidden tests in, run them, return the log (and, with a key,
                                          the signed report of `report_launcher.py`, which ran pytest)

How one command runs (both backends). Every command goes through `SUPERVISOR` (`supervisor.py`), a small Python
program run inside the sandbox: it forks the command into a fresh process group, applies rlimits in the child just
before exec, kills the whole group with SIGKILL at the deadline (exit code 124, as `timeout` would give), and, when
the command returns, kills whatever the command left running in its group; in a container, where the agent's user
owns nothing else, it then kills every remaining process of that user as well (found through /proc, since kill(-1)
reports success even when it may signal nothing). Why not plain `timeout`: a fork bomb or `sleep 100 &` returns at
once and leaves its children behind; they then hold the pids limit or the output stream and wedge every later
command (seen in testing). So every tool call is hermetic: background processes do not outlive the command that
started them (R2E-Gym's bash tool already refuses `nohup`). Locally a process that escapes with `setsid` survives
the command (see `local_backend.py`). The host enforces the deadline a second time (timeout + `host_grace_s`) in
case the agent kills its supervisor, and it stops a command whose output passes `max_output_bytes` (a flood of `yes`
would otherwise cost host CPU for the whole timeout); the stream is drained to its end either way, since an unread
exec stream stalls the engine. Output is kept as head + tail bytes (`capture_bytes`), never all of it.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class SandboxError(RuntimeError):
    """The sandbox could not be created or stopped working (not the agent's fault)."""


class SandboxFileError(OSError):
    """A file operation the agent asked for failed (missing file, permission denied, outside the sandbox)."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did."""

    stdout: bytes
    stderr: bytes
    exit_code: int
    """The command's exit status; 124 when it hit its deadline; -1 when the host had to stop it."""
    timed_out: bool = False
    """The deadline passed (inside the sandbox or on the host)."""
    output_limited: bool = False
    """The output passed `max_output_bytes` and the command was stopped."""
    duration_s: float = 0.0


@dataclass(frozen=True)
class TestRun:
    """What grading's test run gave: its log, the launcher's signed report when pytest ran through it (None
    otherwise, or when the report could not be read), and what grading saw of the agent's changes
    (`workdiff.GradingPlan`, `tamper.scan_changes`)."""

    __test__ = False  # not a pytest test class

    log: ExecResult
    report: bytes | None = None
    launcher: bool = False
    """Whether pytest ran through the report launcher (False: no key was given, or the row's test script does not
    run `python -m pytest`, so only the log can be read)."""
    changes: dict | None = None
    """`GradingPlan.summary()`: counts of the agent's changes, the test infrastructure restored, what was left out."""
    changed: tuple[str, ...] = ()
    """Every path of the repository the agent added, changed or removed."""
    flags: tuple[str, ...] = ()
    """Static tamper flags of the agent's changes."""


REPORT_MAX_BYTES = 16 * 1024**2
"""Most bytes of the launcher's report read back; past it the report is cut, its last line fails its signature and
the reading is refused."""


class Sandbox(Protocol):
    """What the tools need from a backend."""

    repo_dir: str

    def exec(self, argv: Sequence[str], timeout: float) -> ExecResult: ...

    def read_file(self, path: str) -> bytes: ...

    def write_file(self, path: str, data: bytes) -> None: ...

    def path_kind(self, path: str) -> str: ...


class OutputCapture:
    """Keeps the first and last `limit // 2` bytes of a stream and counts what it dropped in between."""

    def __init__(self, limit: int):
        if limit < 2:
            raise ValueError(f"capture limit must be at least 2 bytes, got {limit}")
        self.half = limit // 2
        self.head = bytearray()
        self.tail: collections.deque[bytes] = collections.deque()
        self.tail_size = 0
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        while self.tail_size - len(self.tail[0]) >= self.half:
            self.tail_size -= len(self.tail.popleft())

    def value(self) -> bytes:
        tail = b"".join(self.tail)[-self.half :] if self.tail else b""
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return bytes(self.head) + tail
        return bytes(self.head) + f"\n<... {dropped} bytes of output omitted ...>\n".encode() + tail


def rlimit_spec(limits: dict[str, int]) -> str:
    """{"cpu": 10, "as": 2**30} -> "cpu=10,as=1073741824" (the supervisor's second argument)."""
    return ",".join(f"{name}={int(value)}" for name, value in limits.items())
