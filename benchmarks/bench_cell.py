"""Wall time of one grid cell: `python -m trainer train` on a study's cell config, one thread, as the workflow runs it.

    python benchmarks/bench_cell.py --policy results/policies/minicpm-tiny [--study config.yaml]
                                    [--recipes full spo_adam] [--updates 100] [--keep DIR]

The target (issue 4): an embedded-default cell of 100 updates in at most 60 s on one core, so that the default grid
(about 60 cells) fits in 30 minutes on 2 cores. The cell config is built exactly as the workflow builds it
(workflow/scripts/cell_config.py: the study's `cell` block plus recipe, optimizer, seed, policy path), and the
trainer runs as a subprocess, so start-up (imports, task generation, model load) is included. Besides the wall
time it reports the split the trainer logs per update (rollout_s, train_s) and the time spent in evaluations.
`--policy` is a warm-started base policy (`snakemake results/policies/minicpm-tiny` or `python -m trainer sft`).
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
sys.path.insert(0, str(ROOT / "workflow" / "scripts"))
from cell_config import RECIPE_OPTIMIZER, cell_config, write_yaml  # noqa: E402


def run_cell(study: dict, recipe: str, policy: str, updates: int, seed: int, out: Path) -> dict:
    cfg = cell_config(study, "bench", recipe, RECIPE_OPTIMIZER[recipe], seed, policy, threads=1)
    cfg["run"]["updates"] = updates
    write_yaml(cfg, out / "cell.yaml")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "trainer", "train", "--config", str(out / "cell.yaml"),
                    "--out", str(out / "run"), "--no-progress"], check=True, cwd=ROOT,
                   env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    m = pd.read_parquet(out / "run" / "metrics.parquet")
    loop = float(m["wall_s"].iloc[-1])
    return {"recipe": recipe, "wall_s": wall, "startup_s": wall - loop, "rollout_s": m["rollout_s"].sum(),
            "train_s": m["train_s"].sum(), "eval_and_logging_s": loop - m["rollout_s"].sum() - m["train_s"].sum(),
            "gen_tokens": int(m["gen_tokens"].sum()), "success_last10": m["success_rate"].tail(10).mean()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="warm-started base policy directory")
    ap.add_argument("--study", default=str(ROOT / "config.yaml"))
    ap.add_argument("--recipes", nargs="+", default=["full", "spo_adam"])
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", default=None, help="keep each run under KEEP/<recipe> (default: a temporary folder)")
    args = ap.parse_args()
    if not Path(args.policy, "config.json").exists():
        sys.exit(f"--policy {args.policy}: not a policy directory (no config.json)")
    study = yaml.safe_load(Path(args.study).read_text())
    rows = []
    for recipe in args.recipes:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(args.keep, recipe) if args.keep else Path(tmp)
            out.mkdir(parents=True, exist_ok=not args.keep)  # a kept run never overwrites an earlier one
            rows.append(run_cell(study, recipe, str(Path(args.policy).resolve()), args.updates, args.seed, out))
        print(rows[-1], flush=True)
    table = pd.DataFrame(rows).round(2)
    print(table.to_string(index=False))
    print(f"target: {args.updates} updates <= 60 s per cell on one core "
          f"(worst here {table['wall_s'].max():.1f} s)")


if __name__ == "__main__":
    main()
