"""The Docker backend: one container per episode from the task's image, the agent unprivileged inside.

It needs the `docker` SDK and a running engine; the images come from `image.py`.
- one container per episode from the task's `docker_image`, `sleep infinity` under Docker's init (which reaps
  orphans), `network_mode="none"`, memory (no swap), pids and CPU limits, a file-size ulimit, all capabilities
  dropped except the few root needs for setup and grading, `no-new-privileges`;
- R2E-Gym's layout: repository at /testbed, hidden tests at /r2e_tests and /testbed/run_tests.sh in the image;
  at start both move to /root (mode 700) before the agent runs anything, as R2E-Gym does. SWE-bench images keep
  their test script at /run_tests.sh (it applies the test patch itself) and have no /r2e_tests: the script is
  copied to /root and removed from / where the root filesystem allows;
- R2E-Gym's environment setup: /testbed/.venv (R2E-Gym's images) or /opt/miniconda3/envs/testbed (SWE-bench's)
  linked to /root/.venv, the venv's python and executables linked into /root/.local/bin, and the agent's PATH
  starting with /root/.venv/bin:/root/.local/bin, so its `python` and `pytest` are the repository's. An
  unprivileged agent cannot enter /root, so /testbed/.venv/bin follows on its PATH. The harness's own root commands
  run with the system PATH only (the venv is the agent's to edit);
- images (`pull`): "missing" pulls an absent image at episode start (docker-py's `containers.run` does this in
  R2E-Gym), "never" refuses it; either way a task whose image cannot be had fails with the reason. A cell leaves
  such tasks out before it starts (`missing_images`, used by the swe family) and
  `python -m trainer.environments.swe.pull` checks or pulls a task file's images ahead of time;
- the agent runs as the unprivileged `agent` user when the image has one (ours do; R2E-Gym's images do not,
  and there it runs as root as in R2E-Gym), so it cannot read /root or write outside /testbed, /tmp and its home;
  file reads and writes also go through `exec` as that user (a write is `cat` into place as the agent, the bytes
  on its standard input), so `file_editor` has exactly the permissions `execute_bash` has;
- grading: kill every agent process; then (`grade_in: fresh`, the default) start a new container from the task's
  image and give it only the agent's /testbed (without .venv and .git, which come from the image), so nothing
  else the agent left behind (user site-packages, `.pth` files, `sitecustomize`, HOME dotfiles) takes part in
  grading; in it, copy /root/r2e_tests to /testbed/r2e_tests (root-owned, read-only for the agent), run
  /root/run_tests.sh's text as the agent (its `-m pytest` through the report launcher by default), delete the
  copy. `grade_in: episode` grades in the episode's own container, as R2E-Gym does;
- containers carry the labels of their owner (see `containers.py`), and stale ones are removed whenever a
  backend is created;
- if a command cannot even start (the pids limit is full because the agent killed its supervisor) or the host
  deadline passes, the backend kills the agent's processes (`kill -9 -1` as the agent) or, failing that,
  restarts the container (processes die, files stay); a command that could not start is tried once more.
  Either way the episode goes on.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from trainer.environments.swe.containers import cleanup_stale_containers, disown, docker_client, own, owner_labels
from trainer.environments.swe.exec_stream import STDERR, STDOUT, ExecStream, run_short
from trainer.environments.swe.grading import LAUNCHER_PATH
from trainer.environments.swe.sandbox import (
    REPORT_MAX_BYTES,
    ExecResult,
    OutputCapture,
    SandboxError,
    SandboxFileError,
    TestRun,
)
from trainer.environments.swe.supervisor import SUPERVISOR
from trainer.environments.swe.tamper import scan_plan
from trainer.environments.swe.workdiff import GradingPlan, TarTree, delta_tar, plan_grading

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""PATH of the harness's own commands (setup, file copies, grading's preparation)."""
SANDBOX_PATH = f"/root/.venv/bin:/root/.local/bin:/testbed/.venv/bin:{SYSTEM_PATH}"
"""The agent's PATH: R2E-Gym's (minus ~/.cargo), with /testbed/.venv/bin for an agent that cannot enter /root."""
PULL_POLICIES = ("missing", "never")


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
    mounts, each filled at start with what the image has there (R2E-Gym's repository and its .venv in /testbed, uv's
    interpreters under /root) and sized to that content plus `scratch_bytes` and `scratch_inodes` of room: the
    kernel enforces the bounds on every storage driver and the host disk is never written. The image's content sits
    in memory, so the container's memory limit is `memory` plus that content. False: the image's writable layer,
    unbounded unless `storage_size` is set, and a container starts without copying anything."""
    scratch_bytes: int | None = None
    """Room the agent has in each scratch place beyond the image's content; None: a tenth of `memory`. tmpfs pages
    count towards the memory limit and cannot be swapped, so the rooms together may take at most half of `memory`
    (else a full scratch would leave the agent's processes to the OOM killer). A grading container's /testbed has
    twice the room, so the tests' own files fit beside whatever the agent left."""
    scratch_inodes: int = 100_000
    """Files and directories each writable place holds beyond the image's content (tmpfs nr_inodes)."""
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
    pull: Literal["missing", "never"] = "missing"
    """An absent image: "missing" pulls it (docker-py's `containers.run`, as in R2E-Gym), "never" fails the task
    (for machines without registry access, or to keep a study on the images already there)."""
    grading_overhead_s: float = 120.0
    """How much longer than the tests' own deadline the whole grading may take (copying the agent's repository,
    starting the grading container, preparing it): past it the grade fails with the reason, as a sandbox error."""
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
        if self.grading_overhead_s <= 0:
            raise ValueError(f"DockerConfig.grading_overhead_s must be positive, got {self.grading_overhead_s}")
        if self.cpus <= 0:
            raise ValueError(f"DockerConfig.cpus must be positive, got {self.cpus}")
        if not self.memory:
            raise ValueError("DockerConfig.memory must be set (e.g. '2g')")
        if self.scratch_bytes is None:
            self.scratch_bytes = memory_bytes(self.memory) // 10
        else:
            total = len(SCRATCH_PLACES) * self.scratch_bytes
            if self.scratch_bytes < 1024**2 or total > memory_bytes(self.memory) // 2:
                raise ValueError(
                    f"DockerConfig.scratch_bytes {self.scratch_bytes}: must be at least 1 MiB, and the "
                    f"{len(SCRATCH_PLACES)} writable places together ({total} bytes) at most half of "
                    f"memory {self.memory!r}"
                )
        if self.pull not in PULL_POLICIES:
            raise ValueError(f"DockerConfig.pull must be one of {PULL_POLICIES}, got {self.pull!r}")
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


TREE_OUT = (
    "cd /testbed && find . -mindepth 1 -maxdepth 1 ! -name .venv ! -name .git ! -name r2e_tests -print0 "
    "| tar --null -T - --sparse -cf -"
)
"""The repository as `workdiff.TarTree` reads it: /testbed without the environment and history (the grader takes
them from the image: a `.pth` planted in /testbed/.venv would otherwise run at interpreter start) and the tests'
folder. They are left out by naming the top-level entries to archive, not by exclude patterns, which GNU tar
matches against every prefix of every name (23 s for 2,000 nested folders even anchored; 0.06 s this way);
`--sparse` sends a sparse file's data only, so 4 GB of holes do not become 4 GB on the host."""

_DELETE = (
    'cd /testbed && while IFS= read -r -d "" p; do '
    'if [ -d "$p" ] && [ ! -L "$p" ]; then rmdir -- "$p" 2>/dev/null || true; else rm -f -- "$p"; fi; done'
)
"""Removes the NUL-separated paths on standard input from /testbed (a folder only once empty: restored test
infrastructure may still be in it)."""

PURGE_BYTECODE = (
    "find /testbed -path /testbed/.venv -prune -o -path /testbed/r2e_tests -prune -o -name __pycache__ -type d "
    "-prune -exec rm -rf {} + -o -name '*.pyc' -type f -exec rm -f {} +"
)
"""Run as root before the hidden tests, in either grading place: Python loads a cached module whose header matches
the source's mtime and size without reading the source (`-B` only stops writing caches), so an agent could compile
its fix into the cache and put the unfixed source back; and a lone `.pyc` imports where no source exists."""

GRADER_DIR = "/run/swe-grader"
"""A small tmpfs in every container, empty during the episode: while the hidden tests run it holds the report
launcher (root's) and, in run/ (the test user's, mode 700), its key and report."""
TESTS_DIR = "/testbed/r2e_tests"
"""Where the hidden tests are while they run: in a fresh grading container a read-only bind mount (a mount point
cannot be renamed or removed, and a read-only one not written, even by root), so the tested code cannot put other
tests in their place; in the episode's own container (`grade_in: episode`) a root-owned copy."""

_PLACE_LAUNCHER = f"""set -e
mkdir -p {GRADER_DIR}/run
cat > {GRADER_DIR}/launcher.py
chmod 644 {GRADER_DIR}/launcher.py
chown "$1" {GRADER_DIR}/run
chmod 700 {GRADER_DIR}/run
"""
"""Run as root with the launcher on standard input; $1: the user the tests run as."""

_COPY_TESTS = """set -e
rm -rf /testbed/r2e_tests
cp -r /root/r2e_tests /testbed/r2e_tests
chown -R root:root /testbed/r2e_tests
chmod -R a+rX,go-w /testbed/r2e_tests
"""
"""Run as root before the hidden tests of an R2E-Gym row graded in the episode's own container."""

_KILL_ALL = (
    'for p in /proc/[0-9]*; do p=${p#/proc/}; case " 1 $$ $1 " in *" $p "*) ;; *) kill -9 "$p" 2>/dev/null;; esac; '
    "done; true"
)
"""Kills every process in the container but Docker's init (pid 1), the container's main process ($1: `sleep
infinity`, recorded when the container starts; init adopts orphans too, so its children are not enough) and
itself: how a root command is stopped without restarting the container (a restart empties the scratch places)."""

_READ_REPORT = f'r={GRADER_DIR}/run/report; if [ -f "$r" ] && [ ! -L "$r" ]; then exec cat -- "$r"; fi'
"""Read as the user the tests ran as, so a symlink left in the report's place leads nowhere that user cannot
read (and a FIFO there only costs the read's deadline)."""

_SETUP = """set -e
if [ "$2" = layer ] && [ -d /r2e_tests ]; then rm -rf /root/r2e_tests; mv /r2e_tests /root/r2e_tests; fi
if [ -f /testbed/run_tests.sh ]; then mv /testbed/run_tests.sh /root/run_tests.sh; fi
if [ "$3" = swebench ] && [ -f /run_tests.sh ]; then
    cp /run_tests.sh /root/run_tests.sh; chmod 700 /root/run_tests.sh; rm -f /run_tests.sh 2>/dev/null || true
fi
chmod 700 /root
if [ -d /testbed/.venv ]; then venv=/testbed/.venv; elif [ -d /opt/miniconda3/envs/testbed ]; then
    venv=/opt/miniconda3/envs/testbed; else venv=; fi
if [ -n "$venv" ] && [ ! -e /root/.venv ]; then
    ln -s "$venv" /root/.venv
    mkdir -p /root/.local/bin
    find "$venv/bin" -maxdepth 1 -type f -perm -u+x -exec ln -sf {} /root/.local/bin/ \\;
    for name in python python3; do if [ -e "$venv/bin/$name" ]; then ln -sf "$venv/bin/$name" /root/.local/bin/$name; fi; done
fi
find /testbed -name '*.pyc' -delete
find /testbed -name __pycache__ -type d -prune -exec rm -rf {} +
if [ "$3" = r2e ]; then
    test -d /root/r2e_tests || { echo "image has no /r2e_tests (hidden tests)" >&2; exit 3; }
    test -f /root/run_tests.sh || { echo "image has no /testbed/run_tests.sh" >&2; exit 3; }
else
    test -f /root/run_tests.sh || { echo "image has no /run_tests.sh (a SWE-bench image's test script)" >&2; exit 3; }
fi
if id -u "$1" >/dev/null 2>&1; then
    home=$(getent passwd "$1" | cut -d: -f6)
    if [ "$2" = scratch ] && [ ! -d "$home" ]; then mkdir -p "$home"; chown "$1:$(id -g "$1")" "$home"; fi
    id -u "$1"; id -g "$1"; echo "$home"
fi
"""
"""Run as root once the container runs; $1: the agent's user name, $2: `scratch` (tmpfs places, filled from the
image before this) or `layer` (the image's writable layer), $3: the row kind (`r2e` or `swebench`). The venv links
are R2E-Gym's (`setup_env`, `setup_env_swebench`)."""

SCRATCH_PLACES = {"/testbed": "755", "/tmp": "1777", "/var/tmp": "1777", "/root": "700", "/home": "755"}
"""The writable places of a scratch container (tmpfs over a read-only root filesystem), with their modes."""

_READ = (
    'size=$(stat -L -c %s -- "$1") || exit 1; '
    'if [ "$size" -gt "$2" ]; then echo "$1 is larger than $2 bytes" >&2; exit 1; fi; exec cat -- "$1"'
)

_PATH_KIND = (
    'if [ -d "$1" ]; then echo dir; elif [ -f "$1" ]; then echo file; '
    'elif [ -e "$1" ] || [ -L "$1" ]; then echo other; else echo missing; fi'
)


class DockerBackend:
    """One container per episode from the task's image (see the module docstring)."""

    repo_dir = "/testbed"

    def __init__(self, config: DockerConfig | None = None, client=None):
        self.config = config or DockerConfig()
        self.client = client or docker_client(self.config.start_timeout_s)
        cleanup_stale_containers(self.client)
        self.container = None
        self.main_pid = 0
        """The container's main process (`sleep infinity`) in its own pid namespace: kept when root commands are
        stopped."""
        self.user = "root"
        self.ids = (0, 0)
        self.home = "/root"
        self.task = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self, task, grading: bool = False) -> None:
        """Create the episode's container and move the hidden tests out of the agent's reach. `grading`: a fresh
        container for the hidden tests, with them mounted read-only at TESTS_DIR and twice the room in /testbed."""
        import docker

        self.close()
        self.task = task
        ensure_image(self.client, task, self.config)
        memory = memory_bytes(self.config.memory)
        tmpfs = {GRADER_DIR: "size=64m,nr_inodes=4096,mode=755"}
        mounts = []
        layout: dict = {}
        scratch = self.config.scratch_bytes if self.config.scratch else None
        if scratch is not None:  # tmpfs places sized to the image's content plus room; /r2e_tests masked
            content = place_sizes(self.client, task.docker_image)
            for path, mode in SCRATCH_PLACES.items():
                used, entries = content.get(path, (0, 0))
                room = 2 if grading and path == "/testbed" else 1
                inodes = entries + room * self.config.scratch_inodes
                tmpfs[path] = f"size={used + room * scratch},nr_inodes={inodes},mode={mode},exec"
                memory += used
            tmpfs["/r2e_tests"] = "size=64k,nr_inodes=16,mode=700"
            layout["read_only"] = True
        elif self.config.storage_size:
            layout["storage_opt"] = {"size": self.config.storage_size}
        if grading and task.kind != "swebench":
            hidden = hidden_tests_dir(self.client, task)
            mounts.append(docker.types.Mount(TESTS_DIR, str(hidden), type="bind", read_only=True))
        try:
            self.container = self.client.containers.create(
                task.docker_image,
                ["sleep", "infinity"],
                init=True,
                labels=owner_labels(),
                network_mode="none",
                mem_limit=memory,
                memswap_limit=memory,
                pids_limit=self.config.pids,
                nano_cpus=int(self.config.cpus * 1e9),
                working_dir=self.repo_dir,
                user="root",
                cap_drop=["ALL"],
                cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges:true"],
                ulimits=[
                    docker.types.Ulimit(
                        name="fsize", soft=self.config.file_size_bytes, hard=self.config.file_size_bytes
                    ),
                    docker.types.Ulimit(name="core", soft=0, hard=0),
                ],
                tmpfs=tmpfs,
                mounts=mounts,
                **layout,
            )
        except docker.errors.APIError as exc:
            raise SandboxError(f"task {task.task_id!r}: could not create a container: {exc}") from None
        own(self.container.id, self.client)
        try:
            with contextlib.ExitStack() as stack:
                seeds = []
                if scratch is not None:
                    # a created container's archive reads the image's files, not the tmpfs places mounted at start
                    for path in (*SCRATCH_PLACES, "/r2e_tests"):
                        seed = stack.enter_context(tempfile.TemporaryFile(prefix="swe-seed-"))
                        if self._archive(path, seed):
                            seed.seek(0)
                            seeds.append((seed, "/root" if path == "/r2e_tests" else posixpath.dirname(path)))
                self.container.start()
                self.main_pid = self._main_pid()
                for seed, into in seeds:  # the hidden tests' mount shows in a created container's archive
                    self._feed(
                        ["tar", "--anchored", "--no-wildcards", "--exclude=testbed/r2e_tests", "-xf", "-", "-C", into],
                        seed,
                        "could not fill the container's scratch",
                    )
            setup = self._exec(
                ["sh", "-c", _SETUP, "_", self.config.user, "layer" if scratch is None else "scratch", task.kind],
                self.config.file_op_timeout_s,
                user="root",
            )
            if setup.exit_code != 0:
                raise SandboxError(
                    f"task {task.task_id!r}: container setup failed (exit {setup.exit_code}): "
                    f"{(setup.stdout + setup.stderr).decode(errors='replace').strip()}"
                )
            fields = setup.stdout.decode(errors="replace").split()
            if len(fields) == 3:
                self.user, self.ids, self.home = self.config.user, (int(fields[0]), int(fields[1])), fields[2]
            else:
                self.user, self.ids, self.home = "root", (0, 0), "/root"
        except BaseException:
            self.close()
            raise

    def _archive(self, path: str, out) -> bool:
        """Write the tar of `path` in the container to the file `out`, chunk by chunk; False if it is absent. Of the
        image's files while the container is not started."""
        import docker

        with _engine_failures(f"reading {path} of the image: the Docker engine failed"):
            try:
                stream, _ = self.container.get_archive(path)
            except docker.errors.NotFound:
                return False
            for chunk in stream:
                out.write(chunk)
        return True

    def _feed(self, argv: Sequence[str], data, what: str, user: str = "root", deadline: float | None = None) -> None:
        """Run `argv` in the container with `data` (bytes, or a file read in chunks) on its standard input (the
        docker archive API cannot reach the tmpfs places); SandboxFileError with `what` and its error output unless
        it exits 0; SandboxError once `deadline` (time.monotonic) passes or if the engine fails."""
        with _engine_failures(f"{what}: the Docker engine failed"):
            api = self.client.api
            exec_id = api.exec_create(
                self.container.id,
                list(argv),
                stdin=True,
                stdout=True,
                stderr=True,
                user=user,
                workdir="/",
                environment=self._env(user),
            )["Id"]
            source = io.BytesIO(data) if isinstance(data, bytes) else data

            def chunks():
                for chunk in iter(lambda: source.read(1024**2), b""):
                    if deadline is not None and time.monotonic() > deadline:
                        raise SandboxError(f"{what}: grading passed its deadline (DockerConfig.grading_overhead_s)")
                    yield chunk

            with ExecStream(api, exec_id) as stream:
                stream.send(chunks())
                err = b"".join(data for kind, data in stream.frames() if kind == STDERR)
            code = api.exec_inspect(exec_id).get("ExitCode")
        if code != 0:
            raise SandboxFileError(f"{what}: {(err or b'').decode(errors='replace').strip() or f'exit {code}'}")

    def close(self) -> None:
        """Remove the container (processes and files)."""
        container, self.container = self.container, None
        if container is None:
            return
        disown(container.id)
        try:
            container.remove(force=True)
        except Exception as exc:
            import docker

            if not isinstance(exc, docker.errors.NotFound):
                raise

    # -- commands --------------------------------------------------------------------------------------------
    def _env(self, user: str) -> dict[str, str]:
        """The agent's environment, or the harness's (system PATH) for root commands of an unprivileged agent."""
        agent = user == self.user
        return {
            "PATH": SANDBOX_PATH if agent else SYSTEM_PATH,
            "HOME": self.home if agent else "/root",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TERM": "dumb",
        }

    def _exec(self, argv: Sequence[str], timeout: float, user: str | None = None, retry: bool = True) -> ExecResult:
        """Run `argv` under the supervisor as `user` (default: the agent) in /testbed."""
        with _engine_failures("the Docker engine failed"):
            return self._exec_unguarded(argv, timeout, user, retry)

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
        exec_id = api.exec_create(
            self.container.id,
            cmd,
            stdout=True,
            stderr=True,
            user=user,
            workdir=self.repo_dir,
            environment=self._env(user),
        )["Id"]
        out, err = OutputCapture(self.config.capture_bytes), OutputCapture(self.config.capture_bytes)
        state = {"overflow": False, "error": None}
        attention = threading.Event()  # set at the end of the stream or when the output passes the limit

        def pump() -> None:
            try:  # keep draining after an overflow: an unread stream can stall the engine's other execs
                with ExecStream(api, exec_id) as stream:
                    for kind, data in stream.frames():
                        if state["overflow"]:
                            continue
                        (out if kind == STDOUT else err).add(data)
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
        if not host_timeout and not state["overflow"]:
            reader.join(self.config.host_grace_s)  # the stream ended: the reader is on its last lines
        if reader.is_alive():
            self._stop_processes(user)
            reader.join(self.config.host_grace_s)
            if reader.is_alive():
                self._restart()
                reader.join(self.config.host_grace_s)
        info = api.exec_inspect(exec_id)
        code = info.get("ExitCode")
        raw = out.value() + err.value()
        if retry and (
            (code == 126 and b"OCI runtime exec failed" in raw) or (code == 125 and b"supervisor: cannot fork" in raw)
        ):
            # the command could not even start: the pids limit is full of leftovers (a killed supervisor)
            self._stop_processes(user)
            return self._exec_unguarded(argv, timeout, user, retry=False)
        if code is None or host_timeout or state["error"] is not None:
            code = -1
        return ExecResult(
            out.value(),
            err.value(),
            code,
            timed_out=host_timeout or code == 124,
            output_limited=state["overflow"],
            duration_s=time.monotonic() - started,
        )

    def _stop_processes(self, user: str) -> None:
        """Kill every process of `user` (as that user; for root, every process but the container's own two);
        restart the container if that is impossible."""
        try:
            argv = ["sh", "-c", "kill -9 -1"] if user != "root" else ["sh", "-c", _KILL_ALL, "_", str(self.main_pid)]
            code, output = run_short(self.client.api, self.container.id, argv, user)
            if code in (0, 1) and b"OCI runtime" not in output:
                return
        except Exception:
            pass
        self._restart()

    def _main_pid(self) -> int:
        """The container's main process (`sleep infinity`, the child of Docker's init), 0 if it cannot be read."""
        main = run_short(self.client.api, self.container.id, ["cat", "/proc/1/task/1/children"], "root")[1].split()
        return int(main[0]) if main and main[0].isdigit() else 0

    def _restart(self) -> None:
        """Kill all processes in the container and start it again. Its image layer's files stay; the scratch
        places are emptied with it, so a scratch container's episode cannot go on (SandboxError)."""
        self.container.restart(timeout=0)
        self.main_pid = self._main_pid()
        if self.config.scratch:
            raise SandboxError(
                "the container's processes could not be stopped (its pids limit is full?), and restarting it emptied "
                "its scratch places (DockerConfig.scratch)"
            )

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
            raise SandboxFileError(
                message.splitlines()[-1].replace("_: 1: ", "") if message else f"cannot write {path!r}"
            ) from None

    def path_kind(self, path: str) -> str:
        if not posixpath.isabs(path):
            raise SandboxFileError(f"The path {path!r} is not absolute.")
        result = self._exec(["sh", "-c", _PATH_KIND, "_", path], self.config.file_op_timeout_s)
        kind = result.stdout.decode(errors="replace").strip()
        if result.exit_code != 0 or kind not in ("dir", "file", "other", "missing"):
            raise SandboxError(f"could not inspect {path!r} (exit {result.exit_code})")
        return kind

    # -- grading ---------------------------------------------------------------------------------------------
    def run_tests(self, timeout: float, key: bytes | None = None, exempt: Sequence[str] = ()) -> TestRun:
        """Kill the agent's processes, then run the hidden tests on the agent's repository: in a fresh container
        from the task's image (`grade_in: fresh`: the agent's changes applied to the image's repository, its test
        infrastructure restored, `workdiff.py`; `exempt`: paths never restored) or in this one (`episode`);
        through `report_launcher.py` with `key` where the row's script runs `python -m pytest`, by the script
        as it is otherwise."""
        deadline = time.monotonic() + timeout + self.config.grading_overhead_s
        if self.user != "root":
            self._stop_processes(self.user)
        if self.config.grade_in == "episode":
            return self._run_hidden_tests(_before(deadline, timeout, "the tests"), key, fresh=False)
        with contextlib.ExitStack() as stack:
            agent_tar, original_tar, delta = (
                stack.enter_context(tempfile.TemporaryFile(prefix=f"swe-{what}-"))
                for what in ("agent", "original", "delta")
            )
            self._stream_out(["sh", "-c", TREE_OUT], agent_tar, deadline, "copying the agent's repository out")
            grader = DockerBackend(self.config, client=self.client)
            stack.callback(grader.close)
            grader.start(self.task, grading=True)
            _before(deadline, timeout, "reading the original repository")
            grader._stream_out(["sh", "-c", TREE_OUT], original_tar, deadline, "reading the original repository")
            original_tar.seek(0)
            agent_tar.seek(0)
            with TarTree(original_tar) as original, TarTree(agent_tar) as agent:
                plan = plan_grading(original, agent, exempt)
                flags = scan_plan(plan, original, agent)
                delta_tar(plan, original, agent, delta)
            delta.seek(0)
            _before(deadline, timeout, "copying the agent's changes in")
            grader._apply(plan, delta, deadline)
            run = grader._run_hidden_tests(_before(deadline, timeout, "the tests"), key, fresh=True)
            return replace(run, changes=plan.summary(), changed=tuple(plan.changed), flags=tuple(flags))

    def _apply(self, plan: GradingPlan, delta, deadline: float) -> None:
        """Remove what the agent removed from this (fresh) container's repository, then unpack the delta."""
        try:
            if plan.delete:
                paths = b"".join(os.fsencode(p) + b"\0" for p in plan.delete)
                self._feed(["bash", "-c", _DELETE], paths, "could not remove what the agent removed", deadline=deadline)
            self._feed(
                ["tar", "-xf", "-", "-C", "/testbed", "--numeric-owner"],
                delta,
                "could not copy the agent's changes in",
                deadline=deadline,
            )
        except SandboxFileError as exc:
            raise SandboxError(str(exc)) from None

    def _stream_out(
        self, argv: Sequence[str], out, deadline: float, what: str, limit: int | None = None, user: str = "root"
    ) -> None:
        """Write what `argv` (run as `user`) prints to the file `out`, chunk by chunk (docker-py's
        `exec_run(demux=True)` joins its chunks in quadratic time), at most `limit` bytes; SandboxError if the
        command fails or `deadline` (time.monotonic) passes."""
        with _engine_failures(f"{what}: the Docker engine failed"):
            self._stream_out_unguarded(argv, out, deadline, what, limit, user)

    def _stream_out_unguarded(
        self, argv: Sequence[str], out, deadline: float, what: str, limit: int | None, user: str
    ) -> None:
        api = self.client.api
        exec_id = api.exec_create(
            self.container.id, list(argv), stdout=True, stderr=True, user=user, workdir="/", environment=self._env(user)
        )["Id"]
        err = OutputCapture(64 * 1024)
        kept = 0
        with ExecStream(api, exec_id) as stream:
            for kind, data in stream.frames():
                if kind == STDOUT and (limit is None or kept < limit):
                    data = data if limit is None else data[: limit - kept]
                    out.write(data)
                    kept += len(data)
                elif kind == STDERR:
                    err.add(data)
                if time.monotonic() > deadline:
                    raise SandboxError(
                        f"grading passed its deadline while {what} ({kept} bytes so far; "
                        "DockerConfig.grading_overhead_s)"
                    )
        if api.exec_inspect(exec_id).get("ExitCode") != 0:
            raise SandboxError(f"{what} failed: {err.value().decode(errors='replace').strip()}")

    def _run_hidden_tests(self, timeout: float, key: bytes | None, fresh: bool) -> TestRun:
        """Run the row's test script as the agent's user: an R2E-Gym row's hidden tests at TESTS_DIR (mounted in a
        fresh grading container, copied in the episode's own), its `-m pytest` through `report_launcher.py` when
        there is a `key` and the script has one, the report read back; a SWE-bench image's script brings its own
        tests (it applies the test patch) and is read from its log with stderr interleaved, as R2E-Gym reads it
        (the log is cut at the echo of the test command, which `set -x` writes to stderr)."""
        purged = self._exec(["sh", "-c", PURGE_BYTECODE], self.config.file_op_timeout_s, user="root")
        if purged.exit_code != 0:
            raise SandboxError(f"could not remove the bytecode caches: {purged.stderr.decode(errors='replace')}")
        script = self._exec(["cat", "/root/run_tests.sh"], self.config.file_op_timeout_s, user="root")
        if script.exit_code != 0:
            raise SandboxError(f"could not read the test script: {script.stderr.decode(errors='replace')}")
        text = script.stdout.decode(errors="replace")
        if self.task.kind == "swebench":
            return TestRun(self._exec(["bash", "-c", 'exec 2>&1; eval "$1"', "_", text], timeout))
        if not fresh:
            copy = self._exec(["sh", "-c", _COPY_TESTS], self.config.file_op_timeout_s, user="root")
            if copy.exit_code != 0:
                raise SandboxError(f"could not copy the hidden tests: {copy.stderr.decode(errors='replace').strip()}")
        try:
            if key is None or not runs_pytest(text):
                return TestRun(self._exec(["bash", "-c", text], timeout))
            try:
                self._feed(
                    ["sh", "-c", _PLACE_LAUNCHER, "_", self.user],
                    LAUNCHER_PATH.read_bytes(),
                    "could not place the report launcher",
                )
                self._feed(
                    ["sh", "-c", 'umask 077 && cat > "$1"', "_", f"{GRADER_DIR}/run/key"],
                    key,
                    "could not place the report's key",
                    user=self.user,
                )
            except SandboxFileError as exc:
                raise SandboxError(str(exc)) from None
            log = self._exec(["bash", "-c", through_launcher(text)], timeout)
            if self.user != "root":  # nothing of the tests' may still be writing when the report is read
                self._stop_processes(self.user)
            report = io.BytesIO()
            try:
                self._stream_out(
                    ["sh", "-c", _READ_REPORT],
                    report,
                    time.monotonic() + self.config.file_op_timeout_s,
                    "reading the report",
                    limit=REPORT_MAX_BYTES,
                    user=self.user,
                )
            except SandboxError:
                return TestRun(log, None, launcher=True)
            return TestRun(log, report.getvalue() or None, launcher=True)
        finally:
            if not fresh:
                self._exec(["rm", "-rf", "/testbed/r2e_tests"], self.config.file_op_timeout_s, user="root")


