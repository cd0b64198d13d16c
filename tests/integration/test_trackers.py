"""Trackers (trainer/logs/trackers.py) read back: TensorBoard's event files with its own EventAccumulator, a Weights
& Biases offline run from its `.wandb` record log (wandb's LevelDB-style log of protobuf records, read with wandb's
own protobuf classes), both against the cell's metrics.parquet; a resumed cell continues the same runs. Both
libraries come with the `test` extra, so this runs wherever the tests do (the trainer itself needs neither)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

CELL = {
    "recipe": "spo_muon",
    "env": {"name": "recall", "eval_tasks": 4},
    "rollout": {"engine": "hf", "batch_size": 8, "max_turn_tokens": 1, "max_episode_tokens": 32},
    "run": {"updates": 4, "eval_every": 2, "checkpoint_every": 0},
}
TRACKED = ("success_rate", "entropy", "loss", "eval_success")


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` file: a 7-byte header (":W&B", magic, version), then 32 KiB blocks of
    chunks, each with a 7-byte header (crc32, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, parts = path.read_bytes(), 32768, 7, []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # a block's padding
            pos += left
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        parts = [chunk] if kind in (1, 2) else parts + [chunk]
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            yield record


def wandb_history(out: Path) -> tuple[set[str], dict[int, dict[str, float]]]:
    """The run ids of every offline run under `out`, and their logged values by step (later segments win)."""
    ids, steps = set(), {}
    for path in sorted((out / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                item = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                step = int(item["_step"]) if "_step" in item else record.history.step.num
                steps[step] = {k: v for k, v in item.items() if not k.startswith("_")}
    return ids, steps


def tensorboard_scalars(out: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train(tmp_path, out, updates, *extra):
    cell = {**CELL, "run": {**CELL["run"], "updates": updates}}
    path = tmp_path / f"cell-{updates}.yaml"
    path.write_text(yaml.safe_dump(cell))
    cmd = [sys.executable, "-m", "trainer", "train", "--config", str(path), "--out", str(out), "--no-progress"]
    cmd += ["--track", "tensorboard", "wandb", "--track-group", "study", "--track-name", "cell-a", *extra]
    run = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"},
    )
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow
def test_the_trackers_hold_the_parquet_curves_and_a_resumed_cell_continues_its_runs(tmp_path):
    out = tmp_path / "cell"
    train(tmp_path, out, 2, "--checkpoint-last")
    train(tmp_path, out, 4, "--resume")
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert len(metrics) == 4
    want = {name: [(u + 1, v) for u, v in zip(metrics["update"], metrics[name]) if pd.notna(v)] for name in TRACKED}
    scalars = tensorboard_scalars(out)
    for name in TRACKED:  # each step once: the resumed segment continues the first one's event files
        assert [s for s, _ in scalars[name]] == [s for s, _ in want[name]], name
        assert [v for _, v in scalars[name]] == pytest.approx([v for _, v in want[name]], rel=1e-6), name
    ids, steps = wandb_history(out)
    assert len(ids) == 1 and len(list((out / "wandb").glob("offline-run-*"))) == 2  # two segments, one run
    assert sorted(steps) == [1, 2, 3, 4]
    for name in TRACKED:
        got = [(s, steps[s][name]) for s in sorted(steps) if name in steps[s]]
        assert got == [(s, pytest.approx(v, rel=1e-12)) for s, v in want[name]], name
