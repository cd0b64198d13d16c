"""The local backend: the task's repository fixture copied to a temporary directory, commands as subprocesses.

The same tools as in a container, on a copy of the fixture repository in a temporary directory, as subprocesses
of this Python with the supervisor's rlimits (CPU seconds, address space, file size, no core files; the number of
processes only when not root, where RLIMIT_NPROC is not enforced and counts all of the user's processes).
The rlimits are set by the supervisor in the child rather than with `preexec_fn`, which is unsafe in a
threaded program (the trainer is one). `file_editor` is confined to the episode's directory; `execute_bash` is
not. THE LOCAL BACKEND IS NOT A SECURITY BOUNDARY: commands run as the harness's own user with its network,
its files (including the hidden tests in the package data) and its process table. Use it for tests, for
trusted scripted agents, and for policies you would let run shell commands on your machine anyway.
"""

from __future__ import annotations

import os
import posixpath
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.environments.swe.sandbox import (
    REPORT_MAX_BYTES,
    ExecResult,
    OutputCapture,
    SandboxError,
    SandboxFileError,
    TestRun,
    rlimit_spec,
)
from trainer.environments.swe.supervisor import SUPERVISOR
from trainer.environments.swe.tasks import check_tree


@dataclass
class LocalConfig:
    """Limits of the local backend (per command; see the module docstring: not a security boundary)."""

    address_space_bytes: int = 4 * 1024**3
    """RLIMIT_AS of each command (virtual memory, so generous: interpreters reserve more than they use)."""
    file_size_bytes: int = 256 * 1024**2
    """RLIMIT_FSIZE: the largest file a command may write."""
    cpu_margin_s: int = 5
    """RLIMIT_CPU is the command's timeout plus this many seconds (a backstop; the wall clock decides first)."""
    max_processes: int = 512
    """RLIMIT_NPROC when not running as root (it counts every process of the user, so keep it well above zero)."""
    capture_bytes: int = 2 * 1024**2
    """Bytes kept of each stream (half from the start, half from the end)."""
    max_output_bytes: int = 64 * 1024**2
    """A command producing more output than this is stopped."""
    host_grace_s: float = 5.0
    """Extra seconds the host waits past the supervisor's deadline before killing the session itself."""
    python: str = sys.executable
    """Interpreter running the supervisor and the hidden tests (it needs pytest)."""

    def __post_init__(self) -> None:
        for name in ("address_space_bytes", "file_size_bytes", "max_processes", "capture_bytes", "max_output_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"LocalConfig.{name} must be positive, got {getattr(self, name)}")
        if self.cpu_margin_s < 0 or self.host_grace_s < 0:
            raise ValueError("LocalConfig.cpu_margin_s and host_grace_s must be >= 0")


def _session_members(sid: int) -> list[int]:
    """Pids whose session id is `sid` (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 3 and int(fields[3]) == sid:
            members.append(int(entry))
    return members


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid`, a few rounds to catch late forks."""
    for _ in range(5):
        members = _session_members(sid)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def _pump(stream, capture: OutputCapture, budget: list[int], on_overflow) -> None:
    """Read a pipe to EOF into `capture`; call `on_overflow` once when all streams together pass the budget."""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            return
        capture.add(chunk)
        budget[0] -= len(chunk)
        if budget[0] < 0 and budget[1] == 0:
            budget[1] = 1
            on_overflow()


class LocalBackend:
    """The repository copied to a temporary directory; commands are subprocesses (NOT a security boundary)."""

    def __init__(self, config: LocalConfig | None = None):
        self.config = config or LocalConfig()
        self.root: Path | None = None
        self.repo_dir = ""
        self.task = None

    def start(self, task) -> None:
        """Copy the task's repository fixture into a fresh temporary directory."""
        if task.repo_path is None or task.hidden_tests_path is None:
            raise SandboxError(
                f"task {task.task_id!r} has no repo_path/hidden_tests_path; the local backend needs "
                "a repository fixture (R2E-Gym entries without one need the docker backend)"
            )
        if not Path(task.repo_path).is_dir():
            raise SandboxError(f"task {task.task_id!r}: repo_path {str(task.repo_path)!r} is not a directory")
        if not Path(task.hidden_tests_path).is_dir():
            raise SandboxError(
                f"task {task.task_id!r}: hidden_tests_path {str(task.hidden_tests_path)!r} is not a directory"
            )
        for name in ("repo_path", "hidden_tests_path"):
            try:
                check_tree(getattr(task, name), f"task {task.task_id!r} {name}")
            except ValueError as exc:
                raise SandboxError(str(exc)) from None
        self.close()
        self.task = task
        self.root = Path(tempfile.mkdtemp(prefix="swe-local-")).resolve()
        shutil.copytree(
            task.repo_path, self.root / "testbed", symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
        (self.root / "home").mkdir()
        (self.root / "tmp").mkdir()
        self.repo_dir = str(self.root / "testbed")

    def _env(self, home: str | None = None) -> dict[str, str]:
        path = os.pathsep.join([str(Path(self.config.python).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        return {
            "PATH": path,
            "HOME": home or str(self.root / "home"),
            "TMPDIR": str(self.root / "tmp"),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TERM": "dumb",
        }

    def _limits(self, timeout: float) -> dict[str, int]:
        limits = {
            "cpu": int(timeout) + 1 + self.config.cpu_margin_s,
            "as": self.config.address_space_bytes,
            "fsize": self.config.file_size_bytes,
            "core": 0,
        }
        if os.geteuid() != 0:
            limits["nproc"] = self.config.max_processes
        return limits

    def exec(self, argv: Sequence[str], timeout: float, cwd: str | None = None, home: str | None = None) -> ExecResult:
        """Run `argv` under the supervisor in the repository directory (HOME: the episode's, or `home`)."""
        self._require_started()
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        import subprocess

        cmd = [self.config.python, "-c", SUPERVISOR, f"{timeout:g}", "group", rlimit_spec(self._limits(timeout)), *argv]
        started = time.monotonic()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd or self.repo_dir,
            env=self._env(home),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        out, err = OutputCapture(self.config.capture_bytes), OutputCapture(self.config.capture_bytes)
        budget = [self.config.max_output_bytes, 0]
        pumps = [
            threading.Thread(target=_pump, args=(stream, cap, budget, lambda: _kill_session(proc.pid)), daemon=True)
            for stream, cap in ((proc.stdout, out), (proc.stderr, err))
        ]
        for thread in pumps:
            thread.start()
        host_timeout = False
        try:
            code = proc.wait(timeout + self.config.host_grace_s)
        except subprocess.TimeoutExpired:
            host_timeout = True
            _kill_session(proc.pid)
            code = proc.wait()
        _kill_session(proc.pid)  # anything the command left behind in the supervisor's session
        for thread in pumps:
            thread.join(self.config.host_grace_s)
        proc.stdout.close()
        proc.stderr.close()
        timed_out = host_timeout or code == 124
        return ExecResult(
            out.value(),
            err.value(),
            -1 if host_timeout else code,
            timed_out=timed_out,
            output_limited=budget[1] == 1,
            duration_s=time.monotonic() - started,
        )

    def _inside(self, path: str) -> Path:
        """Resolve `path` and refuse anything outside the episode's directory."""
        self._require_started()
        if not posixpath.isabs(path):
            raise SandboxFileError(f"The path {path!r} is not absolute.")
        resolved = Path(os.path.realpath(path))
        if resolved != self.root and self.root not in resolved.parents:
            raise SandboxFileError(f"Permission denied: {path!r} is outside the sandbox ({self.root}).")
        return resolved

    def read_file(self, path: str) -> bytes:
        target = self._inside(path)
        try:
            if target.stat().st_size > self.config.capture_bytes:
                raise SandboxFileError(f"{path} is larger than {self.config.capture_bytes} bytes")
            return target.read_bytes()
        except SandboxFileError:
            raise
        except OSError as exc:
            raise SandboxFileError(f"{exc.strerror or exc}: {path!r}") from None

    def write_file(self, path: str, data: bytes) -> None:
        target = self._inside(path)
        if len(data) > self.config.file_size_bytes:
            raise SandboxFileError(f"File too large: {len(data)} bytes > {self.config.file_size_bytes}")
        try:
            target.write_bytes(data)
        except OSError as exc:
            raise SandboxFileError(f"{exc.strerror or exc}: {path!r}") from None

    def path_kind(self, path: str) -> str:
        target = self._inside(path)
        if target.is_dir():
            return "dir"
        if target.is_file():
            return "file"
        return "other" if target.exists() else "missing"

    def run_tests(self, timeout: float, key: bytes | None = None, exempt: Sequence[str] = ()) -> TestRun:
        """Restore the test infrastructure the agent changed (`workdiff.py`; `exempt`: never restored), copy the
        hidden tests into the repository and run them: through `report_launcher.py` with `key` (its report read
        back), by plain pytest without. The agent's changes are compared with the task's fixture and scanned
        (`tamper.py`), as on the Docker backend."""
        from trainer.environments.swe.grading import LAUNCHER_PATH, pytest_command

        self._require_started()
        plan, flags = self._restore(exempt)
        tests_dir = Path(self.repo_dir) / "r2e_tests"
        shutil.rmtree(tests_dir, ignore_errors=True)
        if tests_dir.exists() or tests_dir.is_symlink():
            tests_dir.unlink()
        shutil.copytree(
            self.task.hidden_tests_path, tests_dir, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
        purge_bytecode(Path(self.repo_dir))
        home = tempfile.mkdtemp(prefix="swe-grade-home-")  # not the agent's home, which it may have seeded
        channel = Path(tempfile.mkdtemp(prefix="swe-grade-report-"))
        key_file, report_file = channel / "key", channel / "report"
        try:
            launcher = None
            if key is not None:
                key_file.write_bytes(key)
                launcher = " ".join(shlex.quote(str(p)) for p in (LAUNCHER_PATH, key_file, report_file))
            script = pytest_command(
                python=shlex.quote(self.config.python), testbed=shlex.quote(self.repo_dir), launcher=launcher
            )
            log = self.exec(["bash", "-c", script], timeout, home=home)
            report = None
            if key is not None and report_file.is_file():
                with report_file.open("rb") as handle:
                    report = handle.read(REPORT_MAX_BYTES)
            return TestRun(
                log,
                report,
                launcher=key is not None,
                changes=plan.summary(),
                changed=tuple(plan.changed),
                flags=tuple(flags),
            )
        finally:
            shutil.rmtree(tests_dir, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)
            shutil.rmtree(channel, ignore_errors=True)

    def _restore(self, exempt: Sequence[str]):
        """(the grading plan, static tamper flags) of the agent's repository against the task's fixture, with the
        plan's test infrastructure put back in place."""
        from trainer.environments.swe.tamper import scan_plan
        from trainer.environments.swe.workdiff import TarTree, plan_grading, restore_in_place, tree_tar

        with tempfile.TemporaryFile() as original_tar, tempfile.TemporaryFile() as agent_tar:
            tree_tar(self.task.repo_path, original_tar)
            tree_tar(self.repo_dir, agent_tar)
            original_tar.seek(0)
            agent_tar.seek(0)
            with TarTree(original_tar) as original, TarTree(agent_tar) as agent:
                plan = plan_grading(original, agent, exempt)
                flags = scan_plan(plan, original, agent)
                restore_in_place(plan, original, self.repo_dir)
        return plan, flags

    def _require_started(self) -> None:
        if self.root is None:
            raise SandboxError("the backend has no episode: call start(task) first")

    def close(self) -> None:
        """Delete the episode's directory."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        self.repo_dir = ""


def purge_bytecode(repo: Path) -> None:
    """Remove the bytecode caches the agent left in its repository before grading (the Docker backend's
    PURGE_BYTECODE says why): a cache whose header matches the source is loaded without reading the source."""
    for cache in [p for p in repo.rglob("__pycache__") if p.is_dir() and not p.is_symlink()]:
        shutil.rmtree(cache, ignore_errors=True)
    for stray in repo.rglob("*.pyc"):
        if stray.is_file() or stray.is_symlink():
            stray.unlink(missing_ok=True)