@contextlib.contextmanager
def _engine_failures(message: str):
    """Turn the engine's failures (docker's and requests' errors, a broken socket) into SandboxError(message: ...),
    which ends the episode with the reason instead of raising out of env.step."""
    import docker
    import requests

    try:
        yield
    except (docker.errors.DockerException, requests.RequestException, ConnectionError) as exc:
        raise SandboxError(f"{message}: {type(exc).__name__}: {exc}") from None


def runs_pytest(script: str) -> bool:
    """Whether a row's test script runs `python -m pytest` (R2E-Gym's do; some run custom unittest runners, whose
    log is then read by R2E-Gym's rule)."""
    return "-m pytest" in script


def through_launcher(script: str) -> str:
    """The row's test script with its `-m pytest` run through the report launcher instead, so the tests run with
    the image's own interpreter, folder, flags and conftest files (R2E-Gym's: `.venv/bin/python -W ignore -m pytest
    -rA r2e_tests` from /testbed)."""
    return script.replace("-m pytest", f"{GRADER_DIR}/launcher.py {GRADER_DIR}/run/key {GRADER_DIR}/run/report", 1)


def _before(deadline: float, timeout: float, step: str) -> float:
    """The tests' deadline: `timeout`, or what is left of the whole grading's if less; SandboxError if nothing is
    left before `step`."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise SandboxError(f"grading passed its deadline before {step} (DockerConfig.grading_overhead_s)")
    return min(timeout, left)


def ensure_image(client, task, config: DockerConfig) -> None:
    """Make the task's image present by the pull policy; SandboxError saying why it cannot be had."""
    import docker

    try:
        client.images.get(task.docker_image)
        return
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.APIError as exc:
        raise SandboxError(f"task {task.task_id!r}: could not inspect image {task.docker_image!r}: {exc}") from None
    if config.pull == "never":
        raise SandboxError(
            f"task {task.task_id!r}: image {task.docker_image!r} is not present locally and "
            "docker.pull is 'never' (pull it, or build the shipped ones with "
            "`python -m trainer.environments.swe.image`)"
        )
    repository, _, tag = task.docker_image.rpartition(":")
    if not repository or "/" in tag:
        repository, tag = task.docker_image, "latest"
    try:
        for message in client.api.pull(repository, tag=tag, stream=True, decode=True):
            if isinstance(message, dict) and message.get("error"):  # a failure mid-stream does not raise
                raise RuntimeError(message["error"])
        client.images.get(task.docker_image)
    except Exception as exc:  # registry unreachable, not found, unauthorised, timed out: docker raises several types
        raise SandboxError(
            f"task {task.task_id!r}: image {task.docker_image!r} is absent and pulling it failed "
            f"({type(exc).__name__}: {str(exc).strip()[:300]}); is a registry reachable? "
            "`python -m trainer.environments.swe.pull --tasks FILE` lists a task file's absent "
            "images"
        ) from None


