"""The users' commands for real on the smoke studies: the whole study (run once, shared by a module fixture),
rerunning one cell and then its figures, regenerating only the figures, the trainer version bump, resuming a
killed cell, and a SIGKILLed workflow recovering with --rerun-incomplete without touching finished cells.
Outside CI these skip when Snakemake is missing; with CI=true that is a failure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from builders import TIMING
from workflow_runner import REPO, copy_repo, job_counts, read_study, require_snakemake, snakemake

import trainer
import trainer.study as cc

SMOKE = ["--configfile", "configs/smoke.yaml"]
SMOKE_DIR = Path("studies/smoke")  # configs/smoke.yaml's workdir: targets and outputs are relative to it


@pytest.mark.slow
def test_companion_smoke_study_writes_its_table_and_figures_in_its_own_folder(tmp_path):
    """`snakemake --cores all --configfile configs/companion-smoke.yaml`: 9 cells (3 estimators x 3 optimizers),
    the companion summary and figures, all under the study's workdir; the default study's folders stay empty."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/companion-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "companion-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))
    assert {tuple(p.parent.relative_to(study / "results" / "cells").parts[1:3]) for p in cells} == {
        (f"recipe={r}", f"optimizer={o}") for r in ("grpo", "gigpo", "graphgpo") for o in cc.OPTIMIZERS
    }
    for path in cells:
        metrics = pd.read_parquet(path)
        assert metrics["eval_success"].notna().all() and "grad_snr" in metrics  # eval_every 1
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 9
    for fig in ("companion_curves", "companion_bars", "companion_diagnostics"):
        for ext in ("png", "pdf"):
            assert (study / "figures" / f"{fig}.{ext}").stat().st_size > 0
    assert not (repo / "results").exists() and not (repo / "figures").exists()
    report = snakemake(repo, "--configfile", "configs/companion-smoke.yaml", "--report", "report.zip")
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    with zipfile.ZipFile(study / "report.zip") as z:  # relative to the study's workdir
        names = {Path(n).name for n in z.namelist()}
    assert {"report.html", "companion_curves.png", "companion_bars.pdf", "summary.md"} <= names


@pytest.mark.slow
def test_a_cell_without_checkpoints_keeps_its_policy_and_nothing_else(tmp_path):
    """`keep: {checkpoint: false}` and a cell that never checkpoints (`checkpoint_every: 0`): the job succeeds,
    leaves its policy and no checkpoint folder (configs/smoke.yaml tests the other case on every cell)."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    study = {
        "base": "configs/smoke.yaml",
        "grid": [{"models": ["qwen-tiny"], "recipes": ["full"], "optimizer": "muon", "seeds": [0]}],
        "cell": {"run": {"checkpoint_every": 0}},
        "keep": {"checkpoint": False},
    }
    (repo / "no_checkpoints.yaml").write_text(yaml.safe_dump(study))
    cell = SMOKE_DIR / "results/cells/model=qwen-tiny/recipe=full/optimizer=muon/seed=0"
    r = snakemake(
        repo, f"{cell.relative_to(SMOKE_DIR)}/metrics.parquet", "--cores", "1", "--configfile", "no_checkpoints.yaml"
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert (repo / cell / "policy" / "model.safetensors").is_file()
    assert not (repo / cell / "last_checkpoint").exists() and not (repo / cell / "checkpoints").exists()


@pytest.mark.slow
def test_stability_smoke_study_sweeps_lrs_and_writes_the_selected_lrs(tmp_path):
    """`snakemake --cores all --configfile configs/stability-smoke.yaml`: 8 cells (2 optimizers x 2 lrs x 2 seeds)
    in lr= folders, each trained at its folder's lr, then the stability table, selected lrs and figure."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/stability-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "stability-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/lr=*/seed=*/metrics.parquet"))
    assert len(cells) == 8
    for path in cells:
        lr = float(path.parent.parent.name.removeprefix("lr="))
        optim = yaml.safe_load((path.parent / "cell.yaml").read_text())["optim"]
        assert optim["lr"] == lr and optim.get("matrix_lr") is None
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 4 and set(summary["lr"]) == {1e-4, 1e-3} and (summary["n_seeds"] == 2).all()
    selected = yaml.safe_load((study / "results" / "selected_lr.yaml").read_text())
    # per family, and `lr`: pooled over the families, the table a study's top-level `lr:` takes as it is
    assert set(selected) == {"qwen-tiny", "lr"}
    for chosen in (selected["qwen-tiny"], selected["lr"]):
        assert set(chosen) == {"adam", "muon"} and set(chosen.values()) <= {1e-4, 1e-3}
    assert selected["lr"] == selected["qwen-tiny"]  # one family: pooling changes nothing
    assert "## Selected learning rates" in (study / "results" / "summary.md").read_text()
    for ext in ("png", "pdf"):
        assert (study / "figures" / f"stability.{ext}").stat().st_size > 0
    assert not (repo / "results").exists() and not (repo / "studies" / "smoke").exists()


