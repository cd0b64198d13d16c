"""Sharded (DCP) checkpoints in one process: round trips of Muon/AdamW state, the atomic layout, skipping what is
unreadable, pruning, and the trainer's `run.checkpoint_format: sharded` (resume, export). The multi-process cases
(FSDP2 shards, SIGKILL, resharding to 1 and 3 processes) are in tests/integration/test_distributed.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch
from torch import nn

from trainer.checkpoints.sharded import load_sharded_checkpoint, load_sharded_weights, save_sharded_checkpoint
from trainer.checkpoints.store import (
    SHARDED_EXTRA,
    list_checkpoints,
    load_latest_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from trainer.config import ConfigError, config_from_dict
from trainer.optim.hybrid import build_muon_adamw

torch.set_num_threads(1)


class Tiny(nn.Module):
    """Embedding, hidden matrices with biases, a norm and a head: both halves of the Muon/AdamW hybrid."""

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(11, 8)
        self.hidden = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8))
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 11, bias=False)

    def forward(self, x):
        return self.head(self.norm(self.hidden(self.embed(x))))


def _optimizer(model: nn.Module, kind: str) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return build_muon_adamw(model, matrix_lr=0.02, lr=1e-2, head=model.head, ns_dtype=torch.float32)


def _step(model: nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 11, (4, 5), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x).flatten(0, 1), torch.randint(0, 11, (20,), generator=g)).backward()
    opt.step()


def visible(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@pytest.mark.parametrize("kind", ["muon_adamw", "adamw"])
def test_a_sharded_round_trip_continues_bit_for_bit(tmp_path, kind):
    """Muon's momentum, AdamW's moments and step counts, the param groups (Muon's `ns_dtype` as a name, tuples,
    None) all come back, so two more steps from the loaded copy equal two more steps of the original."""
    model = Tiny()
    opt = _optimizer(model, kind)
    for i in range(2):
        _step(model, opt, i)
    path = save_sharded_checkpoint(tmp_path, step=2, model=model, optimizer=opt, extra={"note": ("a", 1)})
    assert path.name == "ckpt-00000002" and visible(path) == [".metadata", "__0_0.distcp", SHARDED_EXTRA]
    ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt["sharded"] and ckpt["optimizer"] and ckpt["step"] == 2 and ckpt["extra"] == {"note": ("a", 1)}
    assert ckpt["model_state"] is None  # the shards load into a model: load_sharded_checkpoint

    copy = Tiny(seed=1)  # other weights, overwritten by the load
    copy_opt = _optimizer(copy, kind)
    for group in copy_opt.param_groups:
        group["lr"] = 0.5  # the loaded param groups replace these
    load_sharded_checkpoint(ckpt["path"], copy, copy_opt, with_optimizer=ckpt["optimizer"])
    if kind == "muon_adamw":
        assert [g["ns_dtype"] for g in copy_opt.param_groups if g["use_muon"]] == ["float32"]
    settings = [[{k: v for k, v in g.items() if k != "params"} for g in o.param_groups] for o in (opt, copy_opt)]
    assert settings[0] == settings[1]
    for i in (2, 3):
        _step(model, opt, i)
        _step(copy, copy_opt, i)
    for (name, a), b in zip(model.state_dict().items(), copy.state_dict().values()):
        assert torch.equal(a, b), name


def test_an_optimizer_that_has_not_stepped_is_left_out(tmp_path):
    """Saving before the first step must not initialise the optimizer (torch's state-dict helper would take a
    zero-lr step: AdamW's step count would run one ahead); loading leaves the fresh optimizer empty too."""
    model = Tiny()
    opt = _optimizer(model, "adamw")
    save_sharded_checkpoint(tmp_path, step=0, model=model, optimizer=opt, extra={})
    assert not opt.state
    ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt["optimizer"] is False
    copy = Tiny(seed=1)
    copy_opt = _optimizer(copy, "adamw")
    load_sharded_checkpoint(ckpt["path"], copy, copy_opt, with_optimizer=ckpt["optimizer"])
    assert not copy_opt.state
    _step(model, opt, 0)
    _step(copy, copy_opt, 0)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copy.parameters()))


def test_partial_and_unreadable_sharded_checkpoints_are_skipped_with_a_warning(tmp_path):
    model = Tiny()
    opt = _optimizer(model, "muon_adamw")
    for step in (1, 2):
        _step(model, opt, step)
        save_sharded_checkpoint(tmp_path, step=step, model=model, optimizer=opt, extra={"step": step})
    good = tmp_path / "ckpt-00000002"
    partial = tmp_path / ".ckpt-00000003.x1y2z3w4.tmp"  # a save killed before rank 0 renamed it
    shutil.copytree(good, partial)
    (partial / ".metadata").unlink()
    shutil.copytree(good, tmp_path / "ckpt-00000004")  # its extra.pt says step 2
    for step, damage in ((5, "truncate"), (6, "no metadata")):
        broken = tmp_path / f"ckpt-{step:08d}"
        shutil.copytree(good, broken)
        payload = torch.load(broken / SHARDED_EXTRA, weights_only=True)
        torch.save({**payload, "step": step}, broken / SHARDED_EXTRA)
        if damage == "truncate":  # a disk failure: the metadata names bytes the shard file lacks
            shard = broken / "__0_0.distcp"
            shard.write_bytes(shard.read_bytes()[:100])
        else:
            (broken / ".metadata").unlink()
    with pytest.warns(UserWarning) as record:
        ckpt = load_latest_checkpoint(tmp_path)
    assert ckpt["step"] == 2 and ckpt["path"] == good and ckpt["extra"] == {"step": 2}
    text = " ".join(str(w.message) for w in record)
    for name in (partial.name, "ckpt-00000004", "ckpt-00000005", "ckpt-00000006"):
        assert name in text
    assert "shorter than the metadata says" in text and "holds step 2" in text

    # resuming from 2, the next save is step 3: the temp directory and the abandoned steps 4-6 go
    save_sharded_checkpoint(tmp_path, step=3, model=model, optimizer=opt, extra={}, keep=2)
    assert visible(tmp_path) == ["ckpt-00000002", "ckpt-00000003"]


