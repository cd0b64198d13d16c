"""Provenance: what a log file must carry so that any figure made from it can be traced and re-run.

Every Parquet file the trainer writes embeds the dict built here (modded-nanogpt's habit of logs that carry
their own code revision, versions and hardware). Choices and why:

* **Never crash.** Provenance is a side channel: a missing `git`, a copy of the package outside any checkout,
  an unreadable /proc/cpuinfo or an absent optional package must not stop a training run. Each such field
  falls back to "unknown" (or is omitted, for packages that are not installed).
* **The git revision is the project's, not the working directory's.** We ask git about the directory that
  holds the `trainer/` package, and accept the answer only if that directory is the top level of the
  checkout. So a package installed into a virtual environment that happens to sit inside some other git
  repository does not report that repository's commit.
* **"Dirty" follows `git describe --dirty`:** modified or staged tracked files count, untracked files do not
  (results/ and scratch files would otherwise mark every run dirty).
* **Versions come from package metadata**, not from importing the packages: importing transformers or
  snakemake just to read a version string would cost seconds.
* **JSON only.** The config is converted once here (dataclasses, paths, tuples and numpy scalars become their
  JSON forms); anything else raises a TypeError naming where in the config it sits, so a log never fails to
  write at the first flush because of an odd config value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path, PurePath
from typing import Any

PACKAGES = ("torch", "numpy", "pandas", "pyarrow", "transformers", "tokenizers", "snakemake")
"""Distributions whose versions are recorded (those installed; missing ones are omitted)."""

PROJECT_ROOT = Path(__file__).resolve().parents[2]
"""The directory that holds the `trainer/` package: the project's checkout when run from one."""

UNKNOWN = "unknown"


def to_json(value: Any, where: str = "config") -> Any:
    """`value` as plain JSON types (dict with str keys, list, str, int, float, bool, None).

    Dataclass instances become dicts, tuples lists, paths strings, numpy scalars Python scalars.
    Anything else raises TypeError naming its place (`where`, e.g. "config.optim.betas[1]").
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where}: key {key!r} is a {type(key).__name__}, JSON needs str keys")
            out[key] = to_json(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [to_json(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, PurePath):
        return str(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return to_json(value.item(), where)
    raise TypeError(f"{where}: {type(value).__name__} value {value!r} is not JSON-serialisable")


def _git(*args: str) -> str | None:
    """stdout of `git -C PROJECT_ROOT args...`, or None on any failure (no git, not a checkout, timeout)."""
    try:
        done = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *args], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_revision() -> dict:
    """{"commit": hash, "dirty": bool}; {"commit": "unknown", "dirty": "unknown"} outside a checkout."""
    top = _git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != PROJECT_ROOT:
        return {"commit": UNKNOWN, "dirty": UNKNOWN}
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit or UNKNOWN, "dirty": UNKNOWN if status is None else status != ""}


def package_versions() -> dict:
    """Python's version and those of the installed packages among PACKAGES."""
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


LOCK_FILE = PROJECT_ROOT / "requirements.lock"
"""The constraints README's install uses (envs/lock.sh writes them)."""


def read_lock(path: Path = LOCK_FILE) -> dict[str, str]:
    """{normalised package name: version} of a constraints file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[_normalised(name)] = version.strip()
    return pins


def _normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().strip()


def lock_state(path: Path = LOCK_FILE) -> dict:
    """Which lock the environment was installed from, and where it is not that: the file's sha256 and every
    installed package whose version differs from its pin ({} without a lock file). Locked packages that are not
    installed (an install without the test extras) are no difference in what ran."""
    if not path.is_file():
        return {}
    installed = {_normalised(d.metadata["Name"]): d.version for d in metadata.distributions() if d.metadata["Name"]}
    differ = {}
    for name, version in read_lock(path).items():
        have = installed.get(name)
        if have is not None and have.split("+", 1)[0] != version:
            differ[name] = have
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "differ": differ}


def _cpuinfo() -> dict[str, str]:
    """The first value of each key of /proc/cpuinfo (the first CPU's), empty where it cannot be read."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "asimd", "sve")
"""CPU features that decide which matmul kernels torch runs, and so the last bits of every number: a rerun is
bit-identical only where these match (two EPYC machines gave different warm starts from the same code and
packages)."""


KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")
"""Environment variables that cap the instruction set of torch's own kernels, oneDNN's and MKL's. Capped, a newer
CPU runs an older kind's kernels (a Zen 4 EPYC capped at AVX2 makes the AVX2 EPYC's warm start bit for bit), so a
run's kernels are its CPU features and these together."""


def kernel_kind(hardware: dict) -> dict:
    """The part of a cell's hardware that decides its kernels: CPU features, and the caps where any was set."""
    features = hardware.get("cpu_features")
    kind = {"cpu_features": None if features is None else sorted(features)}
    if hardware.get("kernel_caps"):
        kind["kernel_caps"] = dict(sorted(hardware["kernel_caps"].items()))
    return kind


def kernel_level(hardware: dict) -> str | None:
    """The instruction set torch's kernels run at: the cap where one is set, else the best the CPU has (None where
    no features were recorded)."""
    cap = (hardware.get("kernel_caps") or {}).get("ATEN_CPU_CAPABILITY")
    features = hardware.get("cpu_features")
    if cap:
        return cap.lower()
    if features is None:
        return None
    return "avx512" if "avx512f" in features else "avx2" if "avx2" in features else "default"


def hardware() -> dict:
    """Platform, CPU model, kernel-relevant features and caps, torch's kernel level, logical cores, torch threads and
    CUDA device names (empty list without CUDA)."""
    cpu = _cpuinfo()
    model = next((cpu[k] for k in ("model name", "Model", "Hardware", "cpu model") if cpu.get(k)), None)
    flags = (cpu.get("flags") or cpu.get("Features") or "").split()
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": model or platform.processor() or UNKNOWN,
        "cpu_features": [flag for flag in KERNEL_FLAGS if flag in flags],
        "kernel_caps": {name: os.environ[name] for name in KERNEL_CAPS if os.environ.get(name)},
        "cpu_capability": None,
        "logical_cores": os.cpu_count(),
        "torch_threads": None,
        "cuda_devices": [],
    }
    try:
        import torch

        info["torch_threads"] = torch.get_num_threads()
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        if torch.cuda.is_available():
            info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # provenance never stops a run; say what went wrong instead
        info["torch_error"] = f"{type(exc).__name__}: {exc}"
    return info


def collect_provenance(config: dict) -> dict:
    """Config, trainer version, git revision, package versions, hardware, hostname, command line and UTC time, as
    JSON types."""
    from trainer import TRAINER_VERSION  # the package's __init__ imports nothing

    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    return {
        "config": to_json(config),
        "trainer_version": TRAINER_VERSION,
        "git": git_revision(),
        "versions": package_versions(),
        "lock": lock_state(),
        "hardware": hardware(),
        "hostname": socket.gethostname(),
        "argv": list(sys.argv),
        "timestamp_utc": datetime.now(UTC).isoformat(),
    }
