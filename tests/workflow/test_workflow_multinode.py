"""A cell over two nodes: `resources.train.nodes: 2` on a real two-node SLURM cluster.

`.ci/slurm-two-nodes.sh` adds partition "two" to `.ci/slurm-setup.sh`'s cluster: nodes harness-n1 and harness-n2,
each a slurmd in namespaces of its own on this machine (its own hostname, pid space and /proc; 127.0.0.2 and
127.0.0.3 on the loopback). The slow test runs the users' cluster command (`snakemake --profile slurm`) for one
2-node x 1-process cell (gloo on CPU), checks that it trained on both nodes, runs it again and kills its torchrun
on the second node (SIGKILL) after a checkpoint, and checks that the job ends on both nodes, leaves no process,
is resubmitted by the profile's retry, resumes after its newest checkpoint and ends with the uninterrupted run's
metrics (timing columns aside). Outside CI it skips when the two nodes are not up; with CI=true that fails.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml
from builders import metrics_of
from workflow_runner import copy_repo, require_slurm_nodes, require_snakemake, snakemake

from trainer.process import process_start_time

NODES = ("harness-n1", "harness-n2")
"""The nodes of partition "two" (.ci/slurm-setup.sh writes them, .ci/slurm-two-nodes.sh starts them)."""
SETUP = ".ci/slurm-two-nodes.sh"
TWO_NODES = {
    "grid": [{"name": "two_nodes", "models": ["minicpm-tiny"], "recipes": ["full"], "seeds": [0]}],
    "resources": {"train": {"threads": 1, "processes": 1, "nodes": 2}},
    "cell": {"run": {"updates": 6}},  # ~2 s an update here: time to kill the cell between checkpoints
}
"""Merged into configs/smoke.yaml: one cell, one process on each of two nodes, a checkpoint after every update."""
CELL = "results/cells/model=minicpm-tiny/recipe=full/optimizer=muon/seed=0"
"""The cell's folder in the smoke study's workdir (studies/smoke)."""
TARGET = f"{CELL}/metrics.parquet"
CHECKPOINT = re.compile(r"ckpt-(\d+)\.pt")


def _snakemake_args(*extra: str) -> list[str]:
    """The users' cluster command for the cell, its train job sent to partition "two"."""
    return [
        sys.executable,
        "-m",
        "snakemake",
        TARGET,
        "--cores",
        "all",
        "--profile",
        "slurm",
        "--configfile",
        "configs/smoke.yaml",
        "two_nodes.yaml",
        "--slurm-init-seconds-before-status-checks",
        "2",
        *extra,
        "--set-resources",
        "train:slurm_partition=two",
    ]


def _train_jobs(output: str) -> list[str]:
    return [
        j
        for j, rule in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/slurm_logs/rule_(\w+)/", output)
        if rule == "train"
    ]


