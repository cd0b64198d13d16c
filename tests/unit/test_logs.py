"""trainer.logs: Parquet metrics logs, checkpoints, RNG state and provenance.

Crashes are simulated two ways: a writer made to raise halfway (monkeypatched), and a forked child process
training a toy model, killed with SIGKILL at a random moment and then resumed, which must end with the same
metrics and weights as a run that was never interrupted.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import random
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import trainer.logs.provenance as provenance_module
from trainer.checkpoints import (
    capture_rng_state,
    list_checkpoints,
    load_latest_checkpoint,
    restore_rng_state,
    save_checkpoint,
)
from trainer.logs import EPISODE_COLUMNS, METRIC_COLUMNS, MetricsLog, collect_provenance, read_log
from trainer.logs.parquet_log import CONFIG_KEY
from trainer.logs.provenance import KERNEL_CAPS

torch.set_num_threads(1)

DESIGN_METRICS = """update, policy_version, success_rate, reward_mean, n_trajectories, gen_tokens, response_len_mean,
turns_mean, tool_error_rate, overlong_rate, advantage_std, entropy, approx_kl, clip_frac_low, clip_frac_high,
tis_weight_mean, tis_truncated_frac, staleness_mean, staleness_max, grad_norm, update_rms,
update_spectral_norm, lr, loss, eval_success, rollout_s, train_s, wall_s"""  # the metric contract, written out independently of METRIC_COLUMNS
INT_METRICS = {
    "update",
    "policy_version",
    "n_trajectories",
    "gen_tokens",
    "optimizer_steps",
    "skipped_steps",
    "no_signal_steps",
}


def prov(config: dict | None = None) -> dict:
    return collect_provenance({"recipe": "full", "seed": 0} if config is None else config)


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


# ---------------------------------------------------------------------------------------------------------------
# Provenance


@dataclass
class _Optim:
    name: str
    betas: tuple


def test_provenance_has_every_field_and_is_json():
    config = {"optim": _Optim("muon", (0.9, 0.95)), "out": Path("/tmp/x"), "seed": np.int64(3), "n": None}
    p = collect_provenance(config)
    assert json.loads(json.dumps(p)) == p  # JSON round trip loses nothing
    assert p["config"] == {"optim": {"name": "muon", "betas": [0.9, 0.95]}, "out": "/tmp/x", "seed": 3, "n": None}
    assert p["versions"]["python"] == platform.python_version()
    assert (
        p["trainer_version"]
        == (Path(__file__).parents[2] / "trainer/__init__.py").read_text().split('TRAINER_VERSION = "')[1].split('"')[0]
    )
    assert p["versions"]["torch"] == torch.__version__
    assert p["versions"]["numpy"] == np.__version__ and p["versions"]["pyarrow"] == pa.__version__
    hw = p["hardware"]
    assert hw["logical_cores"] == os.cpu_count() and hw["torch_threads"] == torch.get_num_threads() == 1
    assert hw["cuda_devices"] == (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    assert isinstance(hw["processor"], str) and hw["processor"]
    flags = next(
        (
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.split(":")[0].strip() in ("flags", "Features")
        ),
        [],
    )
    for flag in ("avx2", "avx512f", "avx512_bf16", "amx_tile"):  # the features that pick torch's CPU kernels
        assert (flag in hw["cpu_features"]) == (flag in flags), (flag, hw["cpu_features"])
    assert hw["kernel_caps"] == {k: os.environ[k] for k in KERNEL_CAPS if os.environ.get(k)}
    assert hw["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert p["argv"] == sys.argv and isinstance(p["hostname"], str)
    stamp = datetime.fromisoformat(p["timestamp_utc"])
    assert stamp.utcoffset() == timedelta(0) and abs(datetime.now(UTC) - stamp) < timedelta(minutes=1)


@pytest.mark.skipif(
    not Path("/proc/cpuinfo").exists() or "avx2" not in Path("/proc/cpuinfo").read_text(),
    reason="a cap at AVX2 needs an x86 CPU with AVX2 (every CI machine is one, so there it runs)",
)
def test_provenance_records_kernel_caps_and_the_level_torch_runs_at():
    """ATEN_CPU_CAPABILITY is torch's documented cap on its kernels' instruction set: set, torch reports it as its
    level and provenance records it with the other libraries' caps."""
    code = "import json, trainer.logs.provenance as p; h = p.hardware(); print(json.dumps([h['kernel_caps'], h['cpu_capability']]))"
    caps = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
    env = {k: v for k, v in os.environ.items() if k not in KERNEL_CAPS}
    out = subprocess.run([sys.executable, "-c", code], env={**env, **caps}, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [caps, "AVX2"]
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    recorded, level = json.loads(out.stdout)
    assert recorded == {} and level in ("AVX2", "AVX512")


def test_provenance_git_revision_matches_git_itself():
    root = provenance_module.PROJECT_ROOT
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    top = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if head.returncode != 0 or Path(top.stdout.strip()).resolve() != root:
        pytest.skip("the package is not in a git checkout here")
    g = prov()["git"]
    assert g["commit"] == head.stdout.strip() and len(g["commit"]) == 40
    assert isinstance(g["dirty"], bool)


def test_provenance_never_crashes_outside_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance_module, "PROJECT_ROOT", tmp_path)  # a plain directory, no .git
    assert prov()["git"] == {"commit": "unknown", "dirty": "unknown"}

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(provenance_module.subprocess, "run", no_git)
    monkeypatch.setattr(provenance_module, "PACKAGES", ("numpy", "surely-not-an-installed-package"))
    p = prov()
    assert p["git"] == {"commit": "unknown", "dirty": "unknown"}
    assert set(p["versions"]) == {"python", "numpy"}  # the missing package is omitted, not an error


