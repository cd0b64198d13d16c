"""The supervised warm start's guard: demonstrations that cannot fit the token budget are a named error."""

import pytest
import yaml

from trainer.config import load_warm_start_config
from trainer.warm_start import warm_start


def test_no_demonstration_fits_the_episode_budget_names_the_key(tmp_path):
    config = {
        "model": {"preset": "qwen2.5-tiny"},
        "env": {
            "name": "textgame",
            "options": {
                "n_receptacles": 2,
                "n_objects": 1,
                "n_distractors": 0,
                "max_steps": 3,
                "n_train_tasks": 20,
                "n_heldout_tasks": 4,
                "task_types": ["pick_and_place"],
            },
        },
        "rollout": {"max_episode_tokens": 16},
        "n_demos": 4,
        "vocab_size": 300,
        "max_steps": 1,
    }
    path = tmp_path / "warm_start.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="rollout.max_episode_tokens=16"):
        warm_start(load_warm_start_config(path), tmp_path / "policy", progress=False)
    assert not (tmp_path / "policy").exists()


def test_cloning_loss_per_demonstration_equals_the_padded_batch():
    """The warm start back-propagates one demonstration at a time; the gradient must be the padded batch's
    (computed here directly with the attention mask, as a reference)."""
    import copy
    import random

    import torch

    from trainer.policy.tiny import TinyModelSpec, build_tiny_model
    from trainer.rollout.episode import Episode
    from trainer.update import pad_episodes, token_logprobs
    from trainer.warm_start import cloning_loss_backward

    rng = random.Random(0)
    demos = []
    for i in range(5):
        e = Episode(task_id=f"t{i}")
        e.append([rng.randrange(1, 40) for _ in range(rng.randint(3, 9))], policy=False)
        e.append([rng.randrange(1, 40) for _ in range(rng.randint(1, 6))], policy=True, logps=None, version=0, turn=0)
        e.append([rng.randrange(1, 40) for _ in range(rng.randint(1, 5))], policy=False)
        demos.append(e)
    torch.manual_seed(0)
    model = build_tiny_model(TinyModelSpec("qwen-tiny", 40))
    reference = copy.deepcopy(model)
    batch = pad_episodes(demos, 0)
    weights = batch.loss_mask + 0.5 * (batch.attention_mask[:, 1:].float() - batch.loss_mask)
    ref_loss = -(token_logprobs(reference, batch) * weights).sum() / weights.sum()
    ref_loss.backward()
    loss = cloning_loss_backward(model, demos, 0, 0.5)
    assert abs(float(loss) - float(ref_loss.detach())) < 1e-5
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6, rtol=1e-4)


def test_demonstrations_come_from_outside_the_rl_pool_and_the_offline_pass_covers_the_pool(tmp_path, monkeypatch):
    """`env.train_tasks` splits the training tasks: the cells' pool (the first N), which the offline pass plays
    `offline_samples` times each, and the rest, which the demonstrations come from."""
    import json

    import trainer.warm_start as warm_start_module
    from trainer.environments.suite import make_suite

    seen = []
    real = make_suite

    def spy(env_cfg):
        suite = real(env_cfg)
        demonstrate = suite.demonstrate
        suite.demonstrate = lambda task, noise, rng: (seen.append(task.task_id), demonstrate(task, noise, rng))[1]
        return suite

    monkeypatch.setattr(warm_start_module, "make_suite", spy)
    import trainer.optim.build as builder

    built = []  # the warm start's Muon runs Newton-Schulz in fp32 on the CPU (optim.ns_dtype's "auto")
    real_build = builder.build_muon_adamw
    monkeypatch.setattr(builder, "build_muon_adamw", lambda *a, **kw: (built.append(kw), real_build(*a, **kw))[1])
    config = {
        "model": {"preset": "qwen-tiny"},
        "env": {
            "name": "minirepo",
            "train_tasks": 12,
            "options": {
                "max_depth": 0,
                "bug_kinds": ["op"],
                "expert": "search",
                "n_train": 40,
                "n_heldout": 8,
                "max_turns": 6,
            },
            "eval_tasks": 2,
        },
        "rollout": {"max_turn_tokens": 8, "max_episode_tokens": 512},
        "n_demos": 30,
        "vocab_size": 300,
        "max_steps": 2,
        "eval_every": 2,
        "eval_tasks": 4,
        "band": [0.0, 1.0],
        "offline_samples": 2,
    }
    path = tmp_path / "warm_start.yaml"
    path.write_text(yaml.safe_dump(config))
    report = warm_start(load_warm_start_config(path), tmp_path / "policy", progress=False)
    pool = [t.task_id for t in real(load_warm_start_config(path).env).tasks.tasks("train", 12)]
    assert seen and not set(seen) & set(pool) and report["pool_tasks"] == 12 and report["demo_tasks"] == 28
    stats = json.loads((tmp_path / "policy" / "offline_stats.json").read_text())
    assert sorted(stats) == sorted(pool) and all(n == 2 and 0 <= s <= 2 for n, s in stats.values())
    assert 0 <= report["offline_success"] <= 1
    assert [kw["ns_dtype"] for kw in built] == ["float32"]
