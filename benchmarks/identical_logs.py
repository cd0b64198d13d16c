"""Whether two runs of a study wrote the same cell logs: every cell's metrics.parquet and episodes.parquet, compared
column by column and value by value (NaN equal to NaN), the timing columns left out. For refactors that must leave
the numbers alone (run the study before and after in two clones, then compare):

    python benchmarks/identical_logs.py BEFORE/studies/smoke/results/cells AFTER/studies/smoke/results/cells

Prints each cell that differs (missing, other columns, or the first column whose values differ) and exits 1 if
any does; 0 and the number of cells compared when all are identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pyarrow.parquet as pq

TIMING = ("rollout_s", "train_s", "wall_s")
"""Wall-clock columns: the only ones a rerun may change."""
LOGS = ("metrics.parquet", "episodes.parquet")


def cell_logs(root: Path) -> dict[str, Path]:
    """Every log under a cells folder, by its path relative to it."""
    return {str(path.relative_to(root)): path for name in LOGS for path in root.rglob(name)}


def difference(a: Path, b: Path) -> str | None:
    """Why two logs differ (the first column that does), or None."""
    left, right = (pq.read_table(p).to_pandas() for p in (a, b))
    left, right = (df.drop(columns=[c for c in TIMING if c in df.columns]) for df in (left, right))
    if list(left.columns) != list(right.columns):
        return f"columns differ: {sorted(set(left.columns) ^ set(right.columns))}"
    if len(left) != len(right):
        return f"{len(left)} rows vs {len(right)}"
    for column in left.columns:
        x, y = left[column], right[column]
        same = (x == y) | (x.isna() & y.isna())
        if not bool(same.all()):
            row = int((~same).to_numpy().nonzero()[0][0])
            return f"column {column!r} differs first at row {row}: {x.iloc[row]} vs {y.iloc[row]}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path, help="a study's results/cells folder")
    parser.add_argument("after", type=Path, help="the same study's results/cells folder from the other run")
    args = parser.parse_args(argv)
    before, after = cell_logs(args.before), cell_logs(args.after)
    problems = [f"{name}: only in {args.before}" for name in sorted(set(before) - set(after))]
    problems += [f"{name}: only in {args.after}" for name in sorted(set(after) - set(before))]
    for name in sorted(set(before) & set(after)):
        why = difference(before[name], after[name])
        if why:
            problems.append(f"{name}: {why}")
    for line in problems:
        print(line)
    if problems or not before:
        print(f"{len(problems)} of {len(set(before) | set(after))} logs differ" if before else "no logs found")
        return 1
    print(f"identical: {len(before)} logs ({len(before) // len(LOGS)} cells), timing columns left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