def test_provenance_rejects_non_json_config_naming_the_entry():
    with pytest.raises(TypeError, match=r"config\.optim\.fn"):
        collect_provenance({"optim": {"fn": object()}})
    with pytest.raises(TypeError, match=r"config\.grid\[1\]"):
        collect_provenance({"grid": [1, {2, 3}]})
    with pytest.raises(TypeError, match="str keys"):
        collect_provenance({"lrs": {1: 0.1}})


# ---------------------------------------------------------------------------------------------------------------
# Parquet logs


def test_metric_columns_follow_design_in_order_with_dtypes():
    names = [n.strip() for n in DESIGN_METRICS.split(",")]
    # DESIGN's, then the companion's gradient SNR, the optimizer steps taken and skipped, SPO's informed baselines,
    # the cheating probe, the embedding and head's step sizes, the mini-batches without signal, the tamper rate
    assert (
        list(METRIC_COLUMNS)
        == [
            *names,
            "grad_snr",
            "optimizer_steps",
            "skipped_steps",
            "baseline_informed_frac",
            "cheat_rate",
            "embed_head_update_rms",
            "embed_head_update_spectral_norm",
            "no_signal_steps",
            "tamper_rate",
        ]
        and len(names) == 28
    )
    for name, dtype in METRIC_COLUMNS.items():
        assert dtype == (pa.int64() if name in INT_METRICS else pa.float64()), name
    assert list(EPISODE_COLUMNS) == [
        "update",
        "task_id",
        "reward",
        "success",
        "n_turns",
        "gen_tokens",
        "length",
        "truncated",
        "staleness",
        "policy_version",
        "tool_errors",
        "overlong_turns",
        "split",
        "baseline_informed",
        "graded_reward",
        "tamper_flags",
    ]
    assert EPISODE_COLUMNS["task_id"] == pa.string() and EPISODE_COLUMNS["success"] == pa.bool_()


