"""Build the Docker images of the shipped tasks locally (no registry is needed or used).

    python -m trainer.environments.swe.image [--tasks FILE] [--mirror URL] [--force]

Two steps, each skipped when its content-hash tag already exists:
1. Base image `swe-harness-base:<recipe hash>`: `debootstrap --variant=minbase` of Debian bookworm with python3
   and python3-pytest, an unprivileged user `agent` (uid 1000) added, apt caches, docs, man pages and locales
   removed (about 130 MB), then `docker import`. Needs root, debootstrap and a Debian mirror (about a minute).
2. One image per task, `FROM` the local base tag (the classic builder does not pull a local tag) with a single
   `ADD task.tar /` layer in R2E-Gym's layout: the repository at /testbed owned by `agent`, the hidden tests at
   /r2e_tests (root, mode 700) and /testbed/run_tests.sh (root). The backend moves both to /root before the
   agent's first command. The image is tagged `<repository>:<content hash>` (hash of the base tag, every file of
   the repository fixture and the hidden tests, run_tests.sh and the Dockerfile) and also with the task's
   `docker_image` name, so an unchanged task is never rebuilt and a changed one always is.
Why one image per task rather than one image holding every repository: it keeps R2E-Gym's contract (a task
names its image; /testbed is ready in it), so the backend has one code path for our images and R2E-Gym's.
The price is one layer (a full copy under the vfs storage driver, ~8 s) per task.
Gold patches never enter an image.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trainer.environments.swe.grading import pytest_command
from trainer.environments.swe.tasks import SWETask, check_tree, impossible_variant, load_tasks, shipped_tasks_path

BASE_REPOSITORY = "swe-harness-base"
DEBIAN_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pytest")
AGENT_USER = "agent"
AGENT_UID = 1000
TRIMMED = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
)
RECIPE_VERSION = 1
"""Bump to force a rebuild of the base image when the recipe changes in a way the constants do not show."""
DEFAULT_MIRROR = "http://deb.debian.org/debian"
RUN_TESTS_SH = (
    "#!/bin/sh\n# Hidden-test command of the swe harness (run as the agent user from /testbed).\n"
    + pytest_command(python="python3", testbed="/testbed")
    + "\n"
)


def _log(message: str) -> None:
    print(f"[swe-image] {message}", file=sys.stderr, flush=True)


def base_tag() -> str:
    """`swe-harness-base:<hash of the recipe>`."""
    recipe = json.dumps([DEBIAN_SUITE, BASE_PACKAGES, AGENT_USER, AGENT_UID, TRIMMED, RECIPE_VERSION])
    return f"{BASE_REPOSITORY}:{hashlib.sha256(recipe.encode()).hexdigest()[:12]}"


def _split_name(image: str) -> tuple[str, str]:
    """ "repo/name:tag" -> ("repo/name", "tag"); no tag -> "latest"."""
    repository, sep, tag = image.rpartition(":")
    if not sep or "/" in tag:
        return image, "latest"
    return repository, tag


def _image_exists(client, name: str) -> bool:
    import docker

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/mounts") as fh:
        points = [line.split()[1] for line in fh]
    return sorted((p for p in points if p == str(path) or p.startswith(f"{path}/")), reverse=True)


def build_base_image(client, mirror: str = DEFAULT_MIRROR, force: bool = False) -> str:
    """Build (or find) the base image; returns its tag."""
    tag = base_tag()
    if not force and _image_exists(client, tag):
        _log(f"base image {tag} exists")
        return tag
    if os.geteuid() != 0:
        raise RuntimeError("building the base image needs root (debootstrap and chroot)")
    if shutil.which("debootstrap") is None:
        raise RuntimeError("building the base image needs debootstrap (apt-get install -y debootstrap)")
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="swe-rootfs-"))
    rootfs = workdir / "rootfs"
    try:
        _log(f"debootstrap {DEBIAN_SUITE} from {mirror} (about a minute)")
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [
                "chroot",
                str(rootfs),
                "useradd",
                "--create-home",
                "--uid",
                str(AGENT_UID),
                "--user-group",
                "--shell",
                "/bin/bash",
                AGENT_USER,
            ],
            check=True,
        )
        for relative in TRIMMED:
            target = rootfs / relative
            if target.is_dir():
                for child in target.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        archive = workdir / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-c", "-f", str(archive), "."], check=True)
        repository, version = _split_name(tag)
        client.api.import_image_from_file(str(archive), repository=repository, tag=version)
    finally:
        for point in _mounts_under(workdir):  # debootstrap unmounts /proc and /sys itself unless it failed
            subprocess.run(["umount", "-l", point], check=False)
        if not _mounts_under(workdir):
            shutil.rmtree(workdir, ignore_errors=True)
    _log(f"built {tag} in {time.monotonic() - started:.0f}s")
    return tag


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, uid: int, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.uid = info.gid = uid
    info.mode, info.mtime = mode, 0
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _tree(root: Path) -> list[Path]:
    """Files and directories under root, sorted, without caches."""
    return sorted(
        p
        for p in root.rglob("*")
        if "__pycache__" not in p.parts and p.suffix != ".pyc" and ".pytest_cache" not in p.parts
    )


def task_archive(task: SWETask) -> bytes:
    """The task's files in R2E-Gym's layout, as the tar the image's single ADD unpacks at /."""
    if task.repo_path is None or task.hidden_tests_path is None:
        raise ValueError(f"task {task.task_id!r} has no repo_path/hidden_tests_path to build an image from")
    check_tree(task.repo_path, f"task {task.task_id!r} repo_path")
    check_tree(task.hidden_tests_path, f"task {task.task_id!r} hidden_tests_path")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "testbed", None, AGENT_UID, 0o755)
        for path in _tree(Path(task.repo_path)):
            name = "testbed/" + path.relative_to(task.repo_path).as_posix()
            mode = 0o755 if path.is_dir() or os.access(path, os.X_OK) else 0o644
            _add(tar, name, None if path.is_dir() else path.read_bytes(), AGENT_UID, mode)
        _add(tar, "testbed/run_tests.sh", RUN_TESTS_SH.encode(), 0, 0o644)
        _add(tar, "r2e_tests", None, 0, 0o700)
        for path in _tree(Path(task.hidden_tests_path)):
            name = "r2e_tests/" + path.relative_to(task.hidden_tests_path).as_posix()
            _add(tar, name, None if path.is_dir() else path.read_bytes(), 0, 0o755 if path.is_dir() else 0o644)
    return buffer.getvalue()


