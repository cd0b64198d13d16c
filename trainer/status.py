"""Where a study stands, from a terminal: `python -m trainer status [--study configs/NAME.yaml] [--only STATE ...]`.

A line per warm start and per cell of the study's grid, read from the files its jobs write (nothing else is asked:
it works while Snakemake runs, after it, and on a cluster's login node):

* **done**: a cell whose `metrics.parquet` is there and whose `checkpoints/` the job removed as it finished (its
  updates and last success); a warm start whose policy has its `warm_start.json` (its held-out success and step);
* **failed**: the log ends in an error (a traceback, a config error, a warm start outside its band): its last line;
* **running**: the log is being written: its last `[update k/N]` line (a warm start: its last evaluation) and how
  long ago; **stopped** when nothing was written for `--stalled` seconds (a killed head: `snakemake
  --rerun-incomplete` resumes it from its checkpoint);
* **waiting**: no log yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

STATES = ("done", "running", "stopped", "failed", "waiting")
ERROR = re.compile(
    r"^(Traceback \(most recent call last\)|config error: |error: |interrupted$|\w*Error: |warm start: .* outside the band)"
)
TAIL_BYTES = 16384
PROGRESS = re.compile(r"\[update \d+/\d+\].*")


@dataclass(frozen=True)
class Entry:
    kind: str
    """"warm start" or "cell"."""
    name: str
    state: str
    detail: str


def tail_lines(path: Path) -> list[str]:
    """The last lines of `path` (its last TAIL_BYTES), progress bars' carriage returns split."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        text = f.read().decode("utf-8", errors="replace")
    return [line.strip() for line in re.split(r"[\r\n]", text) if line.strip()]


def ago(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"


def log_state(log: Path, progress: str | None, stalled_s: float, now: float) -> tuple[str, str]:
    """failed / running / stopped from a log that exists and has no finished result beside it."""
    lines = tail_lines(log)
    if any(ERROR.match(line) for line in lines):
        return "failed", lines[-1]
    age = now - log.stat().st_mtime
    detail = f"{progress or 'started'} (log {ago(age)})"
    return ("stopped", detail) if age > stalled_s else ("running", detail)


def cell_entry(folder: Path, name: str, stalled_s: float, now: float) -> Entry:
    log, metrics = folder / "train.log", folder / "metrics.parquet"
    if metrics.exists() and not (folder / "checkpoints").exists():
        import pandas as pd

        frame = pd.read_parquet(metrics, columns=["update", "success_rate", "eval_success"])
        evals = frame["eval_success"].dropna()
        detail = f"{len(frame)} updates, last success {frame['success_rate'].iloc[-1]:.3g}" + (
            f", last eval {evals.iloc[-1]:.3g}" if len(evals) else ""
        )
        return Entry("cell", name, "done", detail)
    if not log.exists():
        return Entry("cell", name, "waiting", "")
    # anywhere in the line: on several nodes srun --label puts the node's number in front
    found = (PROGRESS.search(line) for line in reversed(tail_lines(log)))
    progress = next((m.group(0) for m in found if m), None)
    return Entry("cell", name, *log_state(log, progress, stalled_s, now))


def warm_start_entry(workdir: Path, model: str, stalled_s: float, now: float) -> Entry:
    report, log = (
        workdir / "results/policies" / model / "warm_start.json",
        workdir / "results/logs/warm_start" / f"{model}.log",
    )
    if report.exists():
        r = json.loads(report.read_text())
        return Entry("warm start", model, "done", f"held-out success {r['heldout_success']:.3g} at step {r['step']}")
    if not log.exists():
        return Entry("warm start", model, "waiting", "")
    progress = None
    for line in reversed(tail_lines(log)):
        if line.startswith("{") and '"step"' in line:
            row = json.loads(line)
            which = "held-out" if "heldout_success" in row else "screen"
            success = row.get("heldout_success", row.get("screen_success"))
            progress = f"step {row['step']}, {which} success {success:.3g}"
            break
    return Entry("warm start", model, *log_state(log, progress, stalled_s, now))


def study_entries(study_file: Path, root: Path, stalled_s: float) -> tuple[Path, list[Entry]]:
    """The study's workdir and an entry per warm start and cell, in grid order."""
    from trainer.study import Study

    data = yaml.safe_load(study_file.read_text(encoding="utf-8"))
    study = Study.load(data, root=root, source=study_file)
    workdir = root / study.config.workdir
    now = time.time()
    entries = [warm_start_entry(workdir, model, stalled_s, now) for model in study.warm_started]
    for key in study.keys:
        entries.append(cell_entry(workdir / "results/cells" / key.folder, key.folder, stalled_s, now))
    return workdir, entries


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", default="config.yaml", help="the study file (default: config.yaml)")
    parser.add_argument("--only", nargs="+", choices=STATES, help="list only entries in these states")
    parser.add_argument(
        "--stalled", type=float, default=1800.0, help="seconds without a log line after which a job is 'stopped'"
    )


def run(args: argparse.Namespace) -> int:
    study_file = Path(args.study)
    if not study_file.is_file():
        print(f"status: {study_file}: no such study file", file=sys.stderr)
        return 2
    root = Path(os.getcwd())
    workdir, entries = study_entries(study_file, root, args.stalled)
    counts = {state: sum(e.state == state for e in entries) for state in STATES}
    cells = sum(e.kind == "cell" for e in entries)
    print(
        f"{study_file} ({os.path.relpath(workdir, root)}): {len(entries) - cells} warm start(s), {cells} cells; "
        + ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    )
    width = max((len(e.name) for e in entries), default=0)
    for e in entries:
        if args.only and e.state not in args.only:
            continue
        print(f"{e.kind:<10} {e.name:<{width}}  {e.state:<8} {e.detail}".rstrip())
    return 0
