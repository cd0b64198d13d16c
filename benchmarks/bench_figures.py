"""How long do the two analysis steps take on a big grid? Target: at most 15 s for 1,000 cells of 100 updates.

Writes `--cells` synthetic metrics logs (trainer/analysis/synthetic.py: 2 model families x 8 recipes x
Adam/Muon x as many seeds as needed, Adam runs mostly collapsing) into a temporary directory in the
workflow's Hive layout, untimed. Then times exactly what the workflow's two rules run, in one process:
`summarize_study` (read every log with pyarrow.dataset, judge collapse per run, t intervals per cell, write
summary.csv/.md and runs.parquet, the collapse rule's simulated false-positive rate) and `plot_study` (read the logs again, EMA, and draw and write all five figures
as PNG and PDF). Imports are done before the clock starts (the trainer package pulls in torch, ~4 s, which is
not analysis time). Wall time is the target; CPU time is printed too, because on a shared machine the two differ.

    python benchmarks/bench_figures.py [--cells 1000] [--updates 100] [--keep DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from trainer.analysis.cell_logs import load_metrics
from trainer.analysis.figures import FIGURES, FORMATS
from trainer.analysis.pipeline import plot_study, summarize_study
from trainer.analysis.summary import SUMMARY_COLUMNS
from trainer.analysis.synthetic import synthetic_grid
from trainer.recipes import FIGURE2_RECIPES

TARGET_S = 15.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=1000, help="number of synthetic cell logs")
    parser.add_argument("--updates", type=int, default=100, help="updates per log")
    parser.add_argument("--keep", type=Path, default=None, help="write into this folder and keep it (else a temp dir)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        base = root / "results" / "cells"
        seeds = range(-(-args.cells // 32))  # 2 models x 8 recipes x 2 optimizers = 32 cells per seed
        t0 = time.perf_counter()
        paths = synthetic_grid(
            base,
            ["minicpm-tiny", "qwen-tiny"],
            list(FIGURE2_RECIPES),
            ["adam", "muon"],
            seeds,
            n_updates=args.updates,
            max_cells=args.cells,
        )
        print(
            f"wrote {len(paths)} synthetic logs x {args.updates} updates in {time.perf_counter() - t0:.1f} s (untimed)"
        )
        outputs = [root / "figures" / f"{name}.{fmt}" for name in FIGURES for fmt in FORMATS]

        wall, cpu = time.perf_counter(), time.process_time()
        notes = summarize_study(
            "main",
            paths,
            base,
            root / "results" / "summary.csv",
            root / "results" / "summary.md",
            root / "results" / "runs.parquet",
        )
        t_summary = time.perf_counter() - wall
        plot_study("main", paths, base, root / "results" / "runs.parquet", outputs)
        total, total_cpu = time.perf_counter() - wall, time.process_time() - cpu

        t0 = time.perf_counter()
        load_metrics(paths, base, SUMMARY_COLUMNS)
        t_load = time.perf_counter() - t0
        print(notes[0] + "; " + notes[2])
        print(f"summarize: {t_summary:.2f} s (of which one read of all logs: {t_load:.2f} s)")
        print(f"plot (all {len(outputs)} files): {total - t_summary:.2f} s")
        print(
            f"TOTAL aggregation + figures: {total:.2f} s wall, {total_cpu:.2f} s CPU "
            f"(target <= {TARGET_S:.0f} s wall: {'met' if total <= TARGET_S else 'NOT met'})"
        )
        missing = [str(p) for p in outputs if not p.is_file() or p.stat().st_size == 0]
        if missing:
            raise SystemExit(f"figures missing or empty: {missing}")


if __name__ == "__main__":
    main()