def test_round_trip_dtypes_nulls_nan_and_metadata(tmp_path):
    path = tmp_path / "metrics.parquet"
    p = prov({"recipe": "spo_muon", "lr": 0.02})
    log = MetricsLog(path, p)
    log.append(
        {
            "update": 0,
            "policy_version": 0,
            "success_rate": 0.25,
            "gen_tokens": np.int64(120),
            "eval_success": 0.5,
            "lr": np.float32(0.5),
        }
    )
    log.append({"update": 1, "policy_version": 1, "success_rate": 0.5, "gen_tokens": 130.0, "loss": float("nan")})
    log.flush()

    df, back = read_log(path)
    assert back == p
    assert json.loads(pq.read_schema(path).metadata[CONFIG_KEY]) == {"recipe": "spo_muon", "lr": 0.02}
    assert list(df.columns) == list(METRIC_COLUMNS)
    for name in METRIC_COLUMNS:
        assert df[name].dtype == (pd.Int64Dtype() if name in INT_METRICS else np.float64), name
    assert df["update"].tolist() == [0, 1] and df["gen_tokens"].tolist() == [120, 130]
    assert df["success_rate"].tolist() == [0.25, 0.5] and df.loc[0, "lr"] == 0.5
    assert df.loc[0, "eval_success"] == 0.5 and math.isnan(df.loc[1, "eval_success"])
    assert df["n_trajectories"].isna().all()  # never given -> null, still Int64
    table = pq.read_table(path)  # Parquet keeps "not measured" (null) apart from "measured NaN"
    assert table["eval_success"].is_null().to_pylist() == [False, True]
    assert table["loss"].is_null().to_pylist() == [True, False] and math.isnan(table["loss"][1].as_py())


def test_episode_table_round_trip(tmp_path):
    path = tmp_path / "episodes.parquet"
    log = MetricsLog(path, prov(), EPISODE_COLUMNS)
    log.append(
        {
            "update": 3,
            "task_id": "repo-7",
            "reward": 1.0,
            "success": True,
            "n_turns": 4,
            "gen_tokens": 91,
            "length": 400,
            "truncated": False,
            "staleness": 1,
            "policy_version": 2,
            "tool_errors": 0,
            "overlong_turns": 1,
            "split": "train",
        }
    )
    log.append({"update": 3, "task_id": "repo-9", "reward": 0.0, "success": np.bool_(False), "split": "eval"})
    log.flush()
    df, _ = read_log(path)
    assert df["task_id"].tolist() == ["repo-7", "repo-9"] and df["split"].tolist() == ["train", "eval"]
    assert df["success"].dtype == pd.BooleanDtype() and df["success"].tolist() == [True, False]
    assert df["truncated"].tolist()[0] is False and pd.isna(df["truncated"].tolist()[1])
    assert df["overlong_turns"].tolist()[0] == 1 and pd.isna(df["n_turns"].tolist()[1])


def test_unknown_column_is_rejected_by_name(tmp_path):
    log = MetricsLog(tmp_path / "m.parquet", prov())
    with pytest.raises(ValueError, match="sucess_rate"):
        log.append({"update": 0, "sucess_rate": 0.5})
    assert len(log) == 0


@pytest.mark.parametrize(
    "column,value",
    [
        ("update", True),
        ("gen_tokens", 1.5),
        ("gen_tokens", float("nan")),
        ("gen_tokens", 2**63),
        ("loss", "0.3"),
        ("loss", True),
        ("loss", torch.tensor(0.5)),
        ("update", None),
    ],
)
def test_ill_typed_values_are_rejected_naming_the_column(tmp_path, column, value):
    log = MetricsLog(tmp_path / "m.parquet", prov())
    with pytest.raises(ValueError, match=f"'{column}'"):
        log.append({"update": 0, column: value})
    assert len(log) == 0


def test_provenance_without_config_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="config"):
        MetricsLog(tmp_path / "m.parquet", {"git": "x"})