def _job(jobid: str) -> list[str]:
    """[state, node list, node count] of a job (MinJobAge=600 keeps a finished one visible to squeue)."""
    return subprocess.run(
        ["squeue", "-h", "--states=all", "-j", jobid, "-o", "%T %N %D"],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()


def _cell_processes(workdir: Path) -> list[dict]:
    """The processes that run `-m trainer train` in `workdir` (srun, the torchrun agents, the trainer workers; on
    either node: the nodes' pid spaces are nested in this one), with the node and job that SLURM gave each and
    the namespaces each runs in."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"trainer" not in argv or Path(os.readlink(entry / "cwd")) != workdir:
                continue
            env = dict(v.split(b"=", 1) for v in (entry / "environ").read_bytes().split(b"\0") if b"=" in v)
            python = Path(argv[0].decode()).name.startswith("python")
            found.append(
                {
                    "pid": int(entry.name),
                    "kind": ("agent" if b"torch.distributed.run" in argv else "worker") if python else "other",
                    "node": env.get(b"SLURMD_NODENAME", b"").decode(),
                    "job": env.get(b"SLURM_JOB_ID", b"").decode(),
                    "pid_ns": os.readlink(entry / "ns" / "pid"),
                    "uts_ns": os.readlink(entry / "ns" / "uts"),
                }
            )
        except OSError:  # gone meanwhile
            continue
    return [p for p in found if process_start_time(p["pid"]) is not None]  # zombies write nothing


def _checkpoints(folder: Path) -> dict[int, tuple[int, int]]:
    """{step: (inode, mtime)} of the full-format checkpoints in `folder`."""
    found = {}
    for path in folder.glob("ckpt-*.pt"):
        m = CHECKPOINT.fullmatch(path.name)
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if m:
            found[int(m[1])] = (stat.st_ino, stat.st_mtime_ns)
    return found


def _wait(what: str, until, proc: subprocess.Popen, log: Path, timeout: float):
    """Poll `until()` (every 0.1 s) until it returns something true; fail naming `what` if `proc` (whose output
    goes to `log`) ends first or the time runs out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        got = until()
        if got:
            return got
        if proc.poll() is not None:
            pytest.fail(f"snakemake ended before {what}:\n{log.read_text()[-4000:]}")
        time.sleep(0.1)
    pytest.fail(f"no {what} after {timeout} s:\n{log.read_text()[-4000:]}")


@pytest.mark.slow
@pytest.mark.slurm
def test_a_two_node_cell_trains_on_both_is_killed_on_one_and_resumes_identically(tmp_path):
    """The users' cluster command, twice: uninterrupted, then killed on the second node and resubmitted by the
    profile's `retries: 1` (about 2.5 minutes on two cores)."""
    require_slurm_nodes("two", len(NODES), SETUP)
    repo = copy_repo(tmp_path / "repo")
    (repo / "two_nodes.yaml").write_text(yaml.safe_dump(TWO_NODES))
    study = (repo / "studies" / "smoke").resolve()  # configs/smoke.yaml's workdir
    cell = study / CELL

    # 1. uninterrupted: one SLURM job over both nodes, one process group of two
    r = subprocess.run(_snakemake_args(), check=False, cwd=repo, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    jobs = _train_jobs(out)
    assert len(jobs) == 1 and _job(jobs[0]) == ["COMPLETED", "harness-n[1-2]", "2"], (jobs, out[-4000:])
    log = (cell / "train.log").read_text()
    assert "0: [trainer] the update is sharded with FSDP2 over 2 processes" in log, log[-4000:]
    assert re.search(r"^1: ", log, re.MULTILINE), log[-4000:]  # srun --label: the second node's task spoke too
    reference = metrics_of(cell)
    assert reference["update"].tolist() == list(range(6)) and reference["loss"].notna().all()

    # 2. again, killed on the second node after a checkpoint; the profile's retry resubmits it
    log = tmp_path / "snakemake.log"  # a file, not a pipe that nobody reads while it runs
    with log.open("w") as sink:
        proc = subprocess.Popen(
            _snakemake_args("--forcerun", "train"), cwd=repo, stdout=sink, stderr=subprocess.STDOUT, text=True
        )
    try:
        checkpoints = cell / "checkpoints"
        _wait("a checkpoint of update 2", lambda: max(_checkpoints(checkpoints), default=0) >= 2, proc, log, 300)
        running = _cell_processes(study)
        workers = [p for p in running if p["kind"] == "worker"]
        agents = {p["node"]: p for p in running if p["kind"] == "agent"}
        assert sorted(p["node"] for p in workers) == list(NODES) and sorted(agents) == list(NODES), running
        assert len({p["job"] for p in running}) == 1, running  # one job: the first try
        # two nodes as SLURM and the kernel see them: another hostname and another pid space each
        assert workers[0]["uts_ns"] != workers[1]["uts_ns"] and workers[0]["pid_ns"] != workers[1]["pid_ns"]
        first = running[0]["job"]
        os.kill(agents[NODES[1]]["pid"], signal.SIGKILL)  # the second node's torchrun, its worker left orphaned

        # the job ends on both nodes and leaves nothing: the orphan stops itself (`--exit-with parent`, or its
        # collective fails), srun's --kill-on-bad-exit ends the first node's
        _wait("the killed job's end", lambda: all(p["job"] != first for p in _cell_processes(study)), proc, log, 60)
        killed_at = _checkpoints(checkpoints)
        newest = max(killed_at)
        assert newest < 6, f"the cell finished before it was killed ({sorted(killed_at)})"

        # the retry resumes: the first checkpoint it writes is the one after the newest the killed job left
        seen: dict[int, tuple[int, int]] = {}
        while proc.poll() is None:
            for step, stamp in _checkpoints(checkpoints).items():
                if killed_at.get(step) != stamp:
                    seen.setdefault(step, stamp)
            time.sleep(0.05)
    finally:
        if proc.poll() is None:  # a failed check: stop the head and its jobs, which would hold both nodes
            proc.kill()
            proc.wait()
            subprocess.run(["scancel", *_train_jobs(log.read_text())], check=False, timeout=30)
    out = log.read_text()
    assert proc.returncode == 0, out[-4000:]
    retried = _train_jobs(out)
    assert len(retried) == 2 and retried[0] == first, (retried, out[-4000:])
    assert _job(retried[0])[0] == "FAILED", _job(retried[0])
    assert _job(retried[1]) == ["COMPLETED", "harness-n[1-2]", "2"], _job(retried[1])
    assert seen and min(seen) == newest + 1, f"killed after update {newest}, the retry wrote checkpoints {sorted(seen)}"
    pd.testing.assert_frame_equal(metrics_of(cell), reference)
    assert (cell / "policy").is_dir() and not checkpoints.exists()


@pytest.mark.slow
def test_a_two_node_cells_job_meets_in_its_step_and_watches_each_node(tmp_path):
    """The dry-run of a 2-node cell: one task per node, the rendezvous host read inside the step (the jobstep
    plugin strips SLURM_JOB_NODELIST from the job's shell), a watchdog per node (not the batch host's pid), and
    a one-node cell held to one node."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    (repo / "two_nodes.yaml").write_text(yaml.safe_dump(TWO_NODES))
    r = snakemake(repo, "-n", "-p", TARGET, "--configfile", "configs/smoke.yaml", "two_nodes.yaml")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    srun = [line.strip() for line in out.splitlines() if line.strip().startswith("srun ")]
    assert len(srun) == 1, out[-3000:]
    assert srun[0].startswith("srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 ")
    assert '"$SLURM_STEP_NODELIST"' in srun[0] and "--nnodes=2 --nproc-per-node=1" in srun[0]
    assert "--exit-with parent" in srun[0] and "$PPID" not in srun[0]
    assert "nodes=2, tasks=2, mpi=srun" in out

    assert "--exclusive" not in out

    one_node = dict(TWO_NODES, resources={"train": {"threads": 1, "processes": 2, "exclusive": True}})
    (repo / "two_nodes.yaml").write_text(yaml.safe_dump(one_node))
    r = snakemake(repo, "-n", "-p", TARGET, "--configfile", "configs/smoke.yaml", "two_nodes.yaml")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "gpu=0, nodes=1, slurm_extra=--exclusive," in out and "srun" not in out
    assert "--standalone --nproc-per-node=2 -m trainer train" in out and "--exit-with $PPID" in out


def test_exit_with_parent_stops_a_worker_whose_launcher_was_killed():
    """`--exit-with parent`: a process whose parent is killed outright (SIGKILL, as torchrun by the OOM killer)
    stops by itself (status 143, as SIGTERM) rather than train on as an orphan."""
    child = (
        "import time\nfrom trainer.__main__ import exit_with\n"
        "exit_with('parent', every_s=0.1)\nprint('watching', flush=True)\ntime.sleep(600)"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            f"c = subprocess.Popen([sys.executable, '-c', {child!r}])\nprint(c.pid, flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = sorted([parent.stdout.readline(), parent.stdout.readline()])  # the worker's pid, then (or before) its
    assert lines[1] == "watching\n", lines  # word that it watches
    worker = int(lines[0])
    try:
        time.sleep(0.3)
        assert process_start_time(worker) is not None  # alive while its parent is
        parent.kill()
        parent.wait()
        deadline = time.time() + 10
        while process_start_time(worker) is not None and time.time() < deadline:
            time.sleep(0.05)
        assert process_start_time(worker) is None, "the orphaned worker is still running"
        assert f"(pid {parent.pid}) is gone: stopping" in parent.stderr.read()
    finally:
        if process_start_time(worker) is not None:
            os.kill(worker, signal.SIGKILL)
    bad = subprocess.run(
        [sys.executable, "-m", "trainer", "train", "--config", "x.yaml", "--out", "y", "--exit-with", "head"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "--exit-with: expected a process id or 'parent', got 'head'" in bad.stderr
