"""The supervised warm start's guard: demonstrations that cannot fit the token budget are a named error."""
import pytest
import yaml

from trainer.config import load_sft_config
from trainer.policy.sft import warm_start


def test_no_demonstration_fits_the_episode_budget_names_the_key(tmp_path):
    config = {"model": {"preset": "qwen2.5-tiny"},
              "env": {"name": "textgame", "options": {"n_receptacles": 2, "n_objects": 1, "n_distractors": 0,
                                                      "max_steps": 3, "n_train_tasks": 20, "n_heldout_tasks": 4,
                                                      "task_types": ["pick_and_place"]}},
              "rollout": {"max_episode_tokens": 16}, "n_demos": 4, "vocab_size": 300, "max_steps": 1}
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ValueError, match="rollout.max_episode_tokens=16"):
        warm_start(load_sft_config(path), tmp_path / "policy", progress=False)
    assert not (tmp_path / "policy").exists()
