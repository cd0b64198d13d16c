"""Checkpoints as users have them: the Qwen3 family's own chat template (refused: not prefix-stable), the shipped
`qwen3-stable` (token-for-token the template's rendering of the real conversation, and Qwen's own rendering of the
newest turn), template options, a checkpoint that needs its own code, and a stand-in checkpoint of each family
through load, a CPU cell, export and eval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from builders import MINIREPO_CELL, TEXTS

from trainer.knobs import ConfigError
from trainer.policy.chat_format import HFChatFormat
from trainer.policy.load import load_policy, save_policy
from trainer.policy.standins import family_tokenizer, write_standin_checkpoint
from trainer.policy.templates import read_chat_template, shipped_templates

QWEN3 = (Path(__file__).parent / "data" / "templates" / "qwen3.jinja").read_text()
STABLE = read_chat_template("qwen3-stable")
TURNS = ["task 3: fix the parser", "ls", "a.py b.py", "cat a.py", "def f(): pass"]


def _render(tok, messages, options, generation_prompt=True):
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **options)


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("options", [{}, {"enable_thinking": False}, {"enable_thinking": True}])
def test_qwen3s_own_template_is_refused_naming_the_key(options):
    with pytest.raises(ValueError, match="model.chat_template.*qwen3-stable"):
        HFChatFormat(family_tokenizer(TEXTS, QWEN3), template_options=options)


@pytest.mark.parametrize("thinking", [True, False])
def test_qwen3_stable_sequences_equal_the_template_and_qwens_newest_turn(thinking):
    """The engine's tokens (prompt, actions, observation deltas) equal the stable template's rendering of the real
    conversation; and the text the model continues from at every turn (the generation prompt, and the newest
    assistant turn) is what Qwen3's own template renders."""
    options = {"enable_thinking": thinking}
    tok = family_tokenizer(TEXTS, STABLE)
    fmt = HFChatFormat(tok, template_options=options)
    assert fmt.end_of_turn_id == tok.convert_tokens_to_ids("<|im_end|>") == tok.eos_token_id
    qwen = family_tokenizer(TEXTS, QWEN3)
    messages = [{"role": "user", "content": TURNS[0]}]
    seq = fmt.prompt_ids(TURNS[0])
    assert seq == _ids(tok, _render(tok, messages, options)) == _ids(qwen, _render(qwen, messages, options))
    for k in (1, 3):
        # thinking on: the model writes its reasoning block; off: the empty block is in the prompt
        action_text = f"<think>\nreason {k}\n</think>\n\n{TURNS[k]}" if thinking else TURNS[k]
        action = [*_ids(tok, action_text), fmt.end_of_turn_id]
        assert fmt.decode_action(action) == action_text
        newest = [*messages, {"role": "assistant", "content": action_text}]
        ours, theirs = _render(tok, newest, options, False), _render(qwen, newest, options, False)
        assert ours[ours.rindex("<|im_start|>") :] == theirs[theirs.rindex("<|im_start|>") :]
        seq += action + fmt.observation_ids(TURNS[k + 1], last_token=action[-1])
        messages = [*newest, {"role": "user", "content": TURNS[k + 1]}]
        assert seq == _ids(tok, _render(tok, messages, options))
    # Qwen's own template rewrites the earlier turn once a user message follows: the reason it is refused
    assert _render(qwen, messages, options) != _render(tok, messages, options)


def test_shipped_templates_and_a_missing_one():
    assert "qwen3-stable" in shipped_templates()
    with pytest.raises(ConfigError, match="model.chat_template: 'nope'.*qwen3-stable"):
        read_chat_template("nope")


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    """A Qwen3 checkpoint as released: the family's config, its tokenizer layout, Qwen's own template."""
    return write_standin_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3") / "ckpt", TEXTS, chat_template=QWEN3)


def test_a_qwen3_checkpoint_loads_with_the_shipped_template_and_a_saved_policy_keeps_it(qwen3_checkpoint, tmp_path):
    with pytest.raises(ConfigError, match="ckpt.*model.chat_template"):
        load_policy(qwen3_checkpoint)
    options = {"enable_thinking": False}
    model, fmt = load_policy(qwen3_checkpoint, chat_template="qwen3-stable", template_options=options)
    assert model.config.model_type == "qwen3" and fmt.template_options == options
    assert fmt.prompt_ids("fix it")[-len(_ids(fmt.tokenizer, "<think>\n\n</think>\n\n")) :] == _ids(
        fmt.tokenizer, "<think>\n\n</think>\n\n"
    )
    save_policy(model, fmt, tmp_path / "policy")
    again, again_fmt = load_policy(tmp_path / "policy")  # the template and its options travel with the policy
    assert again_fmt.prompt_ids("fix it") == fmt.prompt_ids("fix it")
    assert json.loads((tmp_path / "policy" / "harness_policy.json").read_text())["template_options"] == options


