"""Learning sanity (CleanRL's practice): every advantage estimator, with AdamW and with Muon, learns the recall game
(trainer/environments/recall.py) from a freshly initialised tiny model: training success climbs from at most 30%
to at least 90% in a fixed number of updates.

Bit-identical reruns (tests/integration/test_train.py) cannot see a bug that is deterministic. Checked by breaking the trainer
on purpose (monkeypatching `trainer.rl.estimators`' compute_advantages or `trainer.train`'s pad_episodes; spo and
grpo, AdamW and Muon): negated advantages end at 0% success, the loss mask one token early (the `<act>` marker
trained instead of the action) at 5-7%, every episode given the batch's mean advantage (no per-episode credit) at
7-12%: all four cases of each fail the learning tests. Observations trained too (the episode's advantage on every token) still learn
(97-98%; grpo+AdamW 88%), because the actions do not change the observations here and their gradient cancels
around the baselines; the fast test below catches that one, and the mask one token late or early, directly.

Why n_keys=2: a policy that ignores the first observation and always says one key scores exactly 50%, so 90% needs
the answer to depend on the key, 5 tokens back: the attention and position path of the update is exercised too.

Why a word-level tokenizer: the trainer's tiny tokenizer (byte-level BPE) always holds the 256-byte alphabet, so a
fresh model says a given key with p ~ 0.7%, finds it late and collapses onto the first key it found (see
recall.py). Over the game's 13-token vocabulary each key starts at p ~ 1/13 (start: 6-18% success).

Settings (the same for every case): lr 1e-3 for both optimizers, the project's default; under Muon with
`adjust_lr_fn: match_rms_adamw` (the default) that is the same step size on the hidden matrices as AdamW's, and
AdamW's lr on the rest. 30 updates of 128 episodes (32 tasks x 4 rollouts for the group estimators), on-policy
(`sync`), 2 PPO mini-batches per update, one epoch. Measured over seeds 0-4 (init and run seed): start 0.06-0.18,
end 0.95-1.00 in 49 of 50 runs. The exception, spo++ + AdamW at seed 2 (end 0.85), is a finding, not noise: it
solved the game (1.00) and one update after an all-success batch fell to 0.58, because SPO/SPO++ standardise
r - v(x) over the batch (trainer/rl/spo.py `_standardise`), and when every episode succeeds the spread is only the
baselines' (std ~0.02), which the division blows up to unit-scale advantages of either sign. Over 60 updates it
also hit spo++/AdamW seed 1 (1.00 -> 0.44, not recovered) and spo/Muon seed 1 (1.00 -> 0.16, recovered). At 25
updates gigpo + AdamW (seed 0) is still at 0.82, hence 30. At lr 2e-3 with 64 episodes AdamW collapsed onto one
key (50%) in 6 of 15 runs, Muon in none. A case takes ~8 s of one core, hence `slow`.
"""

from __future__ import annotations

import pytest
import torch
from builders import GAME, word_policy

from trainer.config import config_from_dict
from trainer.environments.recall import RecallConfig
from trainer.logs.parquet_log import read_log
from trainer.rl.config import ESTIMATORS
from trainer.train import Trainer

OPTIMIZERS = ("adam", "muon")
RECIPE = {"spo": "spo_adam", "spo++": "no_penalties", "grpo": "grpo", "gigpo": "gigpo", "graphgpo": "graphgpo"}
"""The project's recipe of each estimator with the shaping penalties off (the recall game has no length to
penalise); `optim.name` is set per case."""
LR, UPDATES, BATCH, GROUP = 1e-3, 30, 128, 4
START_MAX, END_MIN, WINDOW = 0.30, 0.90, 3
"""Mean training success over the first WINDOW updates must be <= START_MAX, over the last WINDOW >= END_MIN."""


def cell(policy_dir, estimator: str, optimizer: str, seed: int = 0) -> dict:
    group = GROUP if estimator in ("grpo", "gigpo", "graphgpo") else 1
    return {
        "recipe": RECIPE[estimator],
        "model": {"path": str(policy_dir)},
        "env": {"name": "recall", "options": GAME, "eval_tasks": GAME["n_heldout_tasks"]},
        "optim": {"name": optimizer, "lr": LR},
        "rl": {"estimator": estimator, "group_size": group},
        "rollout": {"mode": "sync", "batch_size": BATCH, "max_turn_tokens": 1, "max_episode_tokens": 32},
        "run": {
            "updates": UPDATES,
            "seed": seed,
            "minibatches": 2,
            "epochs": 1,
            "eval_every": UPDATES,
            "checkpoint_every": 0,
            "threads": 1,
        },
    }


