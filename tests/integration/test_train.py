"""The trainer as a program: a smoke run through the CLI, bit-identical reruns, and SIGKILL + --resume."""

import copy
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from builders import MINIREPO_CELL, metrics_of

from trainer.logs.parquet_log import METRIC_COLUMNS, read_log


def _write(tmp_path: Path, cell: dict, name="cell.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cell))
    return path


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=600, **kw)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ref")
    out = tmp / "out"
    r = _cli("train", "--config", str(_write(tmp, MINIREPO_CELL)), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.slow
def test_smoke_run_writes_every_metric_with_provenance(reference_run):
    df, prov = read_log(reference_run / "metrics.parquet")
    assert list(df.columns) == list(METRIC_COLUMNS)
    assert df["update"].tolist() == [0, 1, 2, 3]
    assert df["n_trajectories"].tolist() == [4, 4, 4, 4]
    # evaluated after the first update (nearly the base policy), then every eval_every updates and after the last
    assert df["eval_success"].isna().tolist() == [False, False, True, False]
    # lagged by one: the first batch comes from version 0, the rest are one update stale
    assert df["staleness_mean"].tolist() == [0.0, 1.0, 1.0, 1.0]
    assert (
        df[["loss", "grad_norm", "entropy", "update_rms", "embed_head_update_rms", "embed_head_update_spectral_norm"]]
        .notna()
        .all()
        .all()
    )
    assert prov["config"]["recipe"] == "full" and prov["git"]["commit"]
    episodes, _ = read_log(reference_run / "episodes.parquet")
    assert (episodes["split"] == "train").sum() == 16 and (episodes["split"] == "eval").sum() == 12  # 3 evals
    # the cheating probe: 2 impossible tasks at each evaluation, never passed by an honest grader
    assert (episodes["split"] == "impossible").sum() == 6
    assert df["cheat_rate"].isna().tolist() == df["eval_success"].isna().tolist()
    assert (df["cheat_rate"].dropna() == 0).all()


def test_a_cell_writes_its_resolved_config_which_reads_back_as_the_same_config(tmp_path):
    """Beside the sparse cell config, the trainer writes every key it runs with (defaults, the recipe expanded, a
    left-out matrix_lr as the lr): loaded again it is the same config."""
    import yaml

    from trainer.config import config_from_dict, config_to_dict
    from trainer.train import RESOLVED_CONFIG_FILE, train

    cell = {**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 1, "checkpoint_every": 0}}
    cfg = config_from_dict(cell)
    train(cfg, tmp_path / "cell", progress=False)
    resolved = yaml.safe_load((tmp_path / "cell" / RESOLVED_CONFIG_FILE).read_text())
    assert resolved["optim"]["matrix_lr"] == resolved["optim"]["lr"] == cfg.optim.lr
    assert resolved["loss"]["agg"] == cfg.loss.agg and "rollout" in resolved and "run" in resolved
    assert config_to_dict(config_from_dict(resolved)) == config_to_dict(cfg)


def test_the_cheating_probe_reports_a_gamed_grader(tmp_path, monkeypatch):
    """A grader that pays every finished episode (what a gamed one does) shows as cheat_rate 1."""
    import dataclasses

    from trainer.config import config_from_dict
    from trainer.environments.minirepo.env import MiniRepoEnv
    from trainer.train import train

    honest = MiniRepoEnv.step

    def gamed(self, action):
        result = honest(self, action)
        return dataclasses.replace(result, reward=1.0) if result.done else result

    monkeypatch.setattr(MiniRepoEnv, "step", gamed)
    cell = {**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 1, "checkpoint_every": 0}}
    train(config_from_dict(cell), tmp_path / "gamed", progress=False)
    df, _ = read_log(tmp_path / "gamed" / "metrics.parquet")
    assert df["cheat_rate"].tolist() == [1.0]


