"""The workflow on a real SLURM cluster: the users' cluster command, through slurm/profile.yaml and sbatch.

`.ci/slurm-setup.sh` starts a one-node cluster (munged, slurmctld, slurmd on this host). The test runs
`snakemake --cores all --profile slurm` from the root of a copy of the repository, exactly as a user would,
on the smoke study cut to one model and two recipes (SLURM's status polling makes every job slow, so the grid
is kept tiny), and checks that every non-local job was a SLURM job that SLURM itself reports COMPLETED, and that
the cells, the summary and the figures came out. Outside CI it skips when no cluster answers; with CI=true a
missing cluster is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from workflow_runner import copy_repo

pytestmark = pytest.mark.slurm  # one shared cluster: CI runs these serially, after the parallel rest

SLURM_GRID = {
    "grid": [{"name": "slurm_test", "models": ["minicpm-tiny"], "recipes": ["spo_adam", "full"], "seeds": [0]}]
}
"""Merged into configs/smoke.yaml: 1 warm start + 2 cells + summary + figures = 5 SLURM jobs."""


def _require_cluster() -> None:
    problem = None
    if importlib.util.find_spec("snakemake_executor_plugin_slurm") is None:
        problem = "the snakemake slurm executor plugin is not installed"
    elif shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        problem = "no SLURM client (sbatch, sinfo); run `bash .ci/slurm-setup.sh` as root"
    else:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], check=False, capture_output=True, text=True, timeout=30)
        states = r.stdout.split()
        if r.returncode != 0 or not any(s.startswith(("idle", "mixed", "allocated")) for s in states):
            problem = (
                f"no SLURM node is up (sinfo: {(r.stdout + r.stderr).strip()!r}); run `bash .ci/slurm-setup.sh` as root"
            )
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true, so the SLURM tests must run, but: {problem}")
        pytest.skip(problem)


def snakemake_on_slurm(repo, *configfiles: str) -> str:
    """The users' cluster command from the copy's root; returns its output, after checking it succeeded."""
    # the profile's 20 s first poll is right for a real cluster; polling sooner only makes the test faster
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--cores",
            "all",
            "--profile",
            "slurm",
            "--configfile",
            *configfiles,
            "--slurm-init-seconds-before-status-checks",
            "2",
        ],
        check=False,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
def test_smoke_grid_runs_as_slurm_jobs_through_the_profile(tmp_path):
    _require_cluster()
    repo = copy_repo(tmp_path / "repo")
    (repo / "slurm_grid.yaml").write_text(yaml.safe_dump(SLURM_GRID))
    out = snakemake_on_slurm(repo, "configs/smoke.yaml", "slurm_grid.yaml")

    submitted = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", out)
    rules = sorted(rule for _, rule in submitted)
    assert rules == ["figures", "summarize", "train", "train", "warm_start"], out[-4000:]
    for jobid, rule in submitted:  # MinJobAge=600 keeps finished jobs visible to squeue
        state = subprocess.run(
            ["squeue", "-h", "--states=all", "-j", jobid, "-o", "%T"],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
        assert state == "COMPLETED", (jobid, rule, state)

    study = repo / "studies" / "smoke"  # configs/smoke.yaml's workdir
    for recipe, optimizer in (("spo_adam", "adam"), ("full", "muon")):
        cell = study / f"results/cells/model=minicpm-tiny/recipe={recipe}/optimizer={optimizer}/seed=0"
        assert (cell / "metrics.parquet").stat().st_size > 0 and (cell / "episodes.parquet").is_file()
    assert not (study / "results/cells/model=qwen-tiny").exists()
    assert (study / "results/summary.csv").stat().st_size > 0
    for fig in ("fig2", "fig3", "fig4", "fig5", "diagnostics"):
        for ext in ("png", "pdf"):
            assert (study / "figures" / f"{fig}.{ext}").stat().st_size > 0
    assert not (repo / "results").exists() and not (study / "studies").exists()


COMPANION_GRID = {
    "grid": [
        {"name": "slurm_muon", "recipes": ["gigpo"], "optimizer": "muon", "seeds": [0]},
        {"name": "slurm_control", "recipes": ["grpo"], "optimizer": "adam_high_lr", "seeds": [0]},
    ]
}
"""Merged into configs/companion-smoke.yaml: 1 warm start + 2 cells + summary + figures, in the study's workdir."""


@pytest.mark.slow
def test_companion_smoke_runs_as_slurm_jobs_in_its_own_workdir(tmp_path):
    """A study with a `workdir` on SLURM: the jobs start in that folder and must not apply it a second time."""
    _require_cluster()
    repo = copy_repo(tmp_path / "repo")
    (repo / "companion_grid.yaml").write_text(yaml.safe_dump(COMPANION_GRID))
    snakemake_on_slurm(repo, "configs/companion-smoke.yaml", "companion_grid.yaml")
    study = repo / "studies" / "companion-smoke"
    for recipe, optimizer in (("gigpo", "muon"), ("grpo", "adam_high_lr")):
        cell = study / f"results/cells/model=qwen2.5-tiny/recipe={recipe}/optimizer={optimizer}/seed=0"
        assert (cell / "metrics.parquet").stat().st_size > 0
    for fig in ("companion_curves", "companion_bars", "companion_diagnostics"):
        assert (study / "figures" / f"{fig}.png").stat().st_size > 0
    assert not (study / "studies").exists() and not (repo / "results").exists()


@pytest.mark.slow
def test_a_two_process_cell_runs_as_one_slurm_job(tmp_path):
    """`resources.train.processes: 2`: the cell's job asks SLURM for both processes' cores and runs the trainer under
    torchrun, the update sharded over the two (its log says so)."""
    _require_cluster()
    repo = copy_repo(tmp_path / "repo")
    grid = {
        "grid": [{"name": "sharded", "models": ["minicpm-tiny"], "recipes": ["full"], "seeds": [0]}],
        "resources": {"train": {"threads": 1, "processes": 2}},
    }
    (repo / "sharded.yaml").write_text(yaml.safe_dump(grid))
    cell = "results/cells/model=minicpm-tiny/recipe=full/optimizer=muon/seed=0"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--cores",
            "all",
            "--profile",
            "slurm",
            "--configfile",
            "configs/smoke.yaml",
            "sharded.yaml",
            "--slurm-init-seconds-before-status-checks",
            "2",
            f"{cell}/metrics.parquet",
        ],  # in the workdir
        check=False,
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    jobs = re.findall(r"has been submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", out)
    train = [jobid for jobid, rule in jobs if rule == "train"]
    assert len(train) == 1, out[-4000:]
    cpus = subprocess.run(
        ["squeue", "-h", "--states=all", "-j", train[0], "-o", "%C %T"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    assert cpus == ["2", "COMPLETED"], cpus
    study = repo / "studies" / "smoke"
    assert "sharded with FSDP2 over 2 processes" in (study / cell / "train.log").read_text()
    assert (study / cell / "metrics.parquet").stat().st_size > 0
