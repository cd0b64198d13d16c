"""Wall time of one grid cell: `python -m trainer train` on a study's cell config, one thread, as the workflow runs it.

    python benchmarks/bench_cell.py --policy results/policies/minicpm-tiny [--study config.yaml]
                                    [--recipes full spo_adam] [--updates 100] [--keep DIR] [--against CHECKOUT]

The cell config is built exactly as the workflow builds it (trainer/study/: the study, its `base`
resolved, its `cell` block plus recipe, optimizer and its lr, seed, policy path and offline statistics), and the
trainer runs as a subprocess, so start-up (imports, task generation, model load) is included. Besides the wall
time it reports the split the trainer logs per update (rollout_s, train_s) and the time spent in evaluations.
`--policy` is a warm-started base policy (`snakemake results/policies/minicpm-tiny` or `python -m trainer warm-start`).

`--against CHECKOUT` runs every cell twice at the same time, one thread each: with this checkout's trainer and with
the one in CHECKOUT (e.g. `git worktree add /tmp/base HEAD`), so that a shared machine's load hits both alike. It
prints the ratios (this / CHECKOUT) and whether the two runs logged the same numbers (every metrics and episodes
column but the timing ones); a speed-up that keeps results must say True there.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from trainer.study import RECIPE_OPTIMIZER, CellKey, Study, write_yaml  # noqa: E402

TIMING_COLUMNS = ["rollout_s", "train_s", "wall_s"]


def start_cell(cfg: dict, out: Path, checkout: Path) -> tuple[subprocess.Popen, float]:
    """Launch `python -m trainer train` with the trainer package of `checkout`, one thread."""
    write_yaml(cfg, out / "cell.yaml")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(out / "cell.yaml"),
            "--out",
            str(out / "run"),
            "--no-progress",
        ],
        cwd=checkout,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(checkout)},
    )
    return proc, time.perf_counter()


def finish_cell(recipe: str, proc: subprocess.Popen, t0: float, out: Path) -> dict:
    if proc.wait():
        raise subprocess.CalledProcessError(proc.returncode, proc.args)
    wall = time.perf_counter() - t0
    m = pd.read_parquet(out / "run" / "metrics.parquet")
    loop = float(m["wall_s"].iloc[-1])
    return {
        "recipe": recipe,
        "wall_s": wall,
        "startup_s": wall - loop,
        "rollout_s": m["rollout_s"].sum(),
        "train_s": m["train_s"].sum(),
        "eval_and_logging_s": loop - m["rollout_s"].sum() - m["train_s"].sum(),
        "gen_tokens": int(m["gen_tokens"].sum()),
        "success_last10": m["success_rate"].tail(10).mean(),
    }


def same_logs(a: Path, b: Path) -> bool:
    """Both runs logged the same numbers: metrics (timing columns aside) and episodes, exactly, in the columns both
    trainers write (a newer one may log more)."""
    for name, drop in (("metrics.parquet", TIMING_COLUMNS), ("episodes.parquet", [])):
        x, y = (pd.read_parquet(d / "run" / name).drop(columns=drop) for d in (a, b))
        shared = [c for c in x.columns if c in y.columns]
        if not x[shared].equals(y[shared]):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="warm-started base policy directory")
    ap.add_argument("--study", default=str(ROOT / "config.yaml"))
    ap.add_argument("--recipes", nargs="+", default=["full", "spo_adam"])
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--keep",
        default=None,
        help="keep each run under KEEP/<recipe>/this (and /against) (default: a temporary folder)",
    )
    ap.add_argument(
        "--against",
        default=None,
        metavar="CHECKOUT",
        help="also run each cell, at the same time, with the trainer of this checkout (a baseline)",
    )
    args = ap.parse_args()
    if not Path(args.policy, "config.json").exists():
        sys.exit(f"--policy {args.policy}: not a policy directory (no config.json)")
    study = Study.load(yaml.safe_load(Path(args.study).read_text()), root=ROOT, source=args.study)
    model = Path(args.policy).resolve().name  # results/policies/<model>: the study's model of that name
    if model not in study.config.models:
        sys.exit(
            f"--policy {args.policy}: its folder name {model!r} is not a model of {args.study} "
            f"({sorted(study.config.models)})"
        )
    checkouts = {"this": ROOT} if args.against is None else {"this": ROOT, "against": Path(args.against).resolve()}
    rows = []
    for recipe in args.recipes:
        key = CellKey(model, recipe, RECIPE_OPTIMIZER[recipe], args.seed)
        cfg = study.cell_config(key, model_path=str(Path(args.policy).resolve()))
        cfg["run"].update(updates=args.updates, threads=1)
        with tempfile.TemporaryDirectory() as tmp:
            outs = {label: Path(args.keep or tmp, recipe, label) for label in checkouts}
            for out in outs.values():
                out.mkdir(parents=True, exist_ok=not args.keep)  # a kept run never overwrites an earlier one
            started = {label: start_cell(cfg, outs[label], checkout) for label, checkout in checkouts.items()}
            for label, (proc, t0) in started.items():
                rows.append({"checkout": label, **finish_cell(recipe, proc, t0, outs[label])})
                print(rows[-1], flush=True)
            if args.against is not None:
                print(
                    f"{recipe}: same logged numbers as {args.against}: {same_logs(outs['this'], outs['against'])}",
                    flush=True,
                )
    table = pd.DataFrame(rows).round(2)
    print(table.to_string(index=False))
    if args.against is not None:
        timing = ["wall_s", "startup_s", "rollout_s", "train_s", "eval_and_logging_s"]
        ratio = (
            table[table.checkout == "this"].set_index("recipe")[timing]
            / table[table.checkout == "against"].set_index("recipe")[timing]
        )
        print(f"ratio this / {args.against}:\n{ratio.round(3).to_string()}")
    print(
        f"target: {args.updates} updates <= 60 s per cell on one core "
        f"(worst here, this checkout: {table[table.checkout == 'this']['wall_s'].max():.1f} s)"
    )


if __name__ == "__main__":
    main()