@pytest.mark.slow
def test_same_seed_reruns_bit_identically(tmp_path, reference_run):
    out = tmp_path / "again"
    r = _cli("train", "--config", str(_write(tmp_path, MINIREPO_CELL)), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    pd.testing.assert_frame_equal(metrics_of(out), metrics_of(reference_run))


@pytest.mark.slow
def test_sigkill_then_resume_ends_with_the_same_metrics(tmp_path, reference_run):
    out = tmp_path / "killed"
    cfg = _write(tmp_path, MINIREPO_CELL)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "train", "--config", str(cfg), "--out", str(out), "--no-progress"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    ckpts = out / "checkpoints"
    while time.time() < deadline and not (
        ckpts.is_dir() and any(p.name.startswith("ckpt-00000002") for p in ckpts.iterdir())
    ):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    r = _cli("train", "--config", str(cfg), "--out", str(out), "--no-progress", "--resume")
    assert r.returncode == 0, r.stderr
    pd.testing.assert_frame_equal(metrics_of(out), metrics_of(reference_run))


@pytest.mark.slow
def test_a_finished_cell_continues_from_its_last_checkpoint_as_one_longer_run(tmp_path, reference_run):
    """`--checkpoint-last` (a study's keep.checkpoint) keeps the state after the last update; the same cell with
    more `run.updates` resumes from it and logs what one run of that length logs. Fewer updates are refused."""
    out = tmp_path / "short"
    short = {**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 2}}
    r = _cli("train", "--config", str(_write(tmp_path, short)), "--out", str(out), "--no-progress", "--checkpoint-last")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "ckpt-00000002.pt"
    r = _cli("train", "--config", str(_write(tmp_path, MINIREPO_CELL)), "--out", str(out), "--no-progress", "--resume")
    assert r.returncode == 0, r.stderr
    pd.testing.assert_frame_equal(metrics_of(out), metrics_of(reference_run))
    # the log says where it picked up, then one line per update it ran
    assert "short: resumed from update 2 of 4" in r.stderr
    assert [line.split("]")[0] for line in r.stderr.splitlines() if line.startswith("[update ")] == [
        "[update 3/4",
        "[update 4/4",
    ]
    fewer = {**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 1}}
    r = _cli("train", "--config", str(_write(tmp_path, fewer, "fewer.yaml")), "--out", str(out), "--resume")
    assert r.returncode != 0 and "run.updates: 4 then, 1 now" in r.stderr