def task_dockerfile(task: SWETask, base: str) -> str:
    return f"FROM {base}\nADD task.tar /\nWORKDIR /testbed\nLABEL harness.swe.task={json.dumps(task.task_id)}\n"


def task_image_tag(task: SWETask, base: str) -> str:
    """`<repository of docker_image>:<content hash>`."""
    digest = hashlib.sha256()
    digest.update(task_dockerfile(task, base).encode())
    digest.update(task_archive(task))
    return f"{_split_name(task.docker_image)[0]}:{digest.hexdigest()[:12]}"


def build_task_image(client, task: SWETask, base: str, force: bool = False) -> str:
    """Build (or find) the task's image, tag it also as task.docker_image; returns the content-hash tag."""
    tag = task_image_tag(task, base)
    if force or not _image_exists(client, tag):
        started = time.monotonic()
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            _add(tar, "Dockerfile", task_dockerfile(task, base).encode(), 0, 0o644)
            _add(tar, "task.tar", task_archive(task), 0, 0o644)
        context.seek(0)
        client.images.build(
            fileobj=context, custom_context=True, tag=tag, rm=True, forcerm=True, network_mode="none", pull=False
        )
        _log(f"built {tag} ({task.task_id}) in {time.monotonic() - started:.0f}s")
    else:
        _log(f"image {tag} ({task.task_id}) exists")
    repository, version = _split_name(task.docker_image)
    client.images.get(tag).tag(repository, version)
    return tag


def ensure_images(
    tasks_path: str | Path | None = None,
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
    client=None,
    workers: int = 3,
) -> dict[str, str]:
    """Build whatever is missing for the tasks in `tasks_path` (default: the shipped ones) and for the cheating
    probe's impossible variants of their held-out tasks (`tasks.impossible_variant`); {task_id: tag}.

    Task images build `workers` at a time: each build is mostly the engine copying the base layer (vfs), so a
    few in parallel finish sooner than one after another (about 50 s instead of 80 s for six on two busy cores).
    """
    from trainer.environments.swe.containers import docker_client

    client = client or docker_client(timeout=600)
    tasks = load_tasks(tasks_path or shipped_tasks_path())
    tasks += [v for v in map(impossible_variant, (t for t in tasks if t.split == "heldout")) if v is not None]
    base = build_base_image(client, mirror=mirror, force=force)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(tasks)))) as pool:
        tags = list(pool.map(lambda task: build_task_image(client, task, base, force=force), tasks))
    return {task.task_id: tag for task, tag in zip(tasks, tags)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.environments.swe.image", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", default=None, help="task file (.jsonl/.parquet); default: the shipped tasks")
    parser.add_argument(
        "--mirror",
        default=os.environ.get("SWE_DEBIAN_MIRROR", DEFAULT_MIRROR),
        help="Debian mirror for debootstrap (env SWE_DEBIAN_MIRROR)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when the content-hash tags exist")
    parser.add_argument("--workers", type=int, default=3, help="task images built at once (default 3)")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    try:
        tags = ensure_images(args.tasks, mirror=args.mirror, force=args.force, workers=args.workers)
    except Exception as exc:
        _log(f"failed: {type(exc).__name__}: {exc}")
        return 1
    for task_id, tag in tags.items():
        print(f"{task_id}\t{tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