def test_a_fresh_policy_starts_low_but_not_at_zero_and_only_action_tokens_get_a_gradient(tmp_path):
    """The premises of the learning cases, cheap (one batch, one update), and the mask check they cannot make.

    A fresh policy answers the key now and then (6-18%: every key explored, none found yet). Then one update of
    the trainer: the gradient must reach the logits that predict the two action tokens of each episode and no
    other position. Training observation tokens as well (the mask or the advantages spread over the whole
    sequence) barely slows learning here, since an observation the actions do not change gets advantages that
    cancel around the baselines, so this is where that bug is caught."""
    one_update = cell(word_policy(tmp_path / "policy"), "spo", "adam")
    one_update["run"].update(updates=1, eval_every=0)
    trainer = Trainer(config_from_dict(one_update), tmp_path / "out")
    fmt = trainer.fmt
    assert fmt.vocab_size == 13 and all(len(fmt.encode_text(k)) == 1 for k in RecallConfig(n_keys=2).keys)
    grads = []

    def keep_logit_grads(module, args, kwargs, output):
        if output.logits.requires_grad:  # the update's forward passes, not the no-grad old log-probs
            ids = kwargs["input_ids"]
            output.logits.register_hook(lambda g: grads.append((ids, g.detach().abs().sum(-1))))

    trainer.model.register_forward_hook(keep_logit_grads, with_kwargs=True)
    row = read_log(trainer.run(progress=False))[0].iloc[0]
    assert 0 < row["success_rate"] <= START_MAX and row["n_trajectories"] == BATCH
    # <bos> <obs> key X <act> ACTION <obs> door <act> ACTION: the logits at 4 and 8 predict the actions.
    action_logits = torch.zeros(10, dtype=torch.bool)
    action_logits[[4, 8]] = True
    assert sum(int(ids.shape[0]) for ids, _ in grads) == BATCH  # two mini-batches of 64, no step skipped
    first_minibatch = 0
    for ids, g in grads:
        assert (
            ids.shape[1] == 10
            and (
                ids[:, [0, 1, 2, 4, 6, 7, 8]]
                == torch.tensor(
                    [
                        fmt.bos_id,
                        fmt.obs_id,
                        fmt.encode_text("key")[0],
                        fmt.act_id,
                        fmt.obs_id,
                        fmt.encode_text("door")[0],
                        fmt.act_id,
                    ]
                )
            ).all()
        )
        assert (g[:, ~action_logits] == 0).all(), "a position that predicts no action token got a gradient"
        if first_minibatch < BATCH // 2:  # its PPO ratio is exactly 1 (later steps may clip some tokens)
            assert (g[:, action_logits] > 0).all(), "an action token got no gradient"
            first_minibatch += int(ids.shape[0])


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_every_estimator_learns_recall_from_scratch(tmp_path, estimator, optimizer):
    cfg = config_from_dict(cell(word_policy(tmp_path / "policy"), estimator, optimizer))
    df, _ = read_log(Trainer(cfg, tmp_path / "out").run(progress=False))
    success = df["success_rate"].tolist()
    start, end = sum(success[:WINDOW]) / WINDOW, sum(success[-WINDOW:]) / WINDOW
    curve = " ".join(f"{s:.2f}" for s in success)
    assert len(success) == UPDATES
    assert start <= START_MAX, f"{estimator}/{optimizer} starts too high ({start:.2f}): {curve}"
    assert end >= END_MIN, f"{estimator}/{optimizer} did not learn recall ({end:.2f} at the end): {curve}"
    assert df["eval_success"].iloc[-1] >= END_MIN, f"greedy held-out success {df['eval_success'].iloc[-1]:.2f}"


@pytest.mark.slow
def test_a_tiny_qwen3_5_learns_recall_with_muon_off_its_conv_kernels(tmp_path):
    """Qwen3.5's hybrid decoder (Gated DeltaNet + full attention) end to end on the CPU: rollouts without a cache,
    Muon on its 2-D matrices only (its conv1d kernels on AdamW), and it learns the game as the other models do."""
    from trainer.optim.hybrid import route_parameters

    cfg = config_from_dict(cell(word_policy(tmp_path / "policy", preset="qwen3.5-tiny"), "spo", "muon"))
    trainer = Trainer(cfg, tmp_path / "out")
    muon = [n for n, _ in route_parameters(trainer.model).muon]
    assert any(".linear_attn." in n for n in muon) and not any("conv1d" in n for n in muon)
    df, _ = read_log(trainer.run(progress=False))
    success = df["success_rate"].tolist()
    start, end = sum(success[:WINDOW]) / WINDOW, sum(success[-WINDOW:]) / WINDOW
    curve = " ".join(f"{s:.2f}" for s in success)
    assert start <= START_MAX and end >= END_MIN, f"qwen3.5-tiny on recall: {curve}"
