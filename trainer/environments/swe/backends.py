"""Where the agent's commands run: a local temporary directory or a Docker container.

Both backends give the tools in `tools.py` the same five primitives, so the tools, their observation strings
and the grading are one code path:

    exec(argv, timeout) -> ExecResult     run a program as the agent, in the repository, with limits
    read_file(path) / write_file(path)    bytes in and out, with the agent's permissions
    path_kind(path)                       "file" | "dir" | "missing" | "other"
    run_tests(timeout) -> ExecResult      copy the hidden tests in, run the task's pytest command, return its log

How one command runs (both backends). Every command goes through `SUPERVISOR`, a small Python program run
inside the sandbox: it forks the command into a fresh process group, applies rlimits in the child just before
exec, kills the whole group with SIGKILL at the deadline (exit code 124, as `timeout` would give), and, when the
command returns, kills whatever the command left running in its group; in a container, where the agent's user
owns nothing else, it then kills every remaining process of that user as well (found through /proc, since
kill(-1) reports success even when it may signal nothing). Why not plain `timeout`: a fork bomb or
`sleep 100 &` returns at once and leaves its children behind; they then hold the pids limit or the output
stream and wedge every later command (seen in testing). So every tool call is hermetic: background processes
do not outlive the command that started them (R2E-Gym's bash tool already refuses `nohup`). Locally a process
that escapes with `setsid` survives the command (see below). The host enforces the deadline a second time
(timeout + `host_grace_s`) in case the agent kills its supervisor, and it stops a command whose output passes
`max_output_bytes` (a flood of `yes` would otherwise cost host CPU for the whole timeout); the stream is
drained to its end either way, since an unread exec stream stalls the engine. Output is kept as head + tail
bytes (`capture_bytes`), never all of it.

Docker backend (needs the `docker` SDK and a running engine; the images come from `image.py`):
- one container per episode from the task's `docker_image`, `sleep infinity` under Docker's init (which reaps
  orphans), `network_mode="none"`, memory (no swap), pids and CPU limits, a file-size ulimit, all capabilities
  dropped except the few root needs for setup and grading, `no-new-privileges`;
- R2E-Gym's layout: repository at /testbed, hidden tests at /r2e_tests and /testbed/run_tests.sh in the image;
  at start both move to /root (mode 700) before the agent runs anything, as R2E-Gym does;
- the agent runs as the unprivileged `agent` user when the image has one (ours do; R2E-Gym's images do not,
  and there it runs as root as in R2E-Gym), so it cannot read /root or write outside /testbed, /tmp and its home;
  file reads and writes also go through `exec` as that user (a write is `cat` into place as the agent, the bytes
  on its standard input), so `file_editor` has exactly the permissions `execute_bash` has;
- grading: kill every agent process; then (`grade_in: fresh`, the default) start a new container from the task's
  image and give it only the agent's /testbed (without .venv and .git, which come from the image), so nothing
  else the agent left behind (user site-packages, `.pth` files, `sitecustomize`, HOME dotfiles) takes part in
  grading; in it, copy /root/r2e_tests to /testbed/r2e_tests (root-owned, read-only for the agent), run
  /root/run_tests.sh's text as the agent, delete the copy. `grade_in: episode` grades in the episode's own
  container, as R2E-Gym does;
- containers carry the labels `harness.swe=1`, the owner's pid, pid start time and host name.
  `cleanup_stale_containers()` removes labelled containers whose owner process is gone (called whenever a
  backend is created), `close()` removes the container, and an `atexit` hook removes any this process still
  holds. A trainer killed by a signal (SIGKILL, or SIGTERM without a handler) leaves its containers until
  the next backend starts anywhere on the machine.
- if a command cannot even start (the pids limit is full because the agent killed its supervisor) or the host
  deadline passes, the backend kills the agent's processes (`kill -9 -1` as the agent) or, failing that,
  restarts the container (processes die, files stay); a command that could not start is tried once more.
  Either way the episode goes on.

Local backend: the same tools on a copy of the fixture repository in a temporary directory, as subprocesses of
this Python with the supervisor's rlimits (CPU seconds, address space, file size, no core files; the number of
processes only when not root, where RLIMIT_NPROC is not enforced and counts all of the user's processes).
The rlimits are set by the supervisor in the child rather than with `preexec_fn`, which is unsafe in a
threaded program (the trainer is one). `file_editor` is confined to the episode's directory; `execute_bash` is
not. THE LOCAL BACKEND IS NOT A SECURITY BOUNDARY: commands run as the harness's own user with its network,
its files (including the hidden tests in the package data) and its process table. Use it for tests, for
trusted scripted agents, and for policies you would let run shell commands on your machine anyway.
"""
from __future__ import annotations