CUSTOM_CONFIG = """
from transformers import LlamaConfig


class StandinConfig(LlamaConfig):
    model_type = "standin_custom"

    def __init__(self, scale_emb=12.0, **kwargs):
        self.scale_emb = scale_emb
        super().__init__(**kwargs)
"""
CUSTOM_MODEL = """
from transformers import LlamaForCausalLM

from .configuration_standin import StandinConfig


class StandinForCausalLM(LlamaForCausalLM):
    config_class = StandinConfig
"""


def test_a_checkpoint_with_its_own_code_loads_only_where_the_study_trusts_it(tmp_path):
    """MiniCPM's dense checkpoints carry their modelling code (`auto_map`); a stand-in with code of its own."""
    from trainer.policy.tiny import TINY_PRESETS

    directory = tmp_path / "custom"
    directory.mkdir()
    (directory / "configuration_standin.py").write_text(CUSTOM_CONFIG)
    (directory / "modeling_standin.py").write_text(CUSTOM_MODEL)
    tok = family_tokenizer(TEXTS, STABLE)
    dims = {k: v for k, v in TINY_PRESETS["minicpm-tiny"].items() if k != "model_type"}
    config = {
        "model_type": "standin_custom",
        "architectures": ["StandinForCausalLM"],
        "auto_map": {
            "AutoConfig": "configuration_standin.StandinConfig",
            "AutoModelForCausalLM": "modeling_standin.StandinForCausalLM",
        },
        "vocab_size": len(tok),
        **dims,
    }
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), **dims)).save_pretrained(directory)  # the weights' layout
    (directory / "config.json").write_text(json.dumps(config))
    tok.save_pretrained(directory)
    with pytest.raises(ConfigError, match="custom.*model.trust_remote_code: true"):
        load_policy(directory)
    model, fmt = load_policy(directory, trust_remote_code=True)
    assert type(model).__name__ == "StandinForCausalLM" and model.config.scale_emb == 12.0
    assert fmt.prompt_ids("fix it")


def test_a_vision_language_checkpoint_is_refused_before_its_weights_load(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("qwen3_5").save_pretrained(tmp_path / "vl")  # Qwen3.5 with its vision encoder; no weights
    with pytest.raises(ConfigError, match="vl/config.json: a vision-language checkpoint.*language model alone"):
        load_policy(tmp_path / "vl")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3.5"])
def test_a_family_checkpoint_trains_a_cpu_cell_exports_and_evaluates(family, tmp_path):
    """The path a paper cell takes with a released checkpoint, at small size: load with the study's template,
    rollouts, updates, a checkpoint, the exported policy, `eval` on it."""
    ckpt = write_standin_checkpoint(family, tmp_path / "ckpt", TEXTS, chat_template=QWEN3)
    cell = {
        **MINIREPO_CELL,
        "model": {"path": str(ckpt), "chat_template": "qwen3-stable", "template_options": {"enable_thinking": False}},
        "run": {**MINIREPO_CELL["run"], "updates": 2, "checkpoint_every": 1, "eval_every": 2},
        "rollout": {**MINIREPO_CELL["rollout"], "max_episode_tokens": 320},
    }
    config = tmp_path / "cell.yaml"
    config.write_text(yaml.safe_dump(cell))
    out, policy = tmp_path / "out", tmp_path / "policy"
    r = _cli("train", "--config", str(config), "--out", str(out), "--no-progress", "--save-policy", str(policy))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (policy / "config.json").exists() and (policy / "chat_template.jinja").exists()
    assert "<think>" in (policy / "chat_template.jinja").read_text()
    exported = tmp_path / "exported"
    newest = sorted((out / "checkpoints").glob("ckpt-*"))[-1]
    r = _cli("export", str(newest), "--out", str(exported))
    assert r.returncode == 0, r.stderr[-3000:]
    for directory, update in ((policy, 2), (exported, int(newest.stem.split("-")[1]))):
        r = _cli("eval", "--config", str(config), "--policy", str(directory), "--tasks", "2")
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1])["update"] == update