@pytest.mark.slow
def test_horizon_smoke_study_trains_one_family_per_horizon_with_offline_stats(tmp_path):
    """`snakemake --cores all --configfile configs/horizon-smoke.yaml`: one warm start (qwen-base, 1-2 bugs per
    task) whose policy every horizon's cells load on their own tasks, without offline statistics (the offline pass
    played qwen-base's tasks, not the horizon's); then the horizon table and figure."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    r = snakemake(repo, "--cores", "all", "--configfile", "configs/horizon-smoke.yaml")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    study = repo / "studies" / "horizon-smoke"
    cells = sorted((study / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))
    assert len(cells) == 4
    for path in cells:
        model = path.parts[-5].removeprefix("model=")
        cell = yaml.safe_load((path.parent / "cell.yaml").read_text())
        assert cell["model"]["path"] == "results/policies/qwen-base" and "offline_stats" not in cell.get("rl", {}).get(
            "spo", {}
        )
        bugs = {"qwen-h1": 1, "qwen-h2": 2}[model]
        assert cell["env"]["options"]["min_bugs"] == cell["env"]["options"]["max_bugs"] == bugs
    summary = pd.read_csv(study / "results" / "summary.csv")
    assert len(summary) == 4 and sorted(set(summary["horizon"])) == [1.0, 2.0]
    assert sorted(p.name for p in (study / "results" / "policies").glob("*.yaml")) == ["qwen-base.yaml"]
    for ext in ("png", "pdf"):
        assert (study / "figures" / f"horizon.{ext}").stat().st_size > 0
    assert not (repo / "results").exists()


def _cells(repo: Path) -> list[Path]:
    return sorted((repo / SMOKE_DIR / "results" / "cells").glob("model=*/recipe=*/optimizer=*/seed=*/metrics.parquet"))


def _stamp(path: Path) -> tuple[int, bytes]:
    return path.stat().st_mtime_ns, path.read_bytes()


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """`snakemake --cores all --configfile configs/smoke.yaml` once, on a fresh copy."""
    require_snakemake()
    repo = copy_repo(tmp_path_factory.mktemp("smoke") / "repo")
    t0 = time.perf_counter()
    r = snakemake(repo, "--cores", "all", *SMOKE)
    return repo, r, time.perf_counter() - t0


@pytest.mark.slow
def test_smoke_study_trains_every_cell(smoke_run):
    repo, r, seconds = smoke_run
    cells = _cells(repo)
    assert len(cells) == 28, (r.stdout + r.stderr)[-3000:]
    from trainer.logs.parquet_log import read_log

    for path in cells:
        keys = dict(part.split("=") for part in path.parent.relative_to(repo / SMOKE_DIR / "results" / "cells").parts)
        df, provenance = read_log(path)
        assert df["update"].tolist() == [0, 1]  # configs/smoke.yaml: run.updates 2
        cfg = provenance["config"]
        assert (cfg["recipe"], cfg["optim"]["name"], cfg["run"]["seed"]) == (
            keys["recipe"],
            keys["optimizer"],
            int(keys["seed"]),
        )
        assert cfg["model"]["path"] == f"results/policies/{keys['model']}"
        # the shell rule wrote exactly the pure helper's config (quoting through the shell lost nothing)
        study = cc.Study.load(read_study("configs/smoke.yaml"), REPO)
        key = cc.CellKey(keys["model"], keys["recipe"], keys["optimizer"], int(keys["seed"]))
        assert yaml.safe_load((path.parent / "cell.yaml").read_text()) == study.cell_config(key)
        assert (path.parent / "episodes.parquet").is_file() and (path.parent / "train.log").is_file()
        assert not (path.parent / "checkpoints").exists()  # a finished cell keeps no working checkpoints
        # but what it trained: the final policy and (configs/smoke.yaml keep.checkpoint) the last update's state
        assert json.loads((path.parent / "policy" / "harness_policy.json").read_text())["trained"]["update"] == 2
        assert (path.parent / "policy" / "model.safetensors").is_file()
        assert [p.name for p in (path.parent / "last_checkpoint").iterdir()] == ["ckpt-00000002.pt"]
        assert not (path.parent / "policy.partial").exists()
    for model in ("minicpm-tiny", "qwen-tiny"):
        assert (repo / SMOKE_DIR / "results" / "policies" / model / "warm_start.json").is_file()
    assert not (repo / "results").exists()  # the default study's folder is untouched
    print(f"smoke study: {seconds:.0f} s")


@pytest.mark.slow
def test_smoke_study_writes_the_summary_and_every_figure(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    for name in ("results/summary.csv", "results/summary.md", "results/runs.parquet"):
        assert (repo / SMOKE_DIR / name).stat().st_size > 0, name
    for fig in ("fig2", "fig3", "fig4", "fig5", "diagnostics"):
        for ext in ("png", "pdf"):
            assert (repo / SMOKE_DIR / "figures" / f"{fig}.{ext}").stat().st_size > 0
    summary = pd.read_csv(repo / SMOKE_DIR / "results" / "summary.csv")
    assert len(summary) == 28  # model x recipe x optimizer, one seed each
    # each cell's log has a line per update, and the study view lists every cell done with its last numbers
    cell = repo / SMOKE_DIR / "results/cells/model=qwen-tiny/recipe=full/optimizer=muon/seed=0"
    updates = yaml.safe_load((cell / "cell.yaml").read_text())["run"]["updates"]
    lines = [line for line in (cell / "train.log").read_text().splitlines() if line.startswith("[update ")]
    assert [line.split("]")[0] for line in lines] == [f"[update {u}/{updates}" for u in range(1, updates + 1)]
    status = subprocess.run(
        [sys.executable, "-m", "trainer", "status", "--study", "configs/smoke.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr
    assert status.stdout.splitlines()[0].endswith("2 warm start(s), 28 cells; 30 done")
    assert (cell / "transcripts.parquet").is_file()
    up_to_date = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    assert "Nothing to be done" in up_to_date.stdout + up_to_date.stderr
    report = snakemake(repo, *SMOKE, "--report", "report.zip")
    assert report.returncode == 0, (report.stdout + report.stderr)[-3000:]
    with zipfile.ZipFile(repo / SMOKE_DIR / "report.zip") as z:  # relative to the study's workdir
        names = {Path(n).name for n in z.namelist()}
    assert {"report.html", "fig2.png", "fig5.pdf", "diagnostics.png", "summary.md"} <= names


@pytest.mark.slow
def test_trainer_version_bump_marks_every_cell_and_warm_start_out_of_date(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    init = repo / "trainer" / "__init__.py"
    original = init.read_text()
    init.write_text(original.replace(f'TRAINER_VERSION = "{trainer.TRAINER_VERSION}"', 'TRAINER_VERSION = "bumped"'))
    try:
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    finally:
        init.write_text(original)
    out = dry.stdout + dry.stderr
    # the base policies too: an environment or trainer change also changes the warm start's demos and its band
    assert job_counts(out) == {"warm_start": 2, "train": 28, "summarize": 1, "figures": 1, "all": 1}
    assert "Params have changed since last execution" in out


@pytest.mark.slow
def test_rerun_one_cell_then_its_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    target = "results/cells/model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0/metrics.parquet"
    before = {p: _stamp(p) for p in _cells(repo)}
    figure_before = (repo / SMOKE_DIR / "figures" / "fig5.png").stat().st_mtime_ns
    old = pd.read_parquet(repo / SMOKE_DIR / target).drop(columns=TIMING)
    dry = snakemake(repo, "-n", "--cores", "all", *SMOKE, "--forcerun", target)
    assert job_counts(dry.stdout + dry.stderr) == {"train": 1, "summarize": 1, "figures": 1, "all": 1}
    r2 = snakemake(repo, "--cores", "all", *SMOKE, "--forcerun", target)
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    for path, stamp in before.items():
        if path == repo / SMOKE_DIR / target:
            assert path.stat().st_mtime_ns > stamp[0]
        else:
            assert _stamp(path) == stamp, path
    assert (repo / SMOKE_DIR / "figures" / "fig5.png").stat().st_mtime_ns > figure_before
    # lagged rollouts are deterministic: the rerun cell has the same numbers (timings aside)
    pd.testing.assert_frame_equal(pd.read_parquet(repo / SMOKE_DIR / target).drop(columns=TIMING), old)


@pytest.mark.slow
def test_regenerate_only_the_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    before = {p: _stamp(p) for p in [*_cells(repo), repo / SMOKE_DIR / "results" / "summary.csv"]}
    figures = {p: p.stat().st_mtime_ns for p in (repo / SMOKE_DIR / "figures").glob("*.p*")}
    r2 = snakemake(repo, "--cores", "all", *SMOKE, "--forcerun", "figures")
    assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
    assert job_counts(r2.stdout + r2.stderr) == {"figures": 1, "all": 1}
    assert all(_stamp(p) == stamp for p, stamp in before.items())
    assert len(figures) == 10 and all(p.stat().st_mtime_ns > t for p, t in figures.items())


@pytest.mark.slow
def test_a_killed_cells_checkpoints_resume_only_under_the_same_base_policy(smoke_run):
    """The train rule's resume key holds the warm-started policy's fingerprint: checkpoints a cell left under an
    older base policy are deleted before it reruns; under the current one they are read (an unreadable one is
    skipped with a warning in train.log, which is how this test sees that the trainer looked at it)."""
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    out = repo / SMOKE_DIR
    target = "results/cells/model=minicpm-tiny/recipe=no_tool/optimizer=muon/seed=0/metrics.parquet"
    cell = (out / target).parent
    sha = lambda path: hashlib.sha256(path.read_bytes()).hexdigest()  # noqa: E731
    version, cell_hash = trainer.TRAINER_VERSION, sha(cell / "cell.yaml")
    policy_hash = sha(out / "results" / "policies" / "minicpm-tiny" / "warm_start.json")

    def rerun_with_checkpoints_keyed(key: str) -> str:
        (cell / "checkpoints").mkdir(exist_ok=True)
        (cell / "checkpoints" / "RESUME_KEY").write_text(key + "\n")
        (cell / "checkpoints" / "ckpt-00000001.pt").write_bytes(b"left by a killed run")
        r2 = snakemake(repo, target, "--cores", "1", *SMOKE, "--forcerun", target)
        assert r2.returncode == 0, (r2.stdout + r2.stderr)[-3000:]
        assert not (cell / "checkpoints").exists()
        return (cell / "train.log").read_text()

    assert "ckpt-00000001.pt" not in rerun_with_checkpoints_keyed(f"{version} {cell_hash} {'0' * 64}")
    assert "ignoring unreadable checkpoint" in rerun_with_checkpoints_keyed(f"{version} {cell_hash} {policy_hash}")


@pytest.mark.slow
def test_editing_the_papers_numbers_redraws_the_summary_and_figures(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    numbers = repo / "trainer" / "analysis" / "paper_numbers.csv"
    original, stat = numbers.read_bytes(), numbers.stat()
    numbers.write_bytes(original + b"\n")  # an edit (Snakemake compares contents, not only times)
    try:
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
    finally:
        numbers.write_bytes(original)
        os.utime(numbers, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert job_counts(dry.stdout + dry.stderr) == {"summarize": 1, "figures": 1, "all": 1}


@pytest.mark.slow
def test_a_replaced_or_missing_cell_log_is_never_summarised_silently(smoke_run):
    repo, r, _ = smoke_run
    assert r.returncode == 0, "the smoke study did not finish"
    cell = repo / SMOKE_DIR / "results/cells/model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0"
    saved = {
        name: ((cell / name).read_bytes(), (cell / name).stat()) for name in ("metrics.parquet", "episodes.parquet")
    }

    def restore():
        for name, (data, stat) in saved.items():
            (cell / name).write_bytes(data)
            os.utime(cell / name, ns=(stat.st_atime_ns, stat.st_mtime_ns))

    try:
        # a valid log with no rows: the summary fails naming it (it used to drop the cell from summary.csv)
        import pyarrow.parquet as pq

        pq.write_table(pq.read_table(cell / "metrics.parquet").slice(0, 0), cell / "metrics.parquet")
        failed = snakemake(repo, "--cores", "1", *SMOKE, "--forcerun", "summarize")
        log = (repo / SMOKE_DIR / "results" / "logs" / "summarize.log").read_text()
        assert (
            failed.returncode != 0
            and "model=qwen-tiny/recipe=no_tool/optimizer=adam/seed=0/metrics.parquet' "
            "has 0 row(s) (updates none) but its cell ran 2 update(s)"
            in log
        ), log
        restore()
        # a deleted episode log is a missing input of the summary: its cell reruns
        (cell / "episodes.parquet").unlink()
        dry = snakemake(repo, "-n", "--cores", "all", *SMOKE)
        assert job_counts(dry.stdout + dry.stderr) == {"train": 1, "summarize": 1, "figures": 1, "all": 1}
    finally:
        restore()


KILL_GRID = {
    "grid": [
        {"name": "kill_test", "models": ["minicpm-tiny"], "recipes": ["spo_adam", "spo_muon", "full"], "seeds": [0]}
    ],
    "cell": {"run": {"updates": 4}},
}  # merged into smoke.yaml: more time between checkpoint and finish


def _finished_train_outputs(log: str) -> set[str]:
    """metrics.parquet of the train jobs snakemake reported finished (jobid -> output from the job blocks)."""
    block = re.compile(
        r"^(?:local)?rule train:\n(?:    .*\n)*?    output: (\S+?),[^\n]*\n(?:    .*\n)*?"
        r"    jobid: (\d+)",
        re.MULTILINE,
    )
    outputs = {jobid: out for out, jobid in block.findall(log)}
    return {outputs[j] for j in re.findall(r"Finished jobid: (\d+) \(Rule: train\)", log)}


def _session_members(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid` (/proc/PID/stat: state is field 3, session field 6)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


@pytest.mark.slow
@pytest.mark.parametrize("kill", ["head and jobs", "head only"])
def test_sigkilled_workflow_recovers_without_touching_finished_cells(tmp_path, kill):
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    (repo / "kill_grid.yaml").write_text(yaml.safe_dump(KILL_GRID))
    args = [sys.executable, "-m", "snakemake", "--cores", "1", *SMOKE, "kill_grid.yaml"]
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=repo, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        finished: set[str] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            finished = _finished_train_outputs(log_path.read_text())
            # kill once a cell is finished and another one has written its first checkpoint
            midway = [p for p in (repo / SMOKE_DIR / "results" / "cells").glob("*/*/*/*/checkpoints/ckpt-*.pt")]
            if finished and midway:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the workflow ended before it could be killed:\n" + log_path.read_text()[-3000:]
        if kill == "head and jobs":
            os.killpg(proc.pid, signal.SIGKILL)  # snakemake and its running job die together, as on a node loss
        else:
            os.kill(proc.pid, signal.SIGKILL)  # the head alone: its trainer jobs must not train on as orphans
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _session_members(proc.pid), "jobs outlived their killed head"
    finally:
        if _session_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
    assert finished, log_path.read_text()[-3000:]
    kept = {repo / SMOKE_DIR / f: _stamp(repo / SMOKE_DIR / f) for f in finished}
    cells_dir = repo / SMOKE_DIR / "results" / "cells"
    interrupted = [p.parent.parent for p in cells_dir.glob("*/*/*/*/checkpoints/ckpt-*.pt")]
    assert interrupted, "no cell was caught mid-run"
    first_row = pd.read_parquet(interrupted[0] / "metrics.parquet").iloc[0]  # flushed with the checkpoint

    # a plain rerun refuses, naming the interrupted cell's outputs as incomplete; the killed process also left
    # its lock, so the recovery is `snakemake --unlock`, then the same command with --rerun-incomplete
    refused = subprocess.run(args, check=False, cwd=repo, capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and "IncompleteFilesException" in refused.stdout + refused.stderr
    assert str((interrupted[0] / "metrics.parquet").relative_to(repo / SMOKE_DIR)) in refused.stdout + refused.stderr
    assert snakemake(repo, "--unlock", *SMOKE, "kill_grid.yaml").returncode == 0
    r = snakemake(repo, "--cores", "all", *SMOKE, "kill_grid.yaml", "--rerun-incomplete")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]

    assert len(_cells(repo)) == 3
    for path, stamp in kept.items():
        assert _stamp(path) == stamp, f"{path} was rewritten"
    # the interrupted cell resumed from its checkpoint: its first update's timings are the pre-kill ones
    resumed = pd.read_parquet(interrupted[0] / "metrics.parquet")
    assert resumed["update"].tolist() == [0, 1, 2, 3]
    assert resumed.iloc[0][TIMING].tolist() == first_row[TIMING].tolist()
    assert not (interrupted[0] / "checkpoints").exists()
