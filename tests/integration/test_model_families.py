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

QWEN3 = (Path(__file__).parents[1] / "data" / "templates" / "qwen3.jinja").read_text()
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


def test_a_minicpm_release_loads_its_own_code_only_where_the_study_trusts_it(tmp_path):
    """MiniCPM's dense checkpoints carry their modelling code (`auto_map`): the stand-in carries
    trainer/policy/minicpm/'s, which scales the embeddings, the residual branches and the head's input."""
    ckpt = write_standin_checkpoint("minicpm", tmp_path / "minicpm", TEXTS)
    with pytest.raises(ConfigError, match="minicpm.*model.trust_remote_code: true"):
        load_policy(ckpt)
    model, fmt = load_policy(ckpt, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules.")  # the checkpoint's copy, not the package's
    assert (model.config.scale_emb, model.config.dim_model_base, model.config.scale_depth) == (12.0, 256, 1.4)
    assert fmt.end_of_turn_id == fmt.tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_minicpm_code_is_llama_when_its_scalings_are_one_and_another_function_otherwise():
    """Against transformers' Llama with the same weights: equal (bit for bit) when the three scalings are the
    identity (scale_emb 1, scale_depth sqrt(layers), dim_model_base = hidden), different with MiniCPM's."""
    import math

    import torch
    from transformers import LlamaForCausalLM

    from trainer.policy.minicpm.configuration_minicpm import MiniCPMConfig
    from trainer.policy.minicpm.modeling_minicpm import MiniCPMForCausalLM

    dims = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
    ids = torch.tensor([[3, 9, 27, 17, 5, 44]])
    identity = MiniCPMConfig(scale_emb=1.0, scale_depth=math.sqrt(2), dim_model_base=32, **dims)
    for config, same in (
        (identity, True),
        (MiniCPMConfig(scale_emb=12.0, scale_depth=1.4, dim_model_base=8, **dims), False),
    ):
        torch.manual_seed(0)
        minicpm = MiniCPMForCausalLM(config).eval()
        llama = LlamaForCausalLM(config).eval()
        llama.load_state_dict(minicpm.state_dict())
        with torch.no_grad():
            assert torch.equal(minicpm(input_ids=ids).logits, llama(input_ids=ids).logits) is same


def test_a_vision_language_checkpoint_is_refused_before_its_weights_load(tmp_path):
    from transformers import AutoConfig

    AutoConfig.for_model("qwen3_5").save_pretrained(tmp_path / "vl")  # Qwen3.5 with its vision encoder; no weights
    with pytest.raises(ConfigError, match="vl/config.json: a vision-language checkpoint.*language model alone"):
        load_policy(tmp_path / "vl")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trainer", *args], capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["qwen3", "qwen3.5", "minicpm"])
def test_a_family_checkpoint_trains_a_cpu_cell_exports_and_evaluates(family, tmp_path):
    """The path a paper cell takes with a released checkpoint, at small size: load as configs/paper.yaml says
    (Qwen: the shipped template over Qwen's own; MiniCPM: its own code and template), rollouts, updates, a
    checkpoint, the saved and the exported policy, `eval` on both."""
    if family == "minicpm":
        ckpt = write_standin_checkpoint(family, tmp_path / "ckpt", TEXTS)
        model = {"path": str(ckpt), "trust_remote_code": True}
    else:
        ckpt = write_standin_checkpoint(family, tmp_path / "ckpt", TEXTS, chat_template=QWEN3)
        model = {"path": str(ckpt), "chat_template": "qwen3-stable", "template_options": {"enable_thinking": False}}
    cell = {
        **MINIREPO_CELL,
        "model": model,
        "run": {**MINIREPO_CELL["run"], "updates": 2, "checkpoint_every": 1, "eval_every": 2},
        "rollout": {**MINIREPO_CELL["rollout"], "max_episode_tokens": 320},
    }
    config = tmp_path / "cell.yaml"
    config.write_text(yaml.safe_dump(cell))
    out, policy = tmp_path / "out", tmp_path / "policy"
    r = _cli("train", "--config", str(config), "--out", str(out), "--no-progress", "--save-policy", str(policy))
    assert r.returncode == 0, r.stderr[-3000:]
    assert (policy / "config.json").exists() and (policy / "chat_template.jinja").exists()
    if family == "minicpm":  # the policy carries the code it needs
        assert (policy / "modeling_minicpm.py").exists()
    else:
        assert "<think>" in (policy / "chat_template.jinja").read_text()
    exported = tmp_path / "exported"
    newest = sorted((out / "checkpoints").glob("ckpt-*"))[-1]
    r = _cli("export", str(newest), "--out", str(exported))
    assert r.returncode == 0, r.stderr[-3000:]
    for directory, update in ((policy, 2), (exported, int(newest.stem.split("-")[1]))):
        r = _cli("eval", "--config", str(config), "--policy", str(directory), "--tasks", "2")
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout.strip().splitlines()[-1])["update"] == update
