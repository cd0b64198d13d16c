"""Sharded training pieces under real `torchrun` (gloo on CPU, 2 or 3 processes): each check is a script in
tests/distributed/ that asserts what it checks and exits non-zero otherwise."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from builders import TIMING

pytestmark = pytest.mark.slow  # process groups take seconds to start

HERE = Path(__file__).resolve().parents[1] / "distributed"


def torchrun(script: str, nproc: int, *args: str, timeout: float = 300) -> str:
    """Run tests/distributed/<script> on `nproc` local processes; its output, or a failure with it."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={nproc}",
                str(HERE / script),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{script} on {nproc} processes did not finish in {timeout} s (deadlock?): {exc.stdout}")
    assert run.returncode == 0, f"{script} on {nproc} processes failed:\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}"
    return run.stdout


@pytest.mark.parametrize("nproc", [2, 3])
def test_sharded_muon_equals_torch_muon_bit_for_bit(nproc):
    assert f"muon parity OK on {nproc} ranks" in torchrun("muon_parity.py", nproc)


@pytest.mark.parametrize("nproc", [2, 3])
def test_sharded_gradients_equal_one_process(nproc):
    """Tiny Qwen3 and Qwen3.5, unequal tokens and micro-batches per rank, all four aggregations, with and without
    activation checkpointing; a one-row batch leaves the other ranks with nothing and must not hang."""
    assert f"fsdp parity OK on {nproc} ranks" in torchrun("fsdp_parity.py", nproc, timeout=400)


@pytest.mark.parametrize("nproc", [2, 3])
def test_weights_are_gathered_onto_rank_0_alone_as_torch_gathers_them(nproc):
    """What a push hands the rollouts: torch's full state dict, in fp32 or cast to bf16 shard by shard."""
    assert f"weight gather OK on {nproc} ranks" in torchrun("weight_gather.py", nproc)


CELL = {
    "recipe": "full",
    "env": {"name": "minirepo", "options": {"max_depth": 1, "max_turns": 6}, "eval_tasks": 4},
    "shaping": {"length_threshold": 12},
    "rollout": {"mode": "lagged", "lag": 1, "batch_size": 5, "max_turn_tokens": 12, "max_episode_tokens": 256},
    "run": {
        "updates": 4,
        "eval_every": 2,
        "checkpoint_every": 1,
        "seed": 3,
        "minibatches": 2,
        "skip_no_signal": False,
        "micro_batch_tokens": 64,
        "activation_checkpointing": True,
        "logprob_chunk_tokens": 32,
    },
}
"""Five episodes a batch over two ranks (three and two, in micro-batches of unequal count)."""


def _train_command(cell, out, nproc, *extra):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [*launcher, "-m", "trainer", "train", "--config", str(cell), "--out", str(out), "--no-progress", *extra]


def _env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(HERE.parents[1]))


def _metrics(out):
    from trainer.logs.parquet_log import read_log

    return read_log(out / "metrics.parquet")[0].drop(columns=TIMING)


def _write_cell(path: Path, cell: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(cell))
    return path


def _proc_stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the process name ([state, ppid, ...]); [] once it is gone (Linux)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _descendants(pid: int) -> list[int]:
    parents = {int(p.name): stat[1] for p in Path("/proc").glob("[0-9]*") if (stat := _proc_stat(int(p.name)))}
    found, todo = [], [pid]
    while todo:
        parent = str(todo.pop())
        children = [child for child, ppid in parents.items() if ppid == parent]
        found += children
        todo += children
    return found