def test_keep_the_last_k_of_either_format(tmp_path):
    model = Tiny()
    opt = _optimizer(model, "muon_adamw")
    _step(model, opt, 0)
    for step in range(1, 6):
        save_sharded_checkpoint(tmp_path, step=step, model=model, optimizer=opt, extra={}, keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 5]
    save_checkpoint(tmp_path, step=6, model_state={}, optimizer_state={}, extra={}, keep=2)  # the other format
    assert visible(tmp_path) == ["ckpt-00000005", "ckpt-00000006.pt"]
    save_sharded_checkpoint(tmp_path, step=7, model=model, optimizer=opt, extra={}, keep=1)
    assert visible(tmp_path) == ["ckpt-00000007"]


def test_a_bad_extra_fails_the_save_before_anything_is_written(tmp_path):
    model = Tiny()
    opt = _optimizer(model, "adamw")
    with pytest.raises(TypeError, match=r"\['extra'\]\['fn'\]"):
        save_sharded_checkpoint(tmp_path, step=1, model=model, optimizer=opt, extra={"fn": print})
    with pytest.raises(ValueError, match="keep"):
        save_sharded_checkpoint(tmp_path, step=1, model=model, optimizer=opt, extra={}, keep=0)
    assert visible(tmp_path) == []


def test_a_sharded_checkpoint_loads_into_a_plain_model(tmp_path):
    model = Tiny()
    opt = _optimizer(model, "muon_adamw")
    _step(model, opt, 0)
    path = save_sharded_checkpoint(tmp_path, step=1, model=model, optimizer=opt, extra={})
    plain = Tiny(seed=3)
    load_sharded_weights(path, plain)
    for (name, a), b in zip(model.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    assert read_checkpoint(path)["step"] == 1
    with pytest.raises(ValueError, match="not named like a checkpoint"):
        read_checkpoint(tmp_path)


def test_the_format_knob_is_checked():
    with pytest.raises(ConfigError, match="run.checkpoint_format"):
        config_from_dict({"recipe": "full", "run": {"checkpoint_format": "dcp"}})
    assert config_from_dict({"recipe": "full"}).run.checkpoint_format == "full"


@pytest.mark.slow
def test_a_one_process_cell_resumes_from_sharded_checkpoints_and_exports_its_policy(tmp_path):
    """`run.checkpoint_format: sharded` in one process (DCP without a process group): a run resumed from its
    update-2 checkpoint, past a leftover temp directory, logs the uninterrupted run's metrics; a fresh run refuses
    the directory; `export` writes the checkpoint's weights as a policy directory."""
    from builders import MINIREPO_CELL, metrics_of

    from trainer.__main__ import export_checkpoint
    from trainer.policy.load import load_policy, policy_meta
    from trainer.train import Trainer

    cfg = config_from_dict({**MINIREPO_CELL, "run": {**MINIREPO_CELL["run"], "checkpoint_format": "sharded"}})
    whole = tmp_path / "whole"
    trainer = Trainer(cfg, whole)
    trainer.run(progress=False)
    ckpts = whole / "checkpoints"
    assert visible(ckpts) == ["ckpt-00000002", "ckpt-00000003"]  # keep_checkpoints: 2

    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "ckpt-00000003")
    (resumed / "checkpoints" / ".ckpt-00000003.0badf00d.tmp").mkdir()
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(cfg, resumed).run(progress=False)
    with pytest.warns(UserWarning, match="ignoring partial checkpoint"):
        Trainer(cfg, resumed).run(resume=True, progress=False)
    pd.testing.assert_frame_equal(metrics_of(resumed), metrics_of(whole))
    assert visible(resumed / "checkpoints") == ["ckpt-00000002", "ckpt-00000003"]

    assert export_checkpoint(str(ckpts / "ckpt-00000003"), str(tmp_path / "policy")) == {
        "policy": str(tmp_path / "policy"),
        "update": 3,
    }
    policy, _ = load_policy(tmp_path / "policy", "float32")
    plain = Trainer(cfg, tmp_path / "plain").model
    load_sharded_weights(ckpts / "ckpt-00000003", plain)
    assert list(policy.state_dict()) == list(plain.state_dict())
    for (name, a), b in zip(policy.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(a, b), name
    assert policy_meta(tmp_path / "policy")["trained"] == {"update": 3, "seed": cfg.run.seed}
