"""What the policy typed: a sample of episodes' full text, `transcripts.parquet` beside a cell's other logs.

One row per turn: the observation the policy read, the action it wrote, the turn's tool-error flags, and the
episode's task, reward and flags on every row (so a filter on one turn keeps its context). The trainer keeps the
first `run.transcript_episodes` episodes of every evaluation and of every `run.transcript_every`-th training batch;
the episode's last observation (the environment's answer to its last action, or the grading) is a row of its own
with no action. Read with pandas, or shown as text by `python -m trainer show CELL_DIR`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow as pa

TRANSCRIPTS_FILE = "transcripts.parquet"
TRANSCRIPT_COLUMNS: dict[str, pa.DataType] = {
    "update": pa.int64(),  # as in episodes.parquet: the update that trained on it, or after which it was evaluated
    "split": pa.string(),  # "train", "eval" or "impossible"
    "episode": pa.int64(),  # its place in the sample of that update and split
    "task_id": pa.string(),
    "turn": pa.int64(),
    "observation": pa.string(),  # what the policy read before this turn's action
    "action": pa.string(),  # what it wrote (null on the closing row)
    "invalid_action": pa.bool_(),
    "exec_error": pa.bool_(),
    "reward": pa.float64(),
    "success": pa.bool_(),
    "truncated": pa.bool_(),
    "policy_version": pa.int64(),
}


def transcript_rows(episode, *, update: int, split: str, index: int) -> list[dict]:
    """The rows of one episode (see the module docstring)."""
    common = {
        "update": update,
        "split": split,
        "episode": index,
        "task_id": episode.task_id,
        "reward": episode.reward,
        "success": episode.reward > 0.5,
        "truncated": episode.truncated,
        "policy_version": episode.oldest_version,
    }
    rows = []
    for i, action in enumerate(episode.actions):
        turn = episode.turns[i] if i < len(episode.turns) else None
        rows.append(
            {
                **common,
                "turn": i,
                "observation": episode.observations[i] if i < len(episode.observations) else None,
                "action": action,
                "invalid_action": None if turn is None else turn.invalid_action,
                "exec_error": None if turn is None else turn.exec_error,
            }
        )
    if len(episode.observations) > len(episode.actions):
        rows.append({**common, "turn": len(episode.actions), "observation": episode.observations[-1]})
    return rows


def format_episode(frame) -> str:
    """One episode's rows as text: a header, then each observation and action in turn."""
    import pandas as pd

    first = frame.iloc[0]
    outcome = "success" if first["success"] else "failure"
    header = (
        f"== update {first['update']}, {first['split']}, episode {first['episode']}: task {first['task_id']}, "
        f"reward {first['reward']:g} ({outcome}{', truncated' if first['truncated'] else ''}), "
        f"policy version {first['policy_version']}"
    )
    parts = [header]
    for row in frame.sort_values("turn").itertuples(index=False):
        if not pd.isna(row.observation):
            parts.append(f"--- observation {row.turn}\n{row.observation}")
        if not pd.isna(row.action):
            flags = [
                n for n in ("invalid_action", "exec_error") if not pd.isna(getattr(row, n)) and bool(getattr(row, n))
            ]
            parts.append(f"--- action {row.turn}{' (' + ', '.join(flags) + ')' if flags else ''}\n{row.action}")
    return "\n".join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", help="a cell's folder (or its transcripts.parquet)")
    parser.add_argument(
        "--split", help="train, eval or impossible (default: eval, or train for a cell that never evaluated)"
    )
    parser.add_argument("--update", type=int, help="the update (default: the last one with transcripts)")
    parser.add_argument("--episode", type=int, nargs="+", help="which of its episodes (default: all)")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    path = Path(args.cell)
    path = path / TRANSCRIPTS_FILE if path.is_dir() else path
    if not path.is_file():
        print(f"show: {path}: no transcripts (a cell trained by this trainer writes them)", file=sys.stderr)
        return 2
    frame = pd.read_parquet(path)
    split = args.split or ("eval" if (frame["split"] == "eval").any() else "train")
    frame = frame[frame["split"] == split]
    if frame.empty:
        print(f"show: {path}: no {split!r} transcripts", file=sys.stderr)
        return 1
    update = frame["update"].max() if args.update is None else args.update
    frame = frame[frame["update"] == update]
    if args.episode is not None:
        frame = frame[frame["episode"].isin(args.episode)]
    if frame.empty:
        print(f"show: {path}: no {split!r} transcripts at update {update}", file=sys.stderr)
        return 1
    print("\n\n".join(format_episode(group) for _, group in frame.groupby("episode", sort=True)))
    return 0
