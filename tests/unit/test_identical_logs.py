"""benchmarks/identical_logs.py, the refactors' check that a study's cell logs did not change."""

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("identical_logs", ROOT / "benchmarks" / "identical_logs.py")
identical_logs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(identical_logs)


def _cells(root: Path, success: float, wall: float, extra: bool = False) -> Path:
    for seed in (0, 1):
        folder = root / "model=m" / f"seed={seed}"
        folder.mkdir(parents=True)
        metrics = {"update": [0, 1], "success_rate": [0.5, success], "grad_snr": [np.nan, 1.0], "wall_s": [wall, wall]}
        pq.write_table(pa.Table.from_pandas(pd.DataFrame(metrics)), folder / "metrics.parquet")
        pq.write_table(pa.Table.from_pandas(pd.DataFrame({"reward": [1.0, 0.0]})), folder / "episodes.parquet")
    if extra:
        (root / "model=m" / "seed=2").mkdir()
        pq.write_table(pa.Table.from_pandas(pd.DataFrame({"reward": [1.0]})), root / "model=m/seed=2/episodes.parquet")
    return root


def test_logs_equal_but_for_timing_and_nan_are_identical(tmp_path, capsys):
    a, b = _cells(tmp_path / "a", 0.75, wall=1.0), _cells(tmp_path / "b", 0.75, wall=9.0)
    assert identical_logs.main([str(a), str(b)]) == 0
    assert "identical: 4 logs (2 cells)" in capsys.readouterr().out


def test_a_changed_value_or_a_missing_cell_is_named(tmp_path, capsys):
    a, b = _cells(tmp_path / "a", 0.75, wall=1.0), _cells(tmp_path / "b", 0.625, wall=1.0, extra=True)
    assert identical_logs.main([str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "model=m/seed=0/metrics.parquet: column 'success_rate' differs first at row 1: 0.75 vs 0.625" in out
    assert "model=m/seed=2/episodes.parquet: only in" in out and "3 of 5 logs differ" in out