def _kill_after_checkpoint(cell: Path, out: Path, name: str) -> None:
    """Start the 2-process cell and SIGKILL torchrun and its workers once checkpoints/`name` exists. The workers
    are killed by pid: torchrun starts each in a session of its own, so killing torchrun's process group would
    leave them training on, writing into `out` beside the resumed run."""
    import signal
    import time

    proc = subprocess.Popen(
        _train_command(cell, out, 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=_env(),
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not (out / "checkpoints" / name).exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    workers = _descendants(proc.pid)
    for pid in [*workers, proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    deadline = time.time() + 30
    while any(_proc_stat(pid)[:1] not in ([], ["Z"], ["X"]) for pid in workers) and time.time() < deadline:
        time.sleep(0.05)  # until they are dead (a zombie writes nothing)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """The 2-process cell run uninterrupted with full-format checkpoints and its final policy saved:
    (cell.yaml, its output directory, the policy directory)."""
    tmp = tmp_path_factory.mktemp("two_process")
    cell = _write_cell(tmp / "cell.yaml", CELL)
    ref = subprocess.run(
        _train_command(cell, tmp / "ref", 2, "--save-policy", str(tmp / "policy")),
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert ref.returncode == 0, ref.stderr[-4000:]
    return cell, tmp / "ref", tmp / "policy"


def test_a_two_process_cell_trains_is_killed_resumes_and_loads_in_one_process(tmp_path, two_process_run):
    """Sharded training end to end: the metrics of a run killed (SIGKILL) after a checkpoint and resumed equal an
    uninterrupted run's; the first batch equals a one-process run's (same rollouts, update equal up to rounding);
    the saved policy and the checkpoints hold the one-process model's Hugging Face names and load into it."""
    import pandas as pd

    cell, ref, policy = two_process_run
    reference = _metrics(ref)
    assert reference["update"].tolist() == [0, 1, 2, 3] and reference["loss"].notna().all()

    killed = tmp_path / "killed"
    _kill_after_checkpoint(cell, killed, "ckpt-00000002.pt")
    resumed = subprocess.run(
        _train_command(cell, killed, 2, "--resume"), capture_output=True, text=True, timeout=600, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    pd.testing.assert_frame_equal(_metrics(killed), reference)

    single = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "train",
            "--config",
            str(cell),
            "--out",
            str(tmp_path / "single"),
            "--no-progress",
            "--set",
            "run.updates=1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert single.returncode == 0, single.stderr[-4000:]
    one = _metrics(tmp_path / "single").iloc[0]
    first = reference.iloc[0]
    assert one["success_rate"] == first["success_rate"] and one["gen_tokens"] == first["gen_tokens"]
    assert abs(one["loss"] - first["loss"]) <= 1e-5 * max(1.0, abs(first["loss"]))

    from trainer.config import load_config
    from trainer.policy.load import load_policy
    from trainer.train import Trainer

    model, _ = load_policy(policy, "float32")
    plain = Trainer(load_config(cell), tmp_path / "names").model
    assert list(model.state_dict()) == list(plain.state_dict())
    import torch

    ckpt = torch.load(sorted((killed / "checkpoints").glob("ckpt-*.pt"))[-1], weights_only=False)
    assert list(ckpt["model_state"]) == list(plain.state_dict())
    plain.load_state_dict(ckpt["model_state"])  # a sharded run's checkpoint loads into one process


def test_sharded_checkpoints_resume_after_sigkill_on_any_process_count_and_export(tmp_path, two_process_run):
    """`run.checkpoint_format: sharded` (DCP): a 2-process cell killed (SIGKILL) after a checkpoint resumes past a
    leftover temp directory (ignored with a warning, then deleted) and logs the uninterrupted run's metrics (the
    full-format run's: the format changes nothing computed), keeping the last `keep_checkpoints` (2). Its last
    checkpoint exports to a one-process policy with Hugging Face names, and resumes in 1 and in 3 processes (DCP
    reshards), with weights and optimizer state equal to the full-format checkpoint of the same step, bit for
    bit."""
    import shutil

    import pandas as pd
    import torch

    from trainer.checkpoints import read_checkpoint
    from trainer.config import load_config
    from trainer.policy.load import load_policy

    _, ref, _ = two_process_run
    full = read_checkpoint(ref / "checkpoints" / "ckpt-00000003.pt")
    cell = _write_cell(tmp_path / "cell.yaml", {**CELL, "run": {**CELL["run"], "checkpoint_format": "sharded"}})
    killed = tmp_path / "killed"
    _kill_after_checkpoint(cell, killed, "ckpt-00000002")
    leftover = killed / "checkpoints" / ".ckpt-00000003.0badf00d.tmp"  # as a save killed before its rename leaves
    leftover.mkdir(exist_ok=True)
    (leftover / "__1_0.distcp").write_bytes(b"half a shard")
    resumed = subprocess.run(
        _train_command(cell, killed, 2, "--resume"), capture_output=True, text=True, timeout=600, env=_env()
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"ignoring partial checkpoint {leftover}" in resumed.stderr
    pd.testing.assert_frame_equal(_metrics(killed), _metrics(ref))
    ckpts = killed / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-00000002", "ckpt-00000003"]
    assert sorted(p.name for p in (ckpts / "ckpt-00000003").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "extra.pt",
    ]

    def same(got: dict, want: dict, what: str) -> None:
        assert sorted(got) == sorted(want), what
        for k in want:
            assert torch.equal(got[k], want[k]), f"{what}: {k}"

    export = subprocess.run(
        [sys.executable, "-m", "trainer", "export", str(ckpts / "ckpt-00000003"), "--out", str(tmp_path / "policy")],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert export.returncode == 0, export.stderr[-4000:]
    policy, _ = load_policy(tmp_path / "policy", "float32")
    assert list(policy.state_dict()) == list(full["model_state"])  # Hugging Face names, in the model's order
    same(policy.state_dict(), full["model_state"], "exported weights")

    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    from trainer.train import Trainer

    shutil.copytree(killed, tmp_path / "one")
    one = Trainer(load_config(cell), tmp_path / "one")  # one process, no process group
    assert one.resume() and one.updates_done == 3
    same(one.model.state_dict(), full["model_state"], "weights in one process")
    got, want = get_optimizer_state_dict(one.model, one.optimizer), full["extra"]["optimizer"]
    assert sorted(got["state"]) == sorted(want["state"])
    for name in want["state"]:
        same(got["state"][name], want["state"][name], f"optimizer state of {name} in one process")
    assert got["param_groups"] == want["param_groups"]

    shutil.copytree(killed, tmp_path / "three")
    assert "dcp reshard OK on 3 ranks (step 3)" in torchrun(
        "dcp_reshard.py", 3, str(cell), str(tmp_path / "three"), str(ref / "checkpoints" / "ckpt-00000003.pt")
    )
