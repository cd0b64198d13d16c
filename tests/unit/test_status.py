"""`python -m trainer status`: every warm start and cell of a study in its state, read from the files the jobs
write (here written by hand, one of each state)."""

import os
import shutil
import time
from pathlib import Path

import pandas as pd
import yaml

from trainer.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
STUDY = {
    "base": "config.yaml",
    "workdir": "w",
    "grid": [{"recipes": ["spo_muon"], "optimizer": "recipe", "models": ["qwen-tiny"], "seeds": [0, 1, 2, 3, 4]}],
}


def test_the_study_view_lists_each_warm_start_and_cell_in_its_state(tmp_path, monkeypatch, capsys):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    monkeypatch.chdir(tmp_path)
    cells = tmp_path / "w/results/cells/model=qwen-tiny/recipe=spo_muon/optimizer=muon"
    warm = tmp_path / "w/results/logs/warm_start"
    warm.mkdir(parents=True)
    (warm / "qwen-tiny.log").write_text(
        '{"step": 50, "loss": 1.2, "screen_success": 0.0}\n{"step": 100, "loss": 0.9, "heldout_success": 0.125}\n'
    )
    for seed in range(4):
        (cells / f"seed={seed}").mkdir(parents=True)
    # seed 0 finished: its logs, no checkpoints left
    frame = pd.DataFrame({"update": [0, 1, 2], "success_rate": [0.1, 0.2, 0.5], "eval_success": [0.25, None, 0.375]})
    frame.to_parquet(cells / "seed=0/metrics.parquet")
    (cells / "seed=0/train.log").write_text("[update 3/3] success=0.5\nwrote metrics.parquet\n")
    # seed 1 running: a fresh update line (a flushed metrics file beside its checkpoints does not make it done)
    (cells / "seed=1/checkpoints").mkdir()
    frame.to_parquet(cells / "seed=1/metrics.parquet")
    (cells / "seed=1/train.log").write_text(
        "Loading\n[update 1/100] success=0.2\n[update 2/100] success=0.25 eta=0:05:00\n"
    )
    # seed 2 failed; seed 3 stopped an hour ago without a word; seed 4 has not started
    (cells / "seed=2/train.log").write_text(
        "[update 1/100] ok\nTraceback (most recent call last):\n  x\nValueError: bad\n"
    )
    (cells / "seed=3/train.log").write_text("0: [update 7/100] success=0.3\n")  # srun --label's prefix
    hour_ago = time.time() - 3600
    os.utime(cells / "seed=3/train.log", (hour_ago, hour_ago))

    assert main(["status", "--study", "study.yaml"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "study.yaml (w): 1 warm start(s), 5 cells; 1 done, 2 running, 1 stopped, 1 failed, 1 waiting"
    rows = {}  # name -> "state detail", spaces collapsed
    for line in lines[1:]:
        kind, rest = ("warm", line.split(None, 3)[-1]) if line.startswith("warm") else line.split(None, 2)[1:]
        rows[kind] = " ".join(rest.split())
    prefix = "model=qwen-tiny/recipe=spo_muon/optimizer=muon/seed="
    assert rows["warm"].startswith("running step 100, held-out success 0.125 (log ")
    assert rows[prefix + "0"] == "done 3 updates, last success 0.5, last eval 0.375"
    assert rows[prefix + "1"].startswith("running [update 2/100] success=0.25 eta=0:05:00 (log ")
    assert rows[prefix + "2"] == "failed ValueError: bad"
    assert rows[prefix + "3"] == "stopped [update 7/100] success=0.3 (log 60 min ago)"
    assert rows[prefix + "4"] == "waiting"

    assert main(["status", "--study", "study.yaml", "--only", "failed", "stopped"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["status", "--study", "nope.yaml"]) == 2


def test_a_bad_study_file_is_one_config_error_line(tmp_path, monkeypatch, capsys):
    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "study.yaml").write_text("base: config.yaml\nworkdir: w\ncell: {optim: {lr: 3e-4}}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["status", "--study", "study.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("config error: cell.optim.lr: ") and err.rstrip().endswith("write 3.0e-4")


def test_a_reader_that_stops_early_gets_no_error(tmp_path):
    """`status ... | head -1`: the pipe closes under the listing; the command ends quietly (141, as a shell's)."""
    import subprocess
    import sys

    shutil.copy(ROOT / "config.yaml", tmp_path / "config.yaml")
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(STUDY))
    run = subprocess.run(
        f"{sys.executable} -m trainer status --study study.yaml | head -c 1",
        shell=True,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert run.stdout == "s" and run.stderr == ""
