"""The AdamW lr whose hidden-matrix update RMS equals a Muon arm's, measured rather than assumed.

"Same lr" is not "same step": Muon's `match_rms_adamw` scales its update to RMS 0.2 x lr, while AdamW's update RMS
at a given lr depends on how consistent the gradients are (a noisy gradient's normalised update is smaller), so at
lr 3e-4 AdamW's hidden update RMS was 1.19-1.31x Muon's in the published runs. AdamW's update is proportional to
its lr (the moments do not depend on it), so the matched lr is `lr x RMS(Muon) / RMS(AdamW at lr)`, with each RMS
the median over a run's first `updates` updates (the collapse rule's warm-up: before any verdict), then the median
over runs. Run on short runs of both arms from the study's own base policies before the study's cells:

    python -m trainer.analysis.step_match --lr 3e-4 --adamw A/metrics.parquet ... --muon M/metrics.parquet ...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def early_rms(path: Path, updates: int) -> float:
    """Median hidden-matrix update RMS over a run's first `updates` updates (ValueError naming the file)."""
    frame = pd.read_parquet(path, columns=["update", "update_rms"])
    early = frame[frame["update"] < updates]["update_rms"].dropna()
    if early.empty:
        raise ValueError(f"{path}: no update_rms logged in its first {updates} updates")
    return float(early.median())


def matched_lr(lr: float, adamw: list[Path], muon: list[Path], updates: int = 20) -> tuple[float, float, float]:
    """(matched AdamW lr, median AdamW RMS, median Muon RMS) over the given runs."""
    rms_adamw = float(np.median([early_rms(p, updates) for p in adamw]))
    rms_muon = float(np.median([early_rms(p, updates) for p in muon]))
    return lr * rms_muon / rms_adamw, rms_adamw, rms_muon


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.analysis.step_match", description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, required=True, help="the AdamW runs' lr")
    parser.add_argument("--adamw", type=Path, nargs="+", required=True, help="metrics.parquet of AdamW runs at --lr")
    parser.add_argument("--muon", type=Path, nargs="+", required=True, help="metrics.parquet of the Muon arm's runs")
    parser.add_argument("--updates", type=int, default=20, help="the early window (updates)")
    args = parser.parse_args(argv)
    try:
        lr, rms_adamw, rms_muon = matched_lr(args.lr, args.adamw, args.muon, args.updates)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"hidden update RMS over the first {args.updates} updates: AdamW at {args.lr:g} {rms_adamw:.4g} "
        f"({len(args.adamw)} runs), Muon {rms_muon:.4g} ({len(args.muon)} runs), ratio {rms_adamw / rms_muon:.3f}; "
        f"matched AdamW lr {lr:.3g}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