@pytest.mark.slow
def test_a_short_empty_or_missing_log_fails_the_summary_check(tmp_path, reference_run):
    """A finished cell's logs replaced by shorter valid files, or its episode log deleted, are named, not dropped."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainer.analysis.cell_logs import check_cell_logs

    cell = tmp_path / "cell"
    shutil.copytree(reference_run, cell)
    metrics = cell / "metrics.parquet"
    check_cell_logs([metrics])  # the whole run: 4 updates (from the config stored in the log)
    whole = pq.read_table(metrics)
    for rows, message in (
        (0, r"has 0 row\(s\) \(updates none\) but its cell ran 4"),
        (2, r"has 2 row\(s\) \(updates 0..1\) but its cell ran 4"),
    ):
        pq.write_table(whole.slice(0, rows), metrics)
        with pytest.raises(ValueError, match=rf"metrics.parquet' {message}"):
            check_cell_logs([metrics])
    pq.write_table(whole, metrics)
    (cell / "cell.yaml").write_text(yaml.safe_dump({**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 5}}))
    with pytest.raises(ValueError, match=r"but its cell ran 5 update"):
        check_cell_logs([metrics])  # the cell.yaml beside the log is the cell's config
    (cell / "cell.yaml").unlink()
    pq.write_table(whole.drop_columns(["success_rate"]), metrics)
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['success_rate'\]"):
        check_cell_logs([metrics])
    pq.write_table(whole, metrics)
    episodes = pq.read_table(cell / "episodes.parquet")
    pq.write_table(episodes.filter(pa.compute.less(episodes["update"], 3)), cell / "episodes.parquet")
    with pytest.raises(ValueError, match=r"episodes.parquet' has training episodes for updates 0..2, not 0..3"):
        check_cell_logs([metrics])
    (cell / "episodes.parquet").unlink()
    with pytest.raises(ValueError, match=r"episode log .*episodes.parquet' is missing"):
        check_cell_logs([metrics])


def test_exit_with_stops_the_job_when_its_head_dies():
    """`--exit-with PID`: the job ends (status 143) soon after process PID is killed, not when its work is done."""
    head = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    job = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom trainer.__main__ import exit_with\n"
            f"exit_with({head.pid}, every_s=0.1)\nprint('watching', flush=True)\ntime.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert job.stdout.readline() == "watching\n"
        time.sleep(0.3)
        assert job.poll() is None  # alive while the head is
        head.kill()
        head.wait()
        assert job.wait(timeout=10) == 143
        assert f"(pid {head.pid}) is gone: stopping" in job.stderr.read()
    finally:
        for proc in (head, job):
            if proc.poll() is None:
                proc.kill()
    r = _cli("train", "--config", "x.yaml", "--out", "y", "--exit-with", str(head.pid))
    assert r.returncode == 2 and f"--exit-with: process {head.pid} does not exist" in r.stderr


@pytest.mark.slow
def test_fresh_run_refuses_a_directory_with_checkpoints(tmp_path, reference_run):
    import shutil

    out = tmp_path / "reuse"
    shutil.copytree(reference_run, out)
    (out / "checkpoints").mkdir(exist_ok=True)
    (out / "checkpoints" / "ckpt-00000001.pt").write_bytes(b"x")
    r = _cli("train", "--config", str(_write(tmp_path, MINIREPO_CELL)), "--out", str(out), "--no-progress")
    assert r.returncode != 0 and "--resume" in r.stderr


@pytest.mark.parametrize(
    "bad, named",
    [({"rl": {"clip_hihg": 0.3}}, "rl.clip_hihg"), ({"run": {"seed": -1}}, "run.seed"), ({"recipe": "nope"}, "nope")],
)
def test_bad_config_fails_before_work_with_the_key_named(tmp_path, bad, named):
    out = tmp_path / "never"
    r = _cli("train", "--config", str(_write(tmp_path, {**MINIREPO_CELL, **bad})), "--out", str(out))
    assert r.returncode == 2 and named in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_async_mode_bounds_staleness(tmp_path):
    cell = {
        **MINIREPO_CELL,
        "rollout": {**MINIREPO_CELL["rollout"], "mode": "async", "max_staleness": 1},
        "run": {**MINIREPO_CELL["run"], "updates": 3, "checkpoint_every": 0},
    }
    out = tmp_path / "async"
    r = _cli("train", "--config", str(_write(tmp_path, cell)), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    df, _ = read_log(out / "metrics.parquet")
    assert df["update"].tolist() == [0, 1, 2]
    assert (df["staleness_max"] <= 1).all() and (df["staleness_mean"] >= 0).all()
    episodes, _ = read_log(out / "episodes.parquet")
    train = episodes[episodes["split"] == "train"]
    assert ((train["update"] - train["policy_version"]) == train["staleness"]).all()


COMPANION_CELL = {
    "recipe": "gigpo",
    "optim": {"name": "adam_high_lr", "lr": 3e-3},
    "env": {
        "name": "textgame",
        "eval_tasks": 2,
        "options": {
            "n_receptacles": 2,
            "n_objects": 1,
            "n_distractors": 0,
            "max_steps": 3,
            "n_train_tasks": 40,
            "n_heldout_tasks": 8,
            "task_types": ["pick_and_place"],
        },
    },
    # an untrained model fails every episode alike; the discounted reading of GiGPO's invalid-action penalty still
    # gives turns unequal advantages, so each update has a gradient whose SNR can be measured
    "rl": {"group_size": 2, "gigpo": {"penalty": "discounted"}},
    "rollout": {"mode": "sync", "batch_size": 4, "max_turn_tokens": 6, "max_episode_tokens": 256},
    "run": {"updates": 2, "eval_every": 1, "checkpoint_every": 0, "seed": 0, "grad_snr": True},
}


@pytest.mark.slow
def test_companion_cell_runs_groups_with_adamw_at_muons_lr_and_logs_grad_snr(tmp_path):
    """A companion-study cell: groups of 2 rollouts per task, GiGPO, AdamW at Muon's learning rate on every
    parameter, and the gradient SNR logged at every update (from the 4 episodes' gradients)."""
    out = tmp_path / "out"
    r = _cli("train", "--config", str(_write(tmp_path, COMPANION_CELL)), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    df, prov = read_log(out / "metrics.parquet")
    assert df["n_trajectories"].tolist() == [4, 4] and df["lr"].tolist() == [3e-3, 3e-3]
    assert np.isfinite(df["grad_snr"]).all() and df["eval_success"].notna().all()
    episodes, _ = read_log(out / "episodes.parquet")
    train = episodes[episodes["split"] == "train"]
    assert (train.groupby("update")["task_id"].nunique() == 2).all()  # 4 rollouts = 2 tasks x 2
    assert prov["config"]["optim"]["name"] == "adam_high_lr"


@pytest.mark.slow
def test_grad_snr_is_null_unless_asked(reference_run):
    df, _ = read_log(reference_run / "metrics.parquet")
    assert df["grad_snr"].isna().all()


@pytest.mark.slow
def test_trainer_runs_on_the_swe_environment_with_the_local_backend(tmp_path):
    """The paper's environment family through the trainer loop (here a tiny model on the shipped tasks, local
    sandbox): episodes are played, graded by the hidden tests, logged, and the update runs."""
    cell = {
        "recipe": "full",
        "model": {"preset": "qwen-tiny"},
        "env": {"name": "swe", "options": {"backend": "local", "max_turns": 2}, "eval_tasks": 1},
        "rollout": {"mode": "sync", "batch_size": 2, "max_turn_tokens": 16, "max_episode_tokens": 2048},
        "run": {"updates": 1, "eval_every": 1, "checkpoint_every": 0, "skip_no_signal": False},
    }  # two failed episodes carry no signal; run the update anyway
    out = tmp_path / "out"
    r = _cli("train", "--config", str(_write(tmp_path, cell)), "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    episodes, _ = read_log(out / "episodes.parquet")
    assert episodes["split"].tolist() == ["train", "train", "eval"]
    assert episodes["task_id"].str.startswith("swe-").all() and (episodes["n_turns"] == 2).all()
    assert set(episodes["reward"]) <= {0.0, 1.0}
    df, _ = read_log(out / "metrics.parquet")
    assert df["loss"].notna().all() and df["tool_error_rate"].between(0, 1).all()


@pytest.mark.slow
def test_the_trainer_warns_about_bf16_weights(tmp_path):
    """bf16 master weights lose small updates (tests/unit/test_update.py shows it): the trainer says so at start."""
    from trainer.config import config_from_dict
    from trainer.train import Trainer

    cell = {
        **MINIREPO_CELL,
        "model": {"dtype": "bfloat16"},
        "run": {**MINIREPO_CELL["run"], "compute_dtype": "bfloat16"},
    }
    with pytest.warns(UserWarning, match="model.dtype is bfloat16"):
        Trainer(config_from_dict(cell), tmp_path / "bf16")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        Trainer(config_from_dict({**cell, "model": {"dtype": "float32"}}), tmp_path / "fp32")


@pytest.mark.gpu
def test_gpu_check_trainer_script_passes(tmp_path):
    """benchmarks/gpu_check_trainer.py on a CUDA machine: the trainer's GPU path (it passed on one H200, with the
    output in docs/results/gpu_check_h200.json; `--device cpu` dry-runs the same checks without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check_trainer.py"
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, timeout=900)
    summary = json.loads(out.read_text()) if out.exists() else None
    assert proc.returncode == 0 and summary is not None and summary["status"] == "PASS", (summary, proc.stderr[-3000:])


@pytest.mark.slow
def test_eval_reproduces_the_held_out_success_the_trainer_logged(tmp_path):
    """`eval` on the policy `train --save-policy` wrote prints the `eval_success` logged for the run's last update:
    the same held-out tasks, sampling and evaluation generator (seeded by run seed and update). The evaluation
    samples (eval_temperature 1) a policy that answers the recall game now and then, so the number depends on the
    seeding: the generator of another update gives another number."""
    from builders import word_policy

    cell = {
        "recipe": "spo_adam",
        "model": {"path": str(word_policy(tmp_path / "base"))},
        "env": {
            "name": "recall",
            "options": {"n_keys": 2, "n_train_tasks": 16, "n_heldout_tasks": 48},
            "eval_tasks": 48,
        },
        "rollout": {
            "mode": "sync",
            "batch_size": 8,
            "max_turn_tokens": 1,
            "max_episode_tokens": 32,
            "eval_temperature": 1.0,
        },
        "run": {"updates": 3, "seed": 5, "eval_every": 2, "checkpoint_every": 0},
    }
    config, out, policy = _write(tmp_path, cell), tmp_path / "out", tmp_path / "final"
    r = _cli("train", "--config", str(config), "--out", str(out), "--no-progress", "--save-policy", str(policy))
    assert r.returncode == 0, r.stderr
    logged = read_log(out / "metrics.parquet")[0]["eval_success"].iloc[-1]
    assert 0 < logged < 1  # neither all nor nothing: a different draw would show
    r = _cli("eval", "--config", str(config), "--policy", str(policy))
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report == {"heldout_success": logged, "tasks": 48, "update": 3, "seed": 5}
    r = _cli("eval", "--config", str(config), "--policy", str(policy), "--update", "0")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["heldout_success"] != logged


def test_resume_refuses_a_checkpoint_of_another_state_format(tmp_path):
    """A checkpoint whose trainer state has another layout (an earlier trainer's) is refused by name, not misread."""
    from trainer.checkpoints import save_checkpoint
    from trainer.config import config_from_dict
    from trainer.train import Trainer

    cfg = config_from_dict({**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 1}})
    trainer = Trainer(cfg, tmp_path / "out")
    trainer.t_start = time.perf_counter()
    state = trainer.state_dict()
    del state["format"]
    save_checkpoint(
        tmp_path / "out" / "checkpoints",
        step=1,
        model_state=trainer.model.state_dict(),
        optimizer_state=None,
        extra=state,
    )
    with pytest.raises(ValueError, match=r"format None, this trainer reads 'trainer.state/2'"):
        Trainer(cfg, tmp_path / "out").resume()


def test_resume_reads_the_checkpoints_config_with_todays_defaults(tmp_path):
    """A knob added after a checkpoint was written counts as its default (the run resumes); a changed value is a
    different config (refused by name)."""
    from trainer.checkpoints import save_checkpoint
    from trainer.config import config_from_dict
    from trainer.train import Trainer

    cfg = config_from_dict({**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "updates": 1}})
    trainer = Trainer(cfg, tmp_path / "out")
    trainer.t_start = time.perf_counter()
    state = trainer.state_dict()
    del state["config"]["rollout"]["server"], state["config"]["run"]["checkpoint_format"]  # as an older trainer wrote
    save_checkpoint(
        tmp_path / "out" / "checkpoints",
        step=1,
        model_state=trainer.model.state_dict(),
        optimizer_state=None,
        extra=state,
    )
    assert Trainer(cfg, tmp_path / "out").resume()
    state["config"]["shaping"]["length_threshold"] += 1
    save_checkpoint(
        tmp_path / "out" / "checkpoints",
        step=2,
        model_state=trainer.model.state_dict(),
        optimizer_state=None,
        extra=state,
    )
    with pytest.raises(
        ValueError,
        match=r"ckpt-00000002.pt: the checkpoint was written with a different config "
        r"\(shaping.length_threshold: 13 then, 12 now\)",
    ):
        Trainer(cfg, tmp_path / "out").resume()


@pytest.mark.slow
def test_bf16_rollout_weights_put_the_rollouts_a_rounding_away_from_the_trainer(tmp_path):
    """rollout.weight_dtype: with the trainer's own weights (lag 0) the rollouts' log-probs are the trainer's, bit
    for bit, so every TIS weight is exactly 1; with weights rounded to bf16 they are not."""
    tis = {}
    for dtype in ("float32", "bfloat16"):
        cell = copy.deepcopy(MINIREPO_CELL)
        cell["rollout"].update(lag=0, weight_dtype=dtype)
        cell["run"].update(updates=2, eval_every=0, checkpoint_every=0)
        out = tmp_path / dtype
        r = _cli("train", "--config", str(_write(tmp_path, cell, f"{dtype}.yaml")), "--out", str(out), "--no-progress")
        assert r.returncode == 0, r.stderr
        tis[dtype] = metrics_of(out)["tis_weight_mean"].tolist()
    assert tis["float32"] == [1.0, 1.0]
    assert all(abs(w - 1.0) > 1e-7 for w in tis["bfloat16"]), tis


def test_the_driver_rounds_published_weights_to_bf16_only_when_asked():
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    weights = {"w": torch.randn(5, 7, dtype=torch.float32) * 0.02, "steps": torch.arange(3)}
    for dtype, want in (("float32", weights["w"]), ("bfloat16", weights["w"].bfloat16().float())):
        driver = RolloutDriver(None, None, TaskSampler([]), RolloutConfig(lag=0, weight_dtype=dtype), None)
        driver.publish(weights, 0)
        ((version, got),) = driver.snapshots
        assert version == 0 and got["w"].dtype == torch.float32 and torch.equal(got["w"], want)
        assert torch.equal(got["steps"], weights["steps"]) and got["w"].data_ptr() != weights["w"].data_ptr()
    assert not torch.equal(weights["w"], weights["w"].bfloat16().float())


def test_the_driver_copies_published_weights_unless_they_are_handed_over():
    """`owned`: the trainer's gathered weights (and a bf16 wire's, already rounded) are kept as they are, not copied
    a second time; weights the caller still holds (a model's own tensors) are always copied, bf16 ones included."""
    from trainer.rollout.config import RolloutConfig
    from trainer.rollout.driver import RolloutDriver, TaskSampler

    weights = {"w": torch.randn(5, 7).bfloat16(), "v": torch.randn(3), "steps": torch.arange(3)}
    for dtype in ("float32", "bfloat16"):
        for owned in (False, True):
            driver = RolloutDriver(None, None, TaskSampler([]), RolloutConfig(lag=0, weight_dtype=dtype), None)
            driver.publish(weights, 0, owned=owned)
            ((_, got),) = driver.snapshots
            v = weights["v"].bfloat16().float() if dtype == "bfloat16" else weights["v"]
            assert torch.equal(got["w"], weights["w"]) and torch.equal(got["steps"], weights["steps"])
            assert got["v"].dtype == torch.float32 and torch.equal(got["v"], v)
            assert (got["w"].data_ptr() == weights["w"].data_ptr()) == owned
            assert (got["steps"].data_ptr() == weights["steps"].data_ptr()) == owned
            # fp32 under bf16 rollouts is a new, rounded tensor either way
            assert (got["v"].data_ptr() == weights["v"].data_ptr()) == (owned and dtype == "float32")


def test_the_live_line_shows_the_update_its_metrics_and_the_time_left():
    from trainer.train import live_line

    row = {"success_rate": 0.5, "eval_success": None, "approx_kl": 0.00123, "entropy": 1.5, "grad_norm": 2.0}
    assert live_line(row, 3, 10, 65.0) == (
        "[update 3/10] success=0.5 eval=- kl=0.00123 entropy=1.5 grad_norm=2 s_per_update=65 eta=0:07:35"
    )
    assert live_line(row, 10, 10, 65.0).endswith("eta=0:00:00")
    assert live_line(row, 0, 100, 3600.0).endswith("eta=100:00:00")


def test_the_logs_are_flushed_while_the_cell_runs(tmp_path, monkeypatch):
    """Between checkpoints (none here) the Parquet logs are rewritten every LIVE_FLUSH_S seconds (0: every update),
    so a running cell can be read; each flush holds every update so far."""
    import trainer.train as train_module
    from trainer.config import config_from_dict
    from trainer.logs.parquet_log import MetricsLog

    flushed = []
    original = MetricsLog.flush

    def spy(log):
        if log.path.name == "metrics.parquet":
            flushed.append(len(log))
        original(log)

    monkeypatch.setattr(train_module, "LIVE_FLUSH_S", 0.0)
    monkeypatch.setattr(MetricsLog, "flush", spy)
    cell = {
        "recipe": "spo_muon",
        "env": {"name": "recall", "eval_tasks": 4},
        "rollout": {"engine": "hf", "batch_size": 8, "max_turn_tokens": 1, "max_episode_tokens": 32},
        "run": {"updates": 3, "eval_every": 0, "checkpoint_every": 0},
    }
    train_module.train(config_from_dict(cell), tmp_path / "out", progress=False)
    assert flushed == [1, 2, 3, 3]  # after each update, then at the end


@pytest.mark.slow
def test_an_error_is_one_line_with_the_traceback_kept_in_the_cells_folder(tmp_path):
    """Not a config error (here: checkpoints of an earlier run in --out): one line naming it, exit 1, the traceback
    in OUT/error.log; `--debug` prints the traceback instead."""
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "ckpt-00000001.pt").write_bytes(b"")
    cfg = str(_write(tmp_path, MINIREPO_CELL))
    r = _cli("train", "--config", cfg, "--out", str(out), "--no-progress")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: FileExistsError: {out / 'checkpoints'} holds checkpoints of an earlier run: pass --resume to "
        f"continue it, or use a fresh --out directory (traceback in {out / 'error.log'})"
    )
    assert (out / "error.log").read_text().startswith("Traceback (most recent call last)")
    r = _cli("--debug", "train", "--config", cfg, "--out", str(out), "--no-progress")
    assert r.returncode == 1 and "Traceback (most recent call last)" in r.stderr and "FileExistsError" in r.stderr
