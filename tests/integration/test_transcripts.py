"""Transcripts (trainer/logs/transcripts.py): the rows of an episode written by hand, and a cell's transcripts
through the CLI (`train`, then `show`)."""

import subprocess
import sys

import pandas as pd
import pytest
import yaml

from trainer.logs.transcripts import format_episode, transcript_rows
from trainer.rl.trajectory import Turn
from trainer.rollout.episode import Episode


def _episode():
    e = Episode(task_id="t7", reward=1.0, done=True)
    e.observations = ["issue: fix it", "file shown", "tests pass"]
    e.actions = ["view file", "finish"]
    e.turns = [Turn(0, 3), Turn(5, 6, invalid_action=True)]
    return e


def test_an_episodes_rows_are_its_turns_then_its_last_observation():
    rows = transcript_rows(_episode(), update=4, split="eval", index=1)
    assert [(r["turn"], r["observation"], r.get("action")) for r in rows] == [
        (0, "issue: fix it", "view file"),
        (1, "file shown", "finish"),
        (2, "tests pass", None),
    ]
    assert [r.get("invalid_action") for r in rows] == [False, True, None]
    assert all(
        (r["update"], r["split"], r["episode"], r["task_id"], r["success"]) == (4, "eval", 1, "t7", True) for r in rows
    )
    text = format_episode(pd.DataFrame(rows))
    assert text.splitlines()[0] == "== update 4, eval, episode 1: task t7, reward 1 (success), policy version 0"
    assert "--- action 1 (invalid_action)\nfinish\n--- observation 2\ntests pass" in text


@pytest.mark.slow
def test_a_cell_keeps_transcripts_of_its_evaluations_and_every_nth_batch(tmp_path):
    cell = {
        "recipe": "spo_muon",
        "env": {"name": "recall", "eval_tasks": 4},
        "rollout": {"engine": "hf", "batch_size": 8, "max_turn_tokens": 1, "max_episode_tokens": 32},
        "run": {"updates": 3, "eval_every": 2, "checkpoint_every": 0, "transcript_every": 2, "transcript_episodes": 3},
    }
    (tmp_path / "cell.yaml").write_text(yaml.safe_dump(cell))
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "trainer"]
    run = subprocess.run(
        [*cli, "train", "--config", str(tmp_path / "cell.yaml"), "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    frame = pd.read_parquet(out / "transcripts.parquet")
    # evaluated after updates 1, 2 and 3 (rows 0-2), training batches 0 and 2 kept; 3 episodes each
    sampled = frame.groupby(["split", "update"])["episode"].nunique().to_dict()
    assert sampled == {("eval", 0): 3, ("eval", 1): 3, ("eval", 2): 3, ("train", 0): 3, ("train", 2): 3}
    episodes = pd.read_parquet(out / "episodes.parquet")
    last_eval = episodes[(episodes["split"] == "eval") & (episodes["update"] == 2)].head(3)
    kept = frame[(frame["split"] == "eval") & (frame["update"] == 2)].groupby("episode")
    assert kept["task_id"].first().tolist() == last_eval["task_id"].tolist()  # the evaluation's first episodes
    assert kept["reward"].first().tolist() == last_eval["reward"].tolist()
    assert (kept["action"].count() == last_eval["n_turns"].to_numpy()).all()  # a row with an action per turn
    shown = subprocess.run([*cli, "show", str(out), "--episode", "0"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.startswith("== update 2, eval, episode 0: task ")
    assert "--- observation 0\n" in shown.stdout and "--- action 0" in shown.stdout
    none = subprocess.run([*cli, "show", str(out), "--split", "impossible"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 1 and "no 'impossible' transcripts" in none.stderr
