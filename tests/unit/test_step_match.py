"""The AdamW lr matched to a Muon arm's hidden update RMS, from runs' logs."""

import pandas as pd
import pytest

from trainer.analysis.step_match import main, matched_lr


def _run(path, rms_early, rms_late):
    rows = [{"update": u, "update_rms": rms_early if u < 20 else rms_late} for u in range(40)]
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_the_matched_lr_scales_adamws_lr_by_the_ratio_of_early_medians(tmp_path, capsys):
    adamw = [_run(tmp_path / f"a{i}.parquet", r, 1.0) for i, r in enumerate((1.2e-4, 1.3e-4, 1.25e-4))]
    muon = [_run(tmp_path / f"m{i}.parquet", r, 9.0) for i, r in enumerate((1.0e-4, 0.9e-4))]
    lr, rms_adamw, rms_muon = matched_lr(3e-4, adamw, muon)
    assert (rms_adamw, rms_muon) == pytest.approx((1.25e-4, 0.95e-4))  # the late updates are not looked at
    assert lr == pytest.approx(3e-4 * 0.95 / 1.25)
    assert main(["--lr", "3e-4", "--adamw", *map(str, adamw), "--muon", *map(str, muon)]) == 0
    assert "matched AdamW lr 0.000228" in capsys.readouterr().out


def test_a_run_without_early_step_sizes_is_named(tmp_path, capsys):
    empty = tmp_path / "e.parquet"
    pd.DataFrame({"update": [30], "update_rms": [1.0]}).to_parquet(empty)
    ok = _run(tmp_path / "ok.parquet", 1.0, 1.0)
    assert main(["--lr", "3e-4", "--adamw", str(empty), "--muon", str(ok)]) == 2
    assert f"{empty}: no update_rms logged in its first 20 updates" in capsys.readouterr().err
