"""benchmarks/profile_cell.py: a cell's wall time split into exclusive phases, beside their counted FLOPs."""

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("profile_cell", ROOT / "benchmarks" / "profile_cell.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["profile_cell"] = module
    spec.loader.exec_module(module)
    return module


def test_phase_times_are_exclusive_and_add_up():
    """A phase's time excludes the phases it calls: outer 50 ms of its own around an inner 100 ms."""
    timer = _script().PhaseTimer()
    timer._mark = time.perf_counter()
    with timer.phase("outer"):
        time.sleep(0.05)
        with timer.phase("inner"):
            time.sleep(0.1)
    timer._charge()
    assert timer.seconds["outer"] == pytest.approx(0.05, abs=0.02)
    assert timer.seconds["outer/inner"] == pytest.approx(0.1, abs=0.02)
    assert timer.calls == {"outer": 1, "outer/inner": 1}


@pytest.mark.slow
def test_profile_of_a_default_cell_accounts_for_its_wall_time(tmp_path):
    """Two updates of a (smaller) default cell (a fresh tiny policy standing in for the warm start): the phases add up to the
    loop's wall time, the forward passes, backward and optimizer steps count FLOPs, and the environment none; the
    instrumented run logs the same numbers as a plain one (the timers change nothing)."""
    from trainer.config import OFFLINE_STATS_FILE, config_from_dict
    from trainer.environments.suite import make_suite
    from trainer.policy.load import new_tiny_policy, save_policy
    from trainer.rl.spo import write_offline_stats
    from trainer.study import CellKey, Study
    from trainer.train import Trainer

    small = {
        "base": "config.yaml",
        "cell": {"env": {"eval_tasks": 8, "probe_tasks": 2}, "rollout": {"batch_size": 8, "max_turn_tokens": 8}},
    }
    study_file = tmp_path / "small.yaml"
    study_file.write_text(yaml.safe_dump(small))
    study = Study.load(small, root=ROOT, source=study_file)
    key = CellKey("qwen-tiny", "full", "muon", 0)
    policy = tmp_path / "qwen-tiny"
    policy.mkdir()
    write_offline_stats(policy / OFFLINE_STATS_FILE, {})  # the config check wants the file; written below
    cfg = config_from_dict(study.cell_config(key, model_path=str(policy)))
    suite = make_suite(cfg.env)
    model, fmt = new_tiny_policy("qwen-tiny", suite.sample_texts(), seed=0)
    save_policy(model, fmt, policy)
    # priors of 0-4 successes in 4 plays: an untrained policy's failures then carry signal (baselines differ)
    write_offline_stats(
        policy / OFFLINE_STATS_FILE,
        {t.task_id: (4, i % 5) for i, t in enumerate(suite.tasks.tasks("train", cfg.env.train_tasks))},
    )
    out = tmp_path / "profile.json"
    _script().main(
        [
            "--policy",
            str(policy),
            "--study",
            str(study_file),
            "--updates",
            "2",
            "--flop-updates",
            "1",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    rows = {r["phase"]: r for r in report["rows"]}
    loop = report["wall_s"] - report["startup_s"]
    assert sum(r["seconds"] for r in rows.values()) == pytest.approx(loop, rel=0.05)
    for phase in (
        "step/rollout/decode",
        "step/update/forward",
        "step/update/backward",
        "step/update/optimizer",
        "step/spo/old_logp",
        "evaluate/decode",
    ):
        assert rows[phase]["gflop"] > 0 and rows[phase]["bound_s"] > 0, phase
    assert rows["step/rollout/env"]["gflop"] == 0

    plain = study.cell_config(key, model_path=str(policy))
    plain["run"]["updates"] = 2
    torch.set_num_threads(1)
    Trainer(config_from_dict(plain), tmp_path / "plain").run(progress=False)
    import pandas as pd

    timed_again = tmp_path / "timed"
    module = _script()
    module.run_cell(plain, timed_again, module.PhaseTimer(), count_flops=False)
    a, b = (
        pd.read_parquet(d / "metrics.parquet").drop(columns=["rollout_s", "train_s", "wall_s"])
        for d in (tmp_path / "plain", timed_again)
    )
    pd.testing.assert_frame_equal(a, b)
