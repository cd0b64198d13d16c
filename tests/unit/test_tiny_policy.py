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