@dataclass(frozen=True)
class ImageFacts:
    """What the backend needs to know of an image before it creates a container from it."""

    place_sizes: dict[str, tuple[int, int]]
    """{scratch place: (bytes its files take in a tmpfs, entries)} of what the image has there."""
    hidden_tests: Path | None
    """A read-only host copy of the image's /r2e_tests (bind-mounted into grading containers); None without."""


_FACTS: dict[str, ImageFacts] = {}
_FACTS_LOCK = threading.Lock()
_FACTS_ROOT: list[Path] = []


def image_facts(client, image: str) -> ImageFacts:
    """`ImageFacts` of `image`, read once per image and process from a container that is created, never started,
    and removed (an image is immutable, so its id keys the cache)."""
    import docker

    image_id = client.images.get(image).id
    with _FACTS_LOCK:
        if image_id in _FACTS:
            return _FACTS[image_id]
    try:
        probe = client.containers.create(image, ["true"], labels=owner_labels(), network_mode="none")
    except docker.errors.APIError as exc:
        raise SandboxError(f"image {image!r}: could not create a container to read it: {exc}") from None
    own(probe.id, client)
    try:
        with _engine_failures(f"reading image {image!r}: the Docker engine failed"):
            sizes = {}
            for path in SCRATCH_PLACES:
                try:
                    stream, _ = probe.get_archive(path)
                except docker.errors.NotFound:
                    continue
                sizes[path] = _footprint(stream)
            hidden = None
            try:
                stream, _ = probe.get_archive("/r2e_tests")
            except docker.errors.NotFound:
                stream = None
            if stream is not None:
                hidden = _unpack_hidden_tests(stream, image_id)
    finally:
        disown(probe.id)
        with contextlib.suppress(Exception):
            probe.remove(force=True)
    facts = ImageFacts(sizes, hidden)
    with _FACTS_LOCK:
        return _FACTS.setdefault(image_id, facts)


