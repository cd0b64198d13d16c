"""What the workflow tests share: the repository's copy, Snakemake as a subprocess, its job table, a study file as
the workflow reads it. A plain module (`from workflow_runner import ...`), not conftest."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import trainer.study as cc

REPO = Path(__file__).resolve().parents[1]
COPIED = ["Snakefile", "config.yaml", "configs", "workflow", "envs", "slurm", "trainer"]
"""What a temporary copy of the repository needs to run the workflow from its root."""


def read_study(name: str) -> dict:
    """A study file as the workflow reads it: with its `base` study merged under it."""
    return cc.resolve_base(yaml.safe_load((REPO / name).read_text()), root=REPO, source=REPO / name)


def require_snakemake() -> None:
    if importlib.util.find_spec("snakemake") is None:
        message = "Snakemake is not installed in this interpreter (pip install -e .)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the workflow tests must run, but: {message}")
        pytest.skip(message)


def copy_repo(dest: Path) -> Path:
    """The files the workflow needs, copied to `dest` (no results, no .snakemake, no caches)."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`snakemake ARGS` from the copy's root, with this interpreter (its virtual environment need not be active)."""
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        check=False,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_counts(output: str) -> dict[str, int]:
    """The 'Job stats' table of a snakemake run or dry-run, as {rule: count}."""
    table = output.split("Job stats:", 1)[1]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.MULTILINE) if m[1] != "total"}


def require_slurm_nodes(partition: str, count: int, setup: str) -> None:
    """Skip (fail under CI=true) unless SLURM's `partition` has `count` nodes up; `setup` is the script that
    starts them, named in the message."""
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        problem = "the snakemake slurm executor plugin is not installed"
    elif shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        problem = f"no SLURM client (sbatch, sinfo); run `bash {setup}` as root"
    else:
        r = subprocess.run(
            ["sinfo", "-h", "-N", "-p", partition, "-o", "%N %T"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        states = [line.split() for line in r.stdout.splitlines()]
        up = [s[0] for s in states if len(s) == 2 and s[1].startswith(("idle", "mixed", "allocated"))]
        problem = None
        if r.returncode != 0 or len(up) < count:
            problem = (
                f"SLURM partition {partition!r} has {len(up)} of {count} nodes up "
                f"(sinfo: {(r.stdout + r.stderr).strip()!r}); run `bash {setup}` as root"
            )
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the SLURM tests must run, but: {problem}")
        pytest.skip(problem)
