"""The preflight (`trainer/environments/swe/preflight.py`): each repository's first rows graded with their own fix
and with no change, through the real sandbox and grader, before any GPU is booked; the study refuses to start
below its gold share. On the shipped rows, on the R2E-Gym stand-ins, and as the paper study's first job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import docker_engine
from workflow_runner import copy_repo, job_counts, require_snakemake, snakemake

from trainer.environments.swe.preflight import gold_share, sample
from trainer.environments.swe.tasks import load_tasks, shipped_tasks_path

pytestmark = [pytest.mark.docker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_the_sample_is_each_repositorys_first_rows_in_file_order():
    tasks = load_tasks(shipped_tasks_path())
    assert [t.task_id for t in sample(tasks, 1)] == [t.task_id for t in tasks]  # one row per repository
    doubled = [*tasks, *tasks]
    assert len(sample(doubled, 1)) == len(tasks) and len(sample(doubled, 2)) == 2 * len(tasks)
    assert gold_share([{"gold_reward": 1.0}, {"gold_reward": 0.0}, {"gold_reward": None}]) == pytest.approx(1 / 3)


def docker_rows(tmp_path, broken: bool = False) -> Path:
    """The shipped rows without their local fixtures (the Docker backend needs only the images); `broken`: one row
    expects a test that does not exist, so even its own fix grades 0."""
    rows = [json.loads(line) for line in shipped_tasks_path().read_text().splitlines()]
    for row in rows:
        row.pop("repo_path"), row.pop("hidden_tests_path")
    if broken:
        expected = json.loads(rows[0]["expected_output_json"])
        rows[0]["expected_output_json"] = json.dumps({**expected, "test_that_does_not_exist": "PASSED"})
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.environments.swe.preflight", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def engine():
    return docker_engine(load_tasks(shipped_tasks_path())[0].docker_image)


def read_table(path: Path) -> list[dict]:
    head, *lines = path.read_text().splitlines()
    return [dict(zip(head.split("\t"), line.split("\t"))) for line in lines]


def test_the_preflight_on_r2e_gym_stand_ins_grades_every_layout(engine, standin_tasks, tmp_path):
    rows = tmp_path / "standins.jsonl"
    from trainer.environments.swe.standins import LAYOUTS, build_standins

    rows.write_text("".join(json.dumps(r) + "\n" for r in build_standins(engine)))
    out = tmp_path / "preflight.tsv"
    run = preflight(
        "--tasks",
        str(rows),
        "--options",
        '{"backend": "docker"}',
        "--rows-per-repository",
        "6",
        "--workers",
        "2",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stdout + run.stderr
    table = read_table(out)
    assert [r["task_id"] for r in table] == [f"standin__{layout.name}" for layout in LAYOUTS]
    assert {(r["gold_reward"], r["noop_reward"], r["problems"]) for r in table} == {("1.0", "0.0", "")}
    assert int(table[4]["image_bytes"]) > 200 * 1024**2  # the large layout
    assert "passed: 100% of 6 sampled rows" in run.stderr


def test_the_preflight_names_a_row_whose_own_fix_grades_0_and_refuses_below_the_share(engine, tmp_path):
    out = tmp_path / "preflight.tsv"
    run = preflight(
        "--tasks",
        str(docker_rows(tmp_path, broken=True)),
        "--options",
        '{"backend": "docker"}',
        "--min-gold-share",
        "1.0",
        "--out",
        str(out),
    )
    assert run.returncode == 1, run.stdout + run.stderr
    assert "FAILED: 83% of 6 sampled rows grade their own fix 1 (min_gold_share 100%)" in run.stderr
    table = read_table(out)
    assert table[0]["gold_reward"] == "0.0" and "test_that_does_not_exist" in table[0]["problems"]
    assert all(r["gold_reward"] == "1.0" and r["noop_reward"] == "0.0" for r in table[1:])
    ghost = docker_rows(tmp_path)
    text = ghost.read_text().splitlines()
    row = json.loads(text[0])
    row.update(task_id="ghost", repo_name="ghost", docker_image="swe-harness/does-not-exist:latest")
    ghost.write_text("\n".join([*text, json.dumps(row)]) + "\n")
    run = preflight(
        "--tasks",
        str(ghost),
        "--options",
        '{"backend": "docker", "docker": {"pull": "never"}}',
        "--min-gold-share",
        "0.8",
        "--out",
        str(out),
    )
    assert run.returncode == 0, run.stdout + run.stderr  # 6 of 7: above 80%
    assert "image absent" in read_table(out)[-1]["problems"]


def test_the_paper_study_starts_with_the_preflight(engine, tmp_path):
    """`snakemake preflight --configfile configs/paper.yaml`: the paper study's own sandbox settings, on a task file
    of the shipped rows; every cell of the study depends on its table."""
    require_snakemake()
    repo = copy_repo(tmp_path / "repo")
    for name in ("MiniCPM5-2B", "Qwen3.5-4B"):
        (repo / "checkpoints" / name).mkdir(parents=True)
    (repo / "data").mkdir()
    docker_rows(tmp_path).replace(repo / "data" / "r2e-gym-tasks.jsonl")
    dry = snakemake(repo, "-n", "--cores", "2", "--configfile", "configs/paper.yaml")
    assert dry.returncode == 0 and job_counts(dry.stdout + dry.stderr)["preflight"] == 1, dry.stderr[-2000:]
    r = snakemake(repo, "preflight", "--cores", "2", "--configfile", "configs/paper.yaml", timeout=1800)
    log = repo / "studies" / "paper" / "results" / "logs" / "preflight.log"
    assert r.returncode == 0, (r.stderr[-2000:], log.read_text()[-3000:] if log.exists() else "")
    table = read_table(repo / "studies" / "paper" / "results" / "preflight.tsv")
    assert len(table) == 6 and all(row["gold_reward"] == "1.0" and row["noop_reward"] == "0.0" for row in table)
    assert "passed" in log.read_text()