_value = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**6), 10**6))
_int = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {"update": st.integers(0, 1000)},
            optional={name: (_int if name in INT_METRICS else _value) for name in METRIC_COLUMNS if name != "update"},
        ),
        max_size=6,
    )
)
def test_any_rows_round_trip_exactly(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("prop") / "m.parquet"
    log = MetricsLog(path, prov())
    for row in rows:
        log.append(row)
    log.flush()
    back = MetricsLog.load(path).rows
    assert len(back) == len(rows)
    for row, got in zip(rows, back):
        for name in METRIC_COLUMNS:
            want = row.get(name)  # absent -> None; an int given to a float column comes back as that float
            want = want if want is None or name in INT_METRICS else float(want)
            assert type(got[name]) is type(want), name
            assert got[name] == want or (math.isnan(want) and math.isnan(got[name])), name


def test_crash_inside_the_writer_leaves_previous_file_and_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "metrics.parquet"
    log = MetricsLog(path, prov())
    log.append({"update": 0, "loss": 1.0})
    log.flush()
    before = path.read_bytes()
    log.append({"update": 1, "loss": 2.0})
    real_write = pq.write_table

    def half_then_crash(table, where, **kwargs):
        real_write(table, where, **kwargs)
        data = Path(where).read_bytes()
        Path(where).write_bytes(data[: len(data) // 2])  # a truncated Parquet file, as a crash would leave
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", half_then_crash)
    with pytest.raises(OSError, match="disk full"):
        log.flush()
    assert path.read_bytes() == before and visible(tmp_path) == ["metrics.parquet"]
    assert read_log(path)[0]["update"].tolist() == [0]
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # the temp file's 0600 did not stick

    monkeypatch.setattr(pq, "write_table", real_write)

    def failing_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="rename failed"):
        log.flush()
    assert path.read_bytes() == before and visible(tmp_path) == ["metrics.parquet"]

    monkeypatch.undo()
    log.flush()
    assert read_log(path)[0]["update"].tolist() == [0, 1]


def test_leftover_temp_is_invisible_to_globs_and_removed_by_next_writer(tmp_path):
    leftover = tmp_path / ".metrics.parquet.k3j9x.tmp"
    leftover.write_bytes(b"PAR1 half a file")
    other = tmp_path / ".episodes.parquet.abcde.tmp"  # another log's temp: not this writer's business
    other.write_bytes(b"x")
    assert list(tmp_path.glob("*.parquet")) == []
    MetricsLog(tmp_path / "metrics.parquet", prov())
    assert not leftover.exists() and other.exists()


def test_load_truncate_append_resume(tmp_path):
    path = tmp_path / "metrics.parquet"
    first = prov({"recipe": "full"})
    log = MetricsLog(path, first)
    for u in range(5):
        log.append({"update": u, "loss": float(u)})
    log.flush()

    again = prov({"recipe": "full"})
    resumed = MetricsLog.load(path, again, METRIC_COLUMNS)
    assert [r["update"] for r in resumed.rows] == [0, 1, 2, 3, 4]
    assert resumed.truncate(2) == 2  # updates 3 and 4 were logged after the checkpoint at update 2
    resumed.append({"update": 3, "loss": 30.0})
    resumed.flush()
    df, p = read_log(path)
    assert df["update"].tolist() == [0, 1, 2, 3] and df["loss"].tolist() == [0.0, 1.0, 2.0, 30.0]
    assert p["previous"] == first and p["timestamp_utc"] == again["timestamp_utc"]

    assert MetricsLog.load(path).provenance == p  # no new provenance: the file's is kept as is
    with pytest.warns(UserWarning, match="config"):
        MetricsLog.load(path, prov({"recipe": "no_tool"}))
    with pytest.raises(ValueError, match="differ"):
        MetricsLog.load(path, schema_columns=EPISODE_COLUMNS)


def test_rows_carried_in_a_checkpoint_can_be_assigned_back(tmp_path):
    log = MetricsLog(tmp_path / "episodes.parquet", prov(), EPISODE_COLUMNS)
    log.append({"update": 0, "task_id": "a", "success": True, "reward": 1})
    log.append({"update": 1, "task_id": "b", "success": False})
    save_checkpoint(tmp_path / "ckpt", step=1, model_state={}, optimizer_state={}, extra={"episode_rows": log.rows})
    saved = load_latest_checkpoint(tmp_path / "ckpt")["extra"]["episode_rows"]

    resumed = MetricsLog(tmp_path / "episodes.parquet", prov(), EPISODE_COLUMNS)
    resumed.rows = saved
    assert resumed.rows == log.rows and resumed.rows[0]["reward"] == 1.0 and resumed.rows[1]["reward"] is None
    with pytest.raises(ValueError, match="'succes'"):  # checked like append; nothing replaced on error
        resumed.rows = [{"update": 2, "task_id": "c"}, {"update": 3, "succes": True}]
    assert [r["task_id"] for r in resumed.rows] == ["a", "b"]


def test_read_log_refuses_a_file_without_provenance(tmp_path):
    path = tmp_path / "foreign.parquet"
    pq.write_table(pa.table({"update": [0]}), path)
    with pytest.raises(ValueError, match="harness.provenance"):
        read_log(path)


def test_logs_and_analysis_import_without_torch():
    """The analysis environment reads logs without torch: `trainer.logs` (its Parquet tables) and `trainer.analysis`
    must import with torch blocked (checkpoints, which need torch, live in trainer.checkpoints)."""
    code = (
        "import sys\nsys.modules['torch'] = None\n"
        "import trainer.logs, trainer.logs.parquet_log, trainer.logs.provenance, trainer.analysis\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n    import trainer.checkpoints\nexcept ImportError:\n    print('blocked')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "blocked"  # the block works: the checkpoint module does need torch


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints


def tiny_model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    return model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.01)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()


def test_checkpoint_round_trip_continues_bit_for_bit(tmp_path):
    x = torch.arange(6.0).reshape(2, 3) / 6
    model, opt = tiny_model_and_optimizer()
    for _ in range(2):
        train_step(model, opt, x)
    tracker = {"version": 1, "tasks": {"t1": {"alpha": 1.5, "beta": 0.5, "visits": 3}}}
    path = save_checkpoint(
        tmp_path,
        step=2,
        model_state=model.state_dict(),
        optimizer_state=opt.state_dict(),
        extra={"tracker": tracker, "note": ("a", 1)},
    )
    assert path.name == "ckpt-00000002.pt"

    ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt["step"] == 2 and ckpt["path"] == path
    assert ckpt["extra"] == {"tracker": tracker, "note": ("a", 1)}
    model2, opt2 = tiny_model_and_optimizer(seed=1)  # different initial weights, overwritten by the load
    model2.load_state_dict(ckpt["model_state"])
    opt2.load_state_dict(ckpt["optimizer_state"])
    assert int(opt2.state_dict()["state"][0]["step"]) == 2
    train_step(model, opt, x)
    train_step(model2, opt2, x)
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_keep_k(tmp_path):
    for step in range(1, 6):
        save_checkpoint(tmp_path, step=step, model_state={}, optimizer_state={}, extra={}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    save_checkpoint(tmp_path, step=6, model_state={}, optimizer_state={}, extra={}, keep=1)
    assert visible(tmp_path) == ["ckpt-00000006.pt"]


def test_partial_and_corrupt_checkpoints_are_skipped_with_a_warning(tmp_path):
    for step in (1, 2):
        save_checkpoint(
            tmp_path,
            step=step,
            model_state={"w": torch.full((64,), float(step))},
            optimizer_state={},
            extra={"step": step},
        )
    good = (tmp_path / "ckpt-00000002.pt").read_bytes()
    (tmp_path / ".ckpt-00000003.pt.x1y2z3.tmp").write_bytes(good[:100])  # a save killed halfway
    (tmp_path / "ckpt-00000004.pt").write_bytes(good[: len(good) // 2])  # truncated (e.g. disk failure)
    (tmp_path / "ckpt-00000005.pt").write_bytes(good)  # readable, but the step inside says 2
    with pytest.warns(UserWarning) as record:
        ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt["step"] == 2 and torch.equal(ckpt["model_state"]["w"], torch.full((64,), 2.0))
    text = " ".join(str(w.message) for w in record)
    assert ".ckpt-00000003.pt.x1y2z3.tmp" in text and "ckpt-00000004.pt" in text and "ckpt-00000005.pt" in text

    # resuming from 2, the next save is step 3: the temp file and the abandoned (unreadable) steps 4, 5 go
    save_checkpoint(tmp_path, step=3, model_state={}, optimizer_state={}, extra={}, keep=2)
    assert visible(tmp_path) == ["ckpt-00000002.pt", "ckpt-00000003.pt"]


def test_crash_inside_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, step=1, model_state={"w": torch.ones(3)}, optimizer_state={}, extra={})
    real_save = torch.save

    def half_then_crash(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        data = Path(f).read_bytes()
        Path(f).write_bytes(data[: len(data) // 2])
        raise KeyboardInterrupt  # not even an Exception: the temp file must still go

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, step=2, model_state={"w": torch.zeros(3)}, optimizer_state={}, extra={})
    assert visible(tmp_path) == ["ckpt-00000001.pt"]
    assert torch.equal(load_latest_checkpoint(tmp_path)["model_state"]["w"], torch.ones(3))


def test_checkpoint_rejects_bad_input(tmp_path):
    with pytest.raises(TypeError, match=r"\['extra'\]\['fn'\]"):
        save_checkpoint(tmp_path, step=0, model_state={}, optimizer_state={}, extra={"fn": print})
    with pytest.raises(TypeError, match=r"\['extra'\]\['arr'\]"):
        save_checkpoint(tmp_path, step=0, model_state={}, optimizer_state={}, extra={"arr": np.zeros(2)})
    with pytest.raises(TypeError, match=r"\['extra'\]\['stats'\]\[1\]"):  # np.float64 is a float, but would
        save_checkpoint(
            tmp_path,
            step=0,
            model_state={},
            optimizer_state={},  # not load with weights_only
            extra={"stats": [1.0, np.float64(2.0)]},
        )
    with pytest.raises(ValueError, match="step"):
        save_checkpoint(tmp_path, step=-1, model_state={}, optimizer_state={}, extra={})
    with pytest.raises(ValueError, match="keep"):
        save_checkpoint(tmp_path, step=0, model_state={}, optimizer_state={}, extra={}, keep=0)
    assert visible(tmp_path) == []  # nothing written
    assert load_latest_checkpoint(tmp_path) is None and load_latest_checkpoint(tmp_path / "absent") is None


# ---------------------------------------------------------------------------------------------------------------
# RNG state


def draw(gens: dict) -> list:
    return [
        random.random(),
        float(np.random.rand()),
        np.random.normal(),
        torch.rand(3).tolist(),
        torch.randn(2, generator=gens["sampler"]).tolist(),
        gens["np"].integers(0, 10**9, 3).tolist(),
        gens["py"].random(),
        gens["mt"].random(),
    ]


def test_rng_restore_makes_every_generator_draw_the_same_numbers(tmp_path):
    gens = {
        "sampler": torch.Generator().manual_seed(5),
        "np": np.random.default_rng(6),
        "py": random.Random(7),
        "mt": np.random.Generator(np.random.MT19937(8)),
    }
    draw(gens)  # move away from the seeds
    state = capture_rng_state(gens)
    first = draw(gens)
    assert draw(gens) != first  # the streams do move on
    restore_rng_state(state, gens)
    assert draw(gens) == first
    # and through a checkpoint file (weights_only load): the state is plain data
    save_checkpoint(tmp_path, step=0, model_state={}, optimizer_state={}, extra={"rng": state})
    draw(gens)
    restore_rng_state(load_latest_checkpoint(tmp_path)["extra"]["rng"], gens)
    assert draw(gens) == first


def test_rng_restore_demands_the_same_generators():
    state = capture_rng_state({"sampler": torch.Generator()})
    with pytest.raises(ValueError, match="sampler"):
        restore_rng_state(state, {})
    with pytest.raises(ValueError, match="sampler"):
        restore_rng_state(state, {"sampler": random.Random()})
    with pytest.raises(TypeError, match="'bad'"):
        capture_rng_state({"bad": 42})


# ---------------------------------------------------------------------------------------------------------------
# SIGKILL and resume: a toy training loop that uses every piece the trainer will

N_STEPS, BALLAST = 30, 2**21  # 2M float32 = 8 MB per checkpoint: a save takes long enough to be hit by a kill


def toy_run(directory: Path, every: int = 5, sleep_s: float = 0.0) -> tuple[nn.Module, Path]:
    """Train to N_STEPS, resuming from the latest checkpoint in `directory` if there is one.

    The checkpoint interval and the sleep change when things happen, never what is computed."""
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    sampler = torch.Generator().manual_seed(1)
    model = nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    log_path = directory / "metrics.parquet"
    log, start = MetricsLog(log_path, prov({"toy": True})), 0
    ckpt = load_latest_checkpoint(directory)
    if ckpt is not None:
        model.load_state_dict(ckpt["model_state"])
        opt.load_state_dict(ckpt["optimizer_state"])
        restore_rng_state(ckpt["extra"]["rng"], {"sampler": sampler})
        log = MetricsLog.load(log_path, prov({"toy": True}))
        log.truncate(ckpt["step"])
        start = ckpt["step"] + 1
    for update in range(start, N_STEPS):
        x = torch.randn(8, 4)
        y = x.sum(1, keepdim=True) + 0.1 * torch.from_numpy(np.random.normal(size=(8, 1))).float()
        pick = torch.randint(0, 8, (4,), generator=sampler)
        weight = 1.0 + random.random()
        opt.zero_grad()
        loss = weight * (model(x)[pick] - y[pick]).pow(2).mean()
        loss.backward()
        grad_norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()
        opt.step()
        log.append(
            {
                "update": update,
                "loss": loss.item(),
                "grad_norm": grad_norm,
                "reward_mean": weight,
                "lr": 0.05,
                "n_trajectories": 8,
            }
        )
        log.flush()  # the log is flushed before the checkpoint, so it never lags behind it
        if update % every == 0:
            save_checkpoint(
                directory,
                step=update,
                model_state=model.state_dict(),
                optimizer_state=opt.state_dict(),
                keep=2,
                extra={
                    "rng": capture_rng_state({"sampler": sampler}),
                    "step": update,
                    "ballast": torch.full((BALLAST,), float(update)),
                },
            )
        time.sleep(sleep_s)
    return model, log_path


def _killable_child(directory: Path) -> None:
    toy_run(directory, every=1, sleep_s=0.04)  # a save every update: about a third of its time is spent saving


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork and SIGKILL (POSIX)")
def test_sigkill_at_random_moments_then_resume_matches_uninterrupted_run(tmp_path):
    ref_model, ref_log = toy_run(tmp_path / "reference")
    reference = read_log(ref_log)[0]
    assert reference["update"].tolist() == list(range(N_STEPS))

    # Forked, not spawned: a fresh interpreter would spend seconds importing torch. The child is still a
    # separate process, killed by a real SIGKILL at a random moment (a new one each time the suite runs).
    delays = [random.Random().uniform(0.05, 0.9) for _ in range(3)]
    dirs = [tmp_path / f"killed{i}" for i in range(len(delays))]
    fork = multiprocessing.get_context("fork")
    children = [fork.Process(target=_killable_child, args=(d,), daemon=True) for d in dirs]
    try:
        for child in children:
            child.start()
        start = time.monotonic()
        for child, delay in sorted(zip(children, delays), key=lambda pair: pair[1]):
            time.sleep(max(0.0, start + delay - time.monotonic()))
            os.kill(child.pid, signal.SIGKILL)
    finally:
        for child in children:
            child.kill()
            child.join()
    for child, directory, delay in zip(children, dirs, delays):
        where = f"killed after {delay:.3f} s in {directory}: {visible(directory)}"
        assert child.exitcode == -signal.SIGKILL, where  # killed mid-run, not finished (>= 1.2 s of sleep)
        partial = []  # a kill before the first flush leaves no log at all, which is fine
        if (directory / "metrics.parquet").exists():  # otherwise it must be readable, never truncated
            partial = read_log(directory / "metrics.parquet")[0]["update"].tolist()
        assert partial == list(range(len(partial))), where
        leftovers = list(directory.glob(".ckpt-*.tmp"))  # there when the kill landed inside a save
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ckpt = load_latest_checkpoint(directory)
        assert len(caught) == len(leftovers), where
        assert all(any(str(p) in str(w.message) for w in caught) for p in leftovers), where
        if ckpt is not None:  # complete: the step, weights, RNG and ballast all belong together
            assert ckpt["extra"]["step"] == ckpt["step"] <= len(partial) - 1, where
            assert torch.equal(ckpt["extra"]["ballast"], torch.full((BALLAST,), float(ckpt["step"]))), where
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the same leftover, warned about just above
            model, log_path = toy_run(directory)
        pd.testing.assert_frame_equal(read_log(log_path)[0], reference, check_exact=True, obj=where)
        for a, b in zip(model.parameters(), ref_model.parameters()):
            assert torch.equal(a, b), where


def test_an_episodes_grading_goes_into_its_row_and_the_updates_tamper_rate():
    """What the environment's grading saw (`last_grading`, copied onto the episode) fills `graded_reward` and
    `tamper_flags`; the update's `tamper_rate` is the share of graded episodes with flags, null when no episode was
    graded that way (every family but swe)."""
    from trainer.logs.rows import episode_row, tamper_rate
    from trainer.rl.config import ShapingConfig
    from trainer.rollout.episode import Episode

    def episode(grading):
        e = Episode(task_id="t")
        if grading is not None:
            e.extra["grading"] = grading
        return e

    flagged = episode({"graded_reward": 1.0, "tamper_flags": ["exit hooks: a.py:3: atexit", "monkeypatch: a.py:4: x"]})
    clean = episode({"graded_reward": 1.0, "tamper_flags": []})
    plain = episode(None)
    rows = [
        episode_row(e, update=0, split="train", staleness=0, shaping=ShapingConfig()) for e in (flagged, clean, plain)
    ]
    assert [(r["graded_reward"], r["tamper_flags"]) for r in rows] == [
        (1.0, "exit hooks: a.py:3: atexit; monkeypatch: a.py:4: x"),
        (1.0, ""),
        (None, None),
    ]
    assert tamper_rate([flagged, clean, plain]) == 0.5 and tamper_rate([plain]) is None


def test_provenance_names_the_lock_and_what_differs_from_it(tmp_path):
    from importlib import metadata

    from trainer.logs.provenance import lock_state

    numpy = metadata.version("numpy")
    lock = tmp_path / "requirements.lock"
    lock.write_text(f"# comment\nNumPy=={numpy}\npyyaml==0.0.1\nno-such-package==1.0\n")
    state = lock_state(lock)
    assert state["file"] == "requirements.lock" and len(state["sha256"]) == 64
    assert state["differ"] == {"pyyaml": metadata.version("pyyaml")}  # absent packages are not differences
    assert lock_state(tmp_path / "absent.lock") == {}
