"""Ownership of the Docker backend's containers, the removal of stale ones, and the engine client.

Apart from the backend because it concerns every container on the machine, not one episode's: containers carry the
labels `harness.swe=1`, the owner's pid, pid start time and host name. `cleanup_stale_containers()` removes labelled
containers whose owner process is gone (called whenever a backend is created), the backend's `close()` removes its
container, and an `atexit` hook removes any this process still holds. A trainer killed by a signal (SIGKILL, or
SIGTERM without a handler) leaves its containers until the next backend starts anywhere on the machine.
"""

from __future__ import annotations

import atexit
import os
import socket
import threading

from trainer.environments.swe.sandbox import SandboxError
from trainer.process import process_start_time

LABEL = "harness.swe"
"""Every container the Docker backend creates carries LABEL=1 and the owner labels (`owner_labels`)."""

_OWNED: dict[str, object] = {}
"""Container id -> docker client, for containers this process created and has not removed yet (atexit)."""
_OWNED_LOCK = threading.Lock()


def owner_labels() -> dict[str, str]:
    """The labels of a container this process creates: LABEL=1 and who owns it."""
    pid = os.getpid()
    return {
        LABEL: "1",
        f"{LABEL}.owner_pid": str(pid),
        f"{LABEL}.owner_start": process_start_time(pid) or "",
        f"{LABEL}.owner_host": socket.gethostname(),
    }


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
    """Remove containers labelled by the Docker backend whose owner process is gone; returns their ids."""
    import docker

    removed = []
    # the low-level listing: `containers.list` inspects each container it lists, and raises NotFound when another
    # thread removes one of them in between
    for container in client.api.containers(all=True, filters={"label": f"{LABEL}=1"}):
        if _owner_alive(container.get("Labels") or {}):
            continue
        try:
            client.api.remove_container(container["Id"], force=True)
            removed.append(container["Id"])
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress elsewhere
                raise
    return removed


def own(container_id: str, client) -> None:
    """Record a container this process created, for the atexit hook to remove if nothing else does."""
    with _OWNED_LOCK:
        _OWNED[container_id] = client


def disown(container_id: str) -> None:
    """Forget a container this process is about to remove itself."""
    with _OWNED_LOCK:
        _OWNED.pop(container_id, None)


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