import atexit
import collections
import os
import posixpath
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence

from trainer.environments.swe.tasks import check_tree
from trainer.process import process_start_time

# --------------------------------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------------------------------

SUPERVISOR = r'''
import os, signal, sys, time
limit = float(sys.argv[1])
purge_user = sys.argv[2] == "user"
rlimits = [item.split("=") for item in sys.argv[3].split(",") if item]
argv = sys.argv[4:]
try:  # become the reaper of the command's orphans, so that killed ones do not linger as zombies
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
def reap():
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except OSError:
            return
try:
    pid = os.fork()
except OSError as exc:
    sys.stderr.write("supervisor: cannot fork: %s\n" % exc)
    sys.stderr.flush()
    os._exit(125)
if pid == 0:
    os.setpgid(0, 0)
    try:
        for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores these; a shell command must not inherit that
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        import resource
        for name, value in rlimits:
            which = getattr(resource, "RLIMIT_" + name.upper())
            resource.setrlimit(which, (int(value), int(value)))
        os.execvp(argv[0], argv)
    except Exception as exc:
        sys.stderr.write("%s: %s\n" % (argv[0], exc))
        sys.stderr.flush()
    os._exit(127)
try:
    os.setpgid(pid, pid)
except OSError:
    pass
expired = []
def on_alarm(signum, frame):
    expired.append(1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, limit)
while True:
    try:
        status = os.waitpid(pid, 0)[1]
        break
    except InterruptedError:
        continue
signal.setitimer(signal.ITIMER_REAL, 0)
for _ in range(400):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        break
    time.sleep(0.002)
    reap()
def survivors():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/status" % name) as fh:
                fields = dict(line.split(":", 1) for line in fh.read().splitlines() if ":" in line)
        except (IOError, OSError):
            continue
        if fields.get("Uid", "").split()[:1] == [str(os.getuid())] and "Z" not in fields.get("State", "")[:3]:
            found.append(int(name))
    return found
if purge_user:
    try:
        os.kill(-1, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(200):
        alive = survivors()
        if not alive:
            break
        for other in alive:
            try:
                os.kill(other, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
        reap()
if expired:
    code = 124
elif os.WIFEXITED(status):
    code = os.WEXITSTATUS(status)
else:
    code = 128 + os.WTERMSIG(status)
os._exit(code)
'''
"""Runs `argv` in its own process group with rlimits; kills the group at the deadline and when it returns.

Arguments: timeout seconds; "group" or "user" (after the command, also kill every process of the calling
user with kill(-1): only for an unprivileged user alone in a container, never locally, never as root);
rlimits as "cpu=10,as=1073741824" (may be empty); then the command. Exit code: the command's, 128+signal if a
signal ended it, 124 at the deadline, 125 if the supervisor could not fork, 127 if the command could not be
executed. Kept compatible with old Pythons (3.6) because it runs with whatever Python the image has."""

SANDBOX_PATH = "/root/.venv/bin:/root/.local/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH inside containers (R2E-Gym's, minus ~/.cargo; the /root entries only matter when running as root)."""


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
        tail = b"".join(self.tail)[-self.half:] if self.tail else b""
        dropped = self.total - len(self.head) - len(tail)
        if dropped <= 0:
            return bytes(self.head) + tail
        return bytes(self.head) + f"\n<... {dropped} bytes of output omitted ...>\n".encode() + tail


def rlimit_spec(limits: dict[str, int]) -> str:
    """{"cpu": 10, "as": 2**30} -> "cpu=10,as=1073741824" (the supervisor's second argument)."""
    return ",".join(f"{name}={int(value)}" for name, value in limits.items())


