"""A saved tiny policy is a Hugging Face model as any checkpoint is: transformers loads its tokenizer with the model's
vocabulary and the harness's own special tokens, its chat template renders a conversation to the ids TinyFormat
builds, and generate() stops on `<eot>`. (vLLM's side: tests/integration/test_vllm_real.py.)"""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.policy.load import load_policy, new_tiny_policy, save_policy

TEXTS = [f"view file_{i}.py line {i}; run the tests; {i} passed" for i in range(60)]


def test_a_saved_tiny_policy_loads_in_transformers_with_its_template_and_stop_token(tmp_path):
    for preset in ("qwen-tiny", "minicpm-tiny"):
        model, fmt = new_tiny_policy(preset, TEXTS, vocab_size=300)
        path = tmp_path / preset
        save_policy(model, fmt, path)
        tokenizer = AutoTokenizer.from_pretrained(path)
        assert len(tokenizer) == model.config.vocab_size == fmt.vocab_size  # nothing added beyond the embedding
        assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (
            fmt.bos_id,
            fmt.eot_id,
            fmt.pad_id,
        )
        messages = [
            {"role": "user", "content": TEXTS[0]},
            {"role": "assistant", "content": TEXTS[1]},
            {"role": "tool", "content": TEXTS[2]},
        ]
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
        want = fmt.prompt_ids(TEXTS[0]) + fmt.action_ids(TEXTS[1]) + fmt.observation_ids(TEXTS[2])
        assert list(rendered["input_ids"]) == want
        hf = AutoModelForCausalLM.from_pretrained(path)
        assert hf.generation_config.eos_token_id == fmt.eot_id

        def eot_first(hidden, vocab=model.config.vocab_size, eot=fmt.eot_id):  # generate() must stop right after
            logits = torch.zeros(*hidden.shape[:-1], vocab)  # a head that always prefers <eot>
            logits[..., eot] = 1.0
            return logits

        hf.lm_head.forward = eot_first
        with torch.no_grad():
            out = hf.generate(torch.tensor([want]), max_new_tokens=8, do_sample=False)
        assert out[0, len(want) :].tolist() == [fmt.eot_id]
        # the harness reads it back as it was
        again, fmt_again = load_policy(path)
        assert fmt_again.tokenizer.to_str() == fmt.tokenizer.to_str()
        assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), model.state_dict().values()))


def test_a_loaded_tiny_policy_trains_its_pad_row_as_a_fresh_one_does(tmp_path):
    """The pad id in a saved policy's config is for generate() and vLLM; from_pretrained also makes it the embedding's
    padding_idx, whose gradient torch zeroes. The harness's policy trains as one built fresh (no padding_idx): the
    same gradient on every row, the pad row's included, whether or not the config names a pad id."""
    for preset in ("qwen-tiny", "minicpm-tiny"):
        model, fmt = new_tiny_policy(preset, TEXTS, vocab_size=300)
        save_policy(model, fmt, tmp_path / preset)
        loaded, _ = load_policy(tmp_path / preset)
        assert loaded.config.pad_token_id == fmt.pad_id  # still there for the engines
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / preset)
        assert hf.get_input_embeddings().padding_idx == fmt.pad_id  # what from_pretrained alone would train with
        ids = torch.tensor([fmt.prompt_ids(TEXTS[3]) + [fmt.pad_id] * 3 + fmt.action_ids(TEXTS[4])])
        grads = []
        for m in (model, loaded, hf):
            m.zero_grad()
            m(input_ids=ids).logits.logsumexp(-1).sum().backward()
            grads.append(m.get_input_embeddings().weight.grad.clone())
        fresh, harness, plain = grads
        assert torch.equal(harness, fresh)
        assert fresh[fmt.pad_id].abs().sum() > 0 and not torch.equal(plain[fmt.pad_id], fresh[fmt.pad_id])
