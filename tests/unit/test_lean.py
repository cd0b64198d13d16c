"""The lean forward (trainer/policy/lean.py): the same logits as the model's own call, exactly, for whole sequences
(the update's no-grad scoring); its cached steps are checked through the rollout engine (tests/unit/test_hf_engine.py)."""

import copy

import pytest
import torch

from trainer.policy.lean import LeanDecoder, lean_decoder
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rollout.episode import Episode
from trainer.update import pad_episodes, token_logprobs


@pytest.mark.parametrize(
    "preset,dtype",
    [
        ("minicpm-tiny", torch.float32),
        ("qwen-tiny", torch.float32),
        ("qwen2.5-tiny", torch.float32),
        ("qwen-tiny", torch.bfloat16),
    ],
)
def test_whole_sequence_logits_equal_the_model_call_bit_for_bit(preset, dtype):
    model = build_tiny_model(TinyModelSpec(preset, vocab_size=97), seed=2).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():  # away from the initialisation's structure (zero biases, unit norms)
            p.add_(torch.randn_like(p) * 0.02)
    ids = torch.randint(0, 97, (3, 41), generator=torch.Generator().manual_seed(0))
    lean = lean_decoder(model)
    assert lean is not None
    with torch.no_grad():
        assert torch.equal(lean.logits(ids), model(input_ids=ids).logits)
        assert torch.equal(lean.logits(ids[:1, :1]), model(input_ids=ids[:1, :1]).logits)


def test_scoring_without_gradients_takes_the_lean_forward_and_follows_weight_updates():
    """token_logprobs under no_grad: the lean forward's numbers equal the model call's; after an in-place weight
    change (an optimizer step) the stacked weights are rebuilt, so the scores follow the new weights."""
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=97), seed=3)
    reference = copy.deepcopy(model)
    episodes = []
    for n in (17, 9):
        e = Episode(task_id="t")
        e.tokens = torch.randint(1, 97, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        e.loss_mask, e.rollout_logp, e.versions = [0] + [1] * (n - 1), [0.0] * n, [0] * n
        episodes.append(e)
    batch = pad_episodes(episodes, pad_id=0)
    calls = []
    lean = lean_decoder(model)
    real = lean.logits
    lean.logits = lambda ids: (calls.append(ids.shape), real(ids))[1]
    for _ in range(2):
        with torch.no_grad():
            got = token_logprobs(model, batch, 0.7)
            logits = reference(input_ids=batch.input_ids).logits[:, :-1].float() / 0.7
            want = torch.log_softmax(logits, -1).gather(-1, batch.input_ids[:, 1:, None])[..., 0]
        assert torch.equal(got, want)
        with torch.no_grad():  # an optimizer step's in-place write, on both copies
            for p, q in zip(model.parameters(), reference.parameters()):
                delta = torch.randn_like(p) * 0.05
                p.add_(delta)
                q.add_(delta)
    assert len(calls) == 2
    got_grad = token_logprobs(model, batch, 0.7)  # with gradients: the model's own call
    assert got_grad.requires_grad and len(calls) == 2


def test_other_models_are_not_served():
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=97), seed=0)
    eager = copy.deepcopy(model)
    eager.config._attn_implementation = "eager"
    assert LeanDecoder.serves(model) and not LeanDecoder.serves(eager) and lean_decoder(eager) is None
    qwen35 = build_tiny_model(TinyModelSpec("qwen3.5-tiny", vocab_size=97), seed=0)
    assert lean_decoder(qwen35) is None


def test_a_models_decoder_does_not_keep_the_model_alive():
    import gc
    import weakref

    model = build_tiny_model(TinyModelSpec("minicpm-tiny", vocab_size=97), seed=0)
    assert lean_decoder(model) is lean_decoder(model)
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None


def test_a_model_moved_to_another_dtype_after_scoring_is_scored_in_it():
    """`.to()` replaces the parameters' storage without moving their version counters: the stacked weights and
    the rotary table follow it anyway."""
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=97), seed=4).eval()
    ids = torch.randint(0, 97, (2, 23), generator=torch.Generator().manual_seed(1))
    lean = lean_decoder(model)
    with torch.no_grad():
        assert torch.equal(lean.logits(ids), model(input_ids=ids).logits)
        model.to(torch.bfloat16)
        got = lean.logits(ids)
        assert got.dtype == torch.bfloat16 and torch.equal(got, model(input_ids=ids).logits)


@pytest.mark.parametrize("kwargs", [dict(num_key_value_heads=4), dict(attention_bias=True, mlp_bias=True)])
def test_llama_without_grouped_heads_and_with_biases_is_bit_identical(kwargs):
    """Configurations the presets do not cover: as many key/value heads as query heads (no grouping: the decode
    step's packing and `enable_gqa` both off), and biases on every projection (o_proj and the MLP too)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=53,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        **{"num_key_value_heads": 2, **kwargs},
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    ids = torch.randint(0, 53, (2, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(lean_decoder(model).logits(ids), model(input_ids=ids).logits)


def test_what_is_not_served_and_no_gradients_through_the_copies():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    windowed = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=53,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=0,
        )
    )
    windowed.config._attn_implementation = "sdpa"
    assert set(windowed.config.layer_types) == {"sliding_attention"} and not LeanDecoder.serves(windowed)
    on_meta = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=97), seed=0).to("meta")
    assert not LeanDecoder.serves(on_meta)
    model = build_tiny_model(TinyModelSpec("qwen-tiny", vocab_size=97), seed=0)
    with pytest.raises(RuntimeError, match="without gradients"):
        lean_decoder(model).logits(torch.zeros(1, 3, dtype=torch.long))