def place_sizes(client, image: str) -> dict[str, tuple[int, int]]:
    return image_facts(client, image).place_sizes


def hidden_tests_dir(client, task) -> Path:
    """The host copy of the task image's hidden tests; SandboxError when the image has none."""
    hidden = image_facts(client, task.docker_image).hidden_tests
    if hidden is None:
        raise SandboxError(f"task {task.task_id!r}: image {task.docker_image!r} has no /r2e_tests (hidden tests)")
    return hidden


class _Chunks(io.RawIOBase):
    """A file over an iterator of byte chunks (docker-py's archive stream), for tarfile's stream mode."""

    def __init__(self, chunks):
        self._chunks, self._rest = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._rest:
            self._rest = next(self._chunks, None)
            if self._rest is None:
                self._rest = b""
                return 0
        n = min(len(buffer), len(self._rest))
        buffer[:n], self._rest = self._rest[:n], self._rest[n:]
        return n


def _footprint(chunks) -> tuple[int, int]:
    """(bytes, entries) a tar stream's files take in a tmpfs: whole pages per file, a page per folder and symlink
    (a margin: tmpfs keeps short links in the inode)."""
    page = 4096
    used = entries = 0
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks), 1 << 20), mode="r|") as tar:
        for member in tar:
            entries += 1
            used += -(-member.size // page) * page if member.isfile() else page
    return used, entries


def _unpack_hidden_tests(chunks, image_id: str) -> Path:
    """Unpack an image's /r2e_tests (the tar of get_archive) into this process's temporary folder, readable by
    every user (the tests may run as an unprivileged one) and writable by none."""
    if not _FACTS_ROOT:
        _FACTS_ROOT.append(Path(tempfile.mkdtemp(prefix="swe-hidden-tests-")))
        atexit.register(shutil.rmtree, _FACTS_ROOT[0], True)
    target = Path(tempfile.mkdtemp(prefix=image_id.replace(":", "-")[:24] + "-", dir=_FACTS_ROOT[0]))
    with tarfile.open(fileobj=io.BufferedReader(_Chunks(chunks), 1 << 20), mode="r|") as tar:
        for member in tar:
            name = posixpath.normpath(member.name)
            if name.startswith(("/", "..")) or not (member.isfile() or member.isdir()):
                continue  # hidden tests are files and folders; anything else is not copied to the host
            if member.isdir():
                (target / name).mkdir(parents=True, exist_ok=True)
            else:
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                with open(target / name, "wb") as handle:
                    shutil.copyfileobj(tar.extractfile(member), handle)
    root = target / "r2e_tests"
    root.mkdir(exist_ok=True)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    return root


def missing_images(client, tasks, config: DockerConfig, workers: int = 8) -> dict[str, str]:
    """{task id: why} for the tasks whose image cannot be had by the pull policy: each image tried once, `workers`
    pulls side by side (a cell's start on a node without its images waits for the slowest, not for their sum)."""
    from concurrent.futures import ThreadPoolExecutor

    images = {task.docker_image: task for task in tasks}

    def why(task) -> str | None:
        try:
            ensure_image(client, task, config)
            return None
        except SandboxError as exc:
            return str(exc).split(": ", 1)[-1]

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(images)))) as pool:
        reasons = dict(zip(images, pool.map(why, images.values())))
    return {task.task_id: reasons[task.docker_image] for task in tasks if reasons[task.docker_image] is not None}


def _last_line(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text.splitlines()[-1] if text else ""