# --------------------------------------------------------------------------------------------------------------
# Local backend
# --------------------------------------------------------------------------------------------------------------


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
        fields = stat[stat.rfind(b")") + 2:].split()
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
            raise SandboxError(f"task {task.task_id!r} has no repo_path/hidden_tests_path; the local backend needs "
                               "a repository fixture (R2E-Gym entries without one need the docker backend)")
        if not Path(task.repo_path).is_dir():
            raise SandboxError(f"task {task.task_id!r}: repo_path {str(task.repo_path)!r} is not a directory")
        if not Path(task.hidden_tests_path).is_dir():
            raise SandboxError(f"task {task.task_id!r}: hidden_tests_path {str(task.hidden_tests_path)!r} "
                               "is not a directory")
        for name in ("repo_path", "hidden_tests_path"):
            try:
                check_tree(getattr(task, name), f"task {task.task_id!r} {name}")
            except ValueError as exc:
                raise SandboxError(str(exc)) from None
        self.close()
        self.task = task
        self.root = Path(tempfile.mkdtemp(prefix="swe-local-")).resolve()
        shutil.copytree(task.repo_path, self.root / "testbed", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (self.root / "home").mkdir()
        (self.root / "tmp").mkdir()
        self.repo_dir = str(self.root / "testbed")

    def _env(self, home: str | None = None) -> dict[str, str]:
        path = os.pathsep.join([str(Path(self.config.python).parent), os.environ.get("PATH", "/usr/bin:/bin")])
        return {"PATH": path, "HOME": home or str(self.root / "home"), "TMPDIR": str(self.root / "tmp"),
                "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}

    def _limits(self, timeout: float) -> dict[str, int]:
        limits = {"cpu": int(timeout) + 1 + self.config.cpu_margin_s, "as": self.config.address_space_bytes,
                  "fsize": self.config.file_size_bytes, "core": 0}
        if os.geteuid() != 0:
            limits["nproc"] = self.config.max_processes
        return limits

    def exec(self, argv: Sequence[str], timeout: float, cwd: str | None = None, home: str | None = None
             ) -> ExecResult:
        """Run `argv` under the supervisor in the repository directory (HOME: the episode's, or `home`)."""
        self._require_started()
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        import subprocess

        cmd = [self.config.python, "-c", SUPERVISOR, f"{timeout:g}", "group", rlimit_spec(self._limits(timeout)),
               *argv]
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=cwd or self.repo_dir, env=self._env(home), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        out, err = OutputCapture(self.config.capture_bytes), OutputCapture(self.config.capture_bytes)
        budget = [self.config.max_output_bytes, 0]
        pumps = [threading.Thread(target=_pump, args=(stream, cap, budget, lambda: _kill_session(proc.pid)),
                                  daemon=True) for stream, cap in ((proc.stdout, out), (proc.stderr, err))]
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
        return ExecResult(out.value(), err.value(), -1 if host_timeout else code, timed_out=timed_out,
                          output_limited=budget[1] == 1, duration_s=time.monotonic() - started)

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

    def run_tests(self, timeout: float) -> ExecResult:
        """Copy the hidden tests into the repository and run them; returns the pytest log."""
        from trainer.environments.swe.grading import pytest_command

        self._require_started()
        tests_dir = Path(self.repo_dir) / "r2e_tests"
        shutil.rmtree(tests_dir, ignore_errors=True)
        if tests_dir.exists() or tests_dir.is_symlink():
            tests_dir.unlink()
        shutil.copytree(self.task.hidden_tests_path, tests_dir, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        script = pytest_command(python=shlex.quote(self.config.python), testbed=shlex.quote(self.repo_dir))
        home = tempfile.mkdtemp(prefix="swe-grade-home-")  # not the agent's home, which it may have seeded
        try:
            return self.exec(["bash", "-c", script], timeout, home=home)
        finally:
            shutil.rmtree(tests_dir, ignore_errors=True)
            shutil.rmtree(home, ignore_errors=True)

    def _require_started(self) -> None:
        if self.root is None:
            raise SandboxError("the backend has no episode: call start(task) first")

    def close(self) -> None:
        """Delete the episode's directory."""
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        self.repo_dir = ""


# --------------------------------------------------------------------------------------------------------------
# Docker backend
# --------------------------------------------------------------------------------------------------------------

LABEL = "harness.swe"
"""Every container this module creates carries LABEL=1 and the owner labels below."""

_OWNED: dict[str, object] = {}
"""Container id -> docker client, for containers this process created and has not removed yet (atexit)."""
_OWNED_LOCK = threading.Lock()


@dataclass
class DockerConfig:
    """Limits and settings of the Docker backend."""

    memory: str = "2g"
    """Container memory limit (swap is disabled by setting the same memswap limit)."""
    pids: int = 512
    """Most processes and threads the container may hold at once (fork-bomb guard)."""
    cpus: float = 1.0
    """CPU quota in cores."""
    file_size_bytes: int = 256 * 1024**2
    """RLIMIT_FSIZE of every process in the container."""
    scratch: bool = True
    """The root filesystem read-only, and the writable places (/testbed, /tmp, /var/tmp, /root, /home) tmpfs
    mounts of `scratch_bytes` and `scratch_inodes` each, /testbed filled with the image's repository at start:
    the kernel enforces the bounds on every storage driver and the host disk is never written. False: the image's
    writable layer, unbounded unless `storage_size` is set (R2E-Gym's images keep a large .venv in /testbed,
    which in a scratch place would sit in memory)."""
    scratch_bytes: int | None = None
    """Size of each scratch place; None: a tenth of `memory`. tmpfs pages count towards `memory` and cannot be
    swapped, so the places together may take at most half of it (else a full scratch would leave the agent's
    processes to the OOM killer)."""
    scratch_inodes: int = 100_000
    """Most files and directories in each writable place (tmpfs nr_inodes)."""
    storage_size: str | None = None
    """With `scratch: false` only: cap on the container's writable layer (e.g. "2g"); needs a storage
    driver with quotas (overlay2 on xfs with pquota, btrfs, zfs), not the vfs driver used in CI."""
    user: str = "agent"
    """Unprivileged user the agent's commands run as, when the image has it; otherwise root (R2E-Gym images)."""
    capture_bytes: int = 2 * 1024**2
    """Bytes kept of each stream (half from the start, half from the end)."""
    max_output_bytes: int = 64 * 1024**2
    """A command producing more output than this is stopped."""
    host_grace_s: float = 5.0
    """Extra seconds the host waits past the in-container deadline before killing processes itself."""
    python: str = "python3"
    """Interpreter inside the image that runs the supervisor."""
    file_op_timeout_s: float = 30.0
    """Deadline of the small commands behind read_file / write_file / path_kind and setup."""
    start_timeout_s: float = 60.0
    """Docker API timeout (container create, start, remove)."""
    grade_in: str = "fresh"
    """Where the hidden tests run. "fresh": a new container from the task's image, given only the agent's
    repository (/testbed without .venv, .git and the tests' folder), so nothing else the agent left behind (a
    `.pth` or `sitecustomize` in a site-packages, HOME dotfiles, a planted pytest plugin) can change how the tests
    run or are reported. "episode": in the episode's own container, as R2E-Gym grades (faster by one container
    start, and gameable by such leftovers)."""

    def __post_init__(self) -> None:
        for name in ("pids", "file_size_bytes", "capture_bytes", "max_output_bytes", "scratch_inodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"DockerConfig.{name} must be positive, got {getattr(self, name)}")
        if self.cpus <= 0:
            raise ValueError(f"DockerConfig.cpus must be positive, got {self.cpus}")
        if not self.memory:
            raise ValueError("DockerConfig.memory must be set (e.g. '2g')")
        if self.scratch_bytes is None:
            self.scratch_bytes = memory_bytes(self.memory) // 10
        else:
            total = len(SCRATCH_PLACES) * self.scratch_bytes
            if self.scratch_bytes < 1024**2 or total > memory_bytes(self.memory) // 2:
                raise ValueError(f"DockerConfig.scratch_bytes {self.scratch_bytes}: must be at least 1 MiB, and the "
                                 f"{len(SCRATCH_PLACES)} writable places together ({total} bytes) at most half of "
                                 f"memory {self.memory!r}")
        if self.grade_in not in ("fresh", "episode"):
            raise ValueError(f"DockerConfig.grade_in must be 'fresh' or 'episode', got {self.grade_in!r}")


def memory_bytes(size: str | int) -> int:
    """Docker's memory notation in bytes: an integer, or digits with a unit b, k, m or g ("512m")."""
    text = str(size).strip().lower()
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    if not number.isdigit():
        raise ValueError(f"DockerConfig.memory: {size!r} is not a size such as '2g' or '512m'")
    return int(number) * unit


def _owner_labels() -> dict[str, str]:
    pid = os.getpid()
    return {LABEL: "1", f"{LABEL}.owner_pid": str(pid), f"{LABEL}.owner_start": process_start_time(pid) or "",
            f"{LABEL}.owner_host": socket.gethostname()}


def _owner_alive(labels: dict[str, str]) -> bool:
    """Whether the process named by a container's owner labels still runs (True when it cannot be told)."""
    if labels.get(f"{LABEL}.owner_host") != socket.gethostname():
        return True  # another machine's container: not ours to judge
    try:
        pid = int(labels.get(f"{LABEL}.owner_pid", ""))
    except ValueError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = labels.get(f"{LABEL}.owner_start", "")
    return not start or process_start_time(pid) in (None, start)


def docker_client(timeout: float = 60.0):
    """A docker SDK client from the environment; raises SandboxError with the reason when there is no engine."""
    try:
        import docker
    except ImportError as exc:
        raise SandboxError("the docker backend needs the `docker` Python package (pip install docker)") from exc
    try:
        client = docker.from_env(timeout=int(timeout))
        client.ping()
    except Exception as exc:  # docker raises several types for "no engine"
        raise SandboxError(f"no Docker engine reachable ({type(exc).__name__}: {exc})") from None
    return client


def cleanup_stale_containers(client) -> list[str]:
    """Remove containers labelled by this module whose owner process is gone; returns their ids."""
    import docker

    removed = []
    for container in client.containers.list(all=True, filters={"label": f"{LABEL}=1"}):
        if _owner_alive(container.labels):
            continue
        try:
            container.remove(force=True)
            removed.append(container.id)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress elsewhere
                raise
    return removed


def _remove_owned_containers() -> None:
    """atexit: remove every container this process still holds."""
    with _OWNED_LOCK:
        owned = list(_OWNED.items())
        _OWNED.clear()
    for container_id, client in owned:
        try:
            client.api.remove_container(container_id, force=True)
        except Exception:
            pass


atexit.register(_remove_owned_containers)

WORK_EXCLUDES = "--exclude=./.venv --exclude=./.git --exclude=./r2e_tests"
"""What of /testbed is not the agent's work when grading in a fresh container: the repository's environment and
history come from the image (a `.pth` planted in /testbed/.venv would otherwise run at interpreter start)."""

_SETUP = """set -e
if [ "$2" = layer ] && [ -d /r2e_tests ]; then rm -rf /root/r2e_tests; mv /r2e_tests /root/r2e_tests; fi
if [ -f /testbed/run_tests.sh ]; then mv /testbed/run_tests.sh /root/run_tests.sh; fi
chmod 700 /root
find /testbed -name '*.pyc' -delete
find /testbed -name __pycache__ -type d -prune -exec rm -rf {} +
test -d /root/r2e_tests || { echo "image has no /r2e_tests (hidden tests)" >&2; exit 3; }
test -f /root/run_tests.sh || { echo "image has no /testbed/run_tests.sh" >&2; exit 3; }
if id -u "$1" >/dev/null 2>&1; then
    home=$(getent passwd "$1" | cut -d: -f6)
    if [ "$2" = scratch ] && [ ! -d "$home" ]; then mkdir -p "$home"; chown "$1:$(id -g "$1")" "$home"; fi
    id -u "$1"; id -g "$1"; echo "$home"
fi
"""
"""Run as root once the container runs; $1: the agent's user name, $2: `scratch` (tmpfs places, filled from the
image before this) or `layer` (the image's writable layer)."""

SCRATCH_PLACES = {"/testbed": "755", "/tmp": "1777", "/var/tmp": "1777", "/root": "700", "/home": "755"}
"""The writable places of a scratch container (tmpfs over a read-only root filesystem), with their modes."""

_READ = ('size=$(stat -L -c %s -- "$1") || exit 1; '
         'if [ "$size" -gt "$2" ]; then echo "$1 is larger than $2 bytes" >&2; exit 1; fi; exec cat -- "$1"')

_PATH_KIND = ('if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; '
              'elif [ -e "$1" ] || [ -L "$1" ]; then echo other; else echo missing; fi')


class DockerBackend:
    """One container per episode from the task's image (see the module docstring)."""

    repo_dir = "/testbed"

    def __init__(self, config: DockerConfig | None = None, client=None):
        self.config = config or DockerConfig()
        self.client = client or docker_client(self.config.start_timeout_s)
        cleanup_stale_containers(self.client)
        self.container = None
        self.user = "root"
        self.ids = (0, 0)
        self.home = "/root"
        self.task = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self, task) -> None:
        """Create the episode's container and move the hidden tests out of the agent's reach."""
        import docker

        self.close()
        self.task = task
        try:
            self.client.images.get(task.docker_image)
        except docker.errors.ImageNotFound:
            raise SandboxError(f"task {task.task_id!r}: image {task.docker_image!r} is not present locally "
                               "(build the shipped ones with `python -m trainer.environments.swe.image`)") from None
        mem = self.config.memory
        scratch = self.config.scratch_bytes if self.config.scratch else None
        if scratch is not None:  # tmpfs places; /r2e_tests masked by an empty one (its files go to /root)
            places = {path: f"size={scratch},nr_inodes={self.config.scratch_inodes},mode={mode}"
                      for path, mode in SCRATCH_PLACES.items()}
            layout = {"read_only": True, "tmpfs": {**places, "/r2e_tests": "size=64k,nr_inodes=16,mode=700"}}
        else:
            layout = {"storage_opt": {"size": self.config.storage_size}} if self.config.storage_size else {}
        try:
            self.container = self.client.containers.create(
                task.docker_image, ["sleep", "infinity"], init=True, labels=_owner_labels(),
                network_mode="none", mem_limit=mem, memswap_limit=mem, pids_limit=self.config.pids,
                nano_cpus=int(self.config.cpus * 1e9), working_dir=self.repo_dir, user="root",
                cap_drop=["ALL"], cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges:true"],
                ulimits=[docker.types.Ulimit(name="fsize", soft=self.config.file_size_bytes,
                                             hard=self.config.file_size_bytes),
                         docker.types.Ulimit(name="core", soft=0, hard=0)],
                **layout)
        except docker.errors.APIError as exc:
            raise SandboxError(f"task {task.task_id!r}: could not create a container: {exc}") from None
        with _OWNED_LOCK:
            _OWNED[self.container.id] = self.client
        try:
            # a created container's archive reads the image's files, not the tmpfs places mounted at start
            seeds = [(self._archive(path), into) for path, into in (("/testbed", "/"), ("/r2e_tests", "/root"))
                     if scratch is not None]
            self.container.start()
            for data, into in seeds:
                if data is not None:
                    self._feed(["tar", "-xf", "-", "-C", into], data, "could not fill the container's scratch")
            setup = self._exec(["sh", "-c", _SETUP, "_", self.config.user,
                                "layer" if scratch is None else "scratch"], self.config.file_op_timeout_s,
                               user="root")
            if setup.exit_code != 0:
                raise SandboxError(f"task {task.task_id!r}: container setup failed (exit {setup.exit_code}): "
                                   f"{(setup.stdout + setup.stderr).decode(errors='replace').strip()}")
            fields = setup.stdout.decode(errors="replace").split()
            if len(fields) == 3:
                self.user, self.ids, self.home = self.config.user, (int(fields[0]), int(fields[1])), fields[2]
            else:
                self.user, self.ids, self.home = "root", (0, 0), "/root"
        except BaseException:
            self.close()
            raise

    def _archive(self, path: str) -> bytes | None:
        """The tar of `path` in the container (None if absent); of the image's files while it is not started."""
        import docker

        try:
            stream, _ = self.container.get_archive(path)
        except docker.errors.NotFound:
            return None
        return b"".join(stream)

    def _feed(self, argv: Sequence[str], data: bytes, what: str, user: str = "root") -> None:
        """Run `argv` in the container with `data` on its standard input (the docker archive API cannot reach the
        tmpfs places); SandboxError with `what` and its error output unless it exits 0."""
        from docker.utils.socket import frames_iter

        api = self.client.api
        exec_id = api.exec_create(self.container.id, list(argv), stdin=True, stdout=True, stderr=True, user=user,
                                  workdir="/", environment=self._env(user))["Id"]
        sock = api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        try:
            raw.sendall(data)
            raw.shutdown(socket.SHUT_WR)
            err = b"".join(data for stream, data in frames_iter(sock, tty=False) if stream == 2)
        finally:
            sock.close()
        code = api.exec_inspect(exec_id).get("ExitCode")
        if code != 0:
            raise SandboxFileError(f"{what}: {(err or b'').decode(errors='replace').strip() or f'exit {code}'}")

    def close(self) -> None:
        """Remove the container (processes and files)."""
        container, self.container = self.container, None
        if container is None:
            return
        with _OWNED_LOCK:
            _OWNED.pop(container.id, None)
        try:
            container.remove(force=True)
        except Exception as exc:
            import docker

            if not isinstance(exc, docker.errors.NotFound):
                raise

    # -- commands --------------------------------------------------------------------------------------------
    def _env(self, user: str) -> dict[str, str]:
        home = self.home if user == self.user else "/root"
        return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
                "PYTHONDONTWRITEBYTECODE": "1", "TERM": "dumb"}

    def _exec(self, argv: Sequence[str], timeout: float, user: str | None = None, retry: bool = True) -> ExecResult:
        """Run `argv` under the supervisor as `user` (default: the agent) in /testbed."""
        import docker
        import requests

        try:
            return self._exec_unguarded(argv, timeout, user, retry)
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise SandboxError(f"the Docker engine failed: {type(exc).__name__}: {exc}") from None

    def _exec_unguarded(self, argv: Sequence[str], timeout: float, user: str | None, retry: bool) -> ExecResult:
        if self.container is None:
            raise SandboxError("the backend has no episode: call start(task) first")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        user = user or self.user
        api = self.client.api
        purge = "user" if user != "root" else "group"
        cmd = [self.config.python, "-c", SUPERVISOR, f"{timeout:g}", purge, "", *argv]
        started = time.monotonic()
        exec_id = api.exec_create(self.container.id, cmd, stdout=True, stderr=True, user=user,
                                  workdir=self.repo_dir, environment=self._env(user))["Id"]
        out, err = OutputCapture(self.config.capture_bytes), OutputCapture(self.config.capture_bytes)
        state = {"overflow": False, "error": None}
        attention = threading.Event()  # set at the end of the stream or when the output passes the limit

        def pump() -> None:
            try:  # keep draining after an overflow: an unread stream can stall the engine's other execs
                for chunk_out, chunk_err in api.exec_start(exec_id, stream=True, demux=True):
                    if state["overflow"]:
                        continue
                    if chunk_out:
                        out.add(chunk_out)
                    if chunk_err:
                        err.add(chunk_err)
                    if out.total + err.total > self.config.max_output_bytes:
                        state["overflow"] = True
                        attention.set()
            except Exception as exc:  # the stream breaks when the container is restarted
                state["error"] = exc
            attention.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        attention.wait(timeout + self.config.host_grace_s)
        host_timeout = not attention.is_set()
        if reader.is_alive():
            self._stop_processes(user)
            reader.join(self.config.host_grace_s)
            if reader.is_alive():
                self._restart()
                reader.join(self.config.host_grace_s)
        info = api.exec_inspect(exec_id)
        code = info.get("ExitCode")
        raw = out.value() + err.value()
        if retry and ((code == 126 and b"OCI runtime exec failed" in raw)
                      or (code == 125 and b"supervisor: cannot fork" in raw)):
            # the command could not even start: the pids limit is full of leftovers (a killed supervisor)
            self._stop_processes(user)
            return self._exec_unguarded(argv, timeout, user, retry=False)
        if code is None or host_timeout or state["error"] is not None:
            code = -1
        return ExecResult(out.value(), err.value(), code, timed_out=host_timeout or code == 124,
                          output_limited=state["overflow"], duration_s=time.monotonic() - started)

    def _stop_processes(self, user: str) -> None:
        """Kill every process of `user` (as that user); restart the container if that is impossible."""
        if user != "root":
            try:
                result = self.container.exec_run(["sh", "-c", "kill -9 -1"], user=user, workdir="/")
                if result.exit_code in (0, 1) and b"OCI runtime" not in (result.output or b""):
                    return
            except Exception:
                pass
        self._restart()

    def _restart(self) -> None:
        """Kill all processes in the container and start it again; its files stay."""
        self.container.restart(timeout=0)

    def exec(self, argv: Sequence[str], timeout: float) -> ExecResult:
        """Run `argv` as the agent in /testbed."""
        return self._exec(argv, timeout)

    # -- files -----------------------------------------------------------------------------------------------
    def read_file(self, path: str) -> bytes:
        if not posixpath.isabs(path):
            raise SandboxFileError(f"The path {path!r} is not absolute.")
        limit = self.config.capture_bytes // 2
        result = self._exec(["sh", "-c", _READ, "_", path, str(limit)], self.config.file_op_timeout_s)
        if result.exit_code != 0:
            raise SandboxFileError(_last_line(result.stderr) or f"cannot read {path!r}")
        return result.stdout

    def write_file(self, path: str, data: bytes) -> None:
        if not posixpath.isabs(path):
            raise SandboxFileError(f"The path {path!r} is not absolute.")
        if len(data) > self.config.file_size_bytes:
            raise SandboxFileError(f"File too large: {len(data)} bytes > {self.config.file_size_bytes}")
        try:
            self._feed(["sh", "-c", 'cat > "$1"', "_", path], data, "write", user=self.user)
        except SandboxFileError as exc:
            message = str(exc).removeprefix("write: ")
            raise SandboxFileError(message.splitlines()[-1].replace("_: 1: ", "") if message else
                                   f"cannot write {path!r}") from None

    def path_kind(self, path: str) -> str:
        if not posixpath.isabs(path):
            raise SandboxFileError(f"The path {path!r} is not absolute.")
        result = self._exec(["sh", "-c", _PATH_KIND, "_", path], self.config.file_op_timeout_s)
        kind = result.stdout.decode(errors="replace").strip()
        if result.exit_code != 0 or kind not in ("dir", "file", "other", "missing"):
            raise SandboxError(f"could not inspect {path!r} (exit {result.exit_code})")
        return kind

    # -- grading ---------------------------------------------------------------------------------------------
    def run_tests(self, timeout: float) -> ExecResult:
        """Kill the agent's processes, then run the hidden tests on the agent's repository: in a fresh container
        from the task's image (`grade_in: fresh`) or in this one (`episode`)."""
        if self.user != "root":
            self._stop_processes(self.user)
        if self.config.grade_in == "episode":
            return self._run_hidden_tests(timeout)
        work = self._agent_work()
        grader = DockerBackend(self.config, client=self.client)
        try:
            grader.start(self.task)
            grader._replace_repository(work)
            return grader._run_hidden_tests(timeout)
        finally:
            grader.close()

    def _agent_work(self) -> bytes:
        """A tar of the agent's repository: /testbed as it is now, without the tests' folder and the image's
        .venv and .git (those the grader takes from the image), ownership and modes kept."""
        made = self.container.exec_run(["sh", "-c", f"tar -C /testbed {WORK_EXCLUDES} -cf - ."], user="root",
                                       workdir="/", demux=True)
        work, err = made.output
        if made.exit_code != 0:
            raise SandboxError(f"could not archive the agent's repository for grading: "
                               f"{(err or b'').decode(errors='replace').strip()}")
        return work or b""

    def _replace_repository(self, work: bytes) -> None:
        """Swap this (fresh) container's /testbed for the agent's, keeping the image's .venv and .git."""
        cleared = self._exec(["sh", "-c", "find /testbed -mindepth 1 -maxdepth 1 ! -name .venv ! -name .git "
                              "-exec rm -rf {} +"], self.config.file_op_timeout_s, user="root")
        if cleared.exit_code != 0:
            raise SandboxError("could not clear the grading container's repository")
        try:
            self._feed(["tar", "-xf", "-", "-C", "/testbed"], work, "could not copy the agent's repository in")
        except SandboxFileError as exc:
            raise SandboxError(str(exc)) from None

    def _run_hidden_tests(self, timeout: float) -> ExecResult:
        """Copy the hidden tests in (read-only for the agent), run run_tests.sh as the agent, remove them."""
        copy = self._exec(["sh", "-c", "rm -rf /testbed/r2e_tests && cp -r /root/r2e_tests /testbed/r2e_tests && "
                           "chown -R root:root /testbed/r2e_tests && chmod -R a+rX,go-w /testbed/r2e_tests && "
                           "cat /root/run_tests.sh"], self.config.file_op_timeout_s, user="root")
        if copy.exit_code != 0:
            raise SandboxError(f"could not copy the hidden tests: {copy.stderr.decode(errors='replace').strip()}")
        try:
            return self._exec(["bash", "-c", copy.stdout.decode()], timeout)
        finally:
            self._exec(["rm", "-rf", "/testbed/r2e_tests"], self.config.file_op_timeout_s, user="root")


def _last_line(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[-1] if text else ""
