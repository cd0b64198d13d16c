"""The policy update: padding, old log-probs, micro-batching that changes nothing but memory."""

import copy
import math
import random

import pytest
import torch

from trainer.optim.hybrid import build_muon_adamw, route_parameters
from trainer.policy.lean import lean_decoder
from trainer.policy.tiny import TinyModelSpec, build_tiny_model
from trainer.rl.config import LossConfig
from trainer.rl.loss import AGGREGATIONS, policy_loss
from trainer.rollout.episode import Episode
from trainer.update import (
    ForwardSettings,
    gradient_snr,
    micro_batches,
    pad_episodes,
    policy_update,
    score_sequences,
    slice_batch,
    token_logprobs,
)

VOCAB = 40


def _episodes(n=5, seed=0):
    rng = random.Random(seed)
    eps = []
    for i in range(n):
        e = Episode(task_id=f"t{i}")
        e.append([rng.randrange(VOCAB) for _ in range(rng.randint(3, 8))], policy=False)
        for turn in range(rng.randint(1, 3)):
            k = rng.randint(1, 5)
            e.append(
                [rng.randrange(VOCAB) for _ in range(k)],
                policy=True,
                logps=[-rng.random() * 3 for _ in range(k)],
                version=0,
                turn=turn,
            )
            e.append([rng.randrange(VOCAB) for _ in range(rng.randint(1, 4))], policy=False)
        eps.append(e)
    return eps


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_tiny_model(TinyModelSpec("minicpm-tiny", VOCAB))


def test_padding_and_alignment():
    eps = _episodes()
    b = pad_episodes(eps, pad_id=0)
    for i, e in enumerate(eps):
        assert b.input_ids[i, : e.length].tolist() == e.tokens
        assert b.loss_mask[i, : e.length - 1].tolist() == e.loss_mask[1:]
        assert b.loss_mask[i, e.length - 1 :].sum() == 0


def test_token_logprobs_match_a_single_sequence_forward(model):
    eps = _episodes()
    b = pad_episodes(eps, pad_id=0)
    with torch.no_grad():
        lp = token_logprobs(model, b)
        for i, e in enumerate(eps):
            ids = torch.tensor([e.tokens])
            ref = (
                torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                .gather(-1, ids[0, 1:].unsqueeze(-1))
                .squeeze(-1)
            )
            assert torch.allclose(lp[i, : e.length - 1], ref, atol=1e-5)


def test_micro_batches_respect_the_budget():
    b = pad_episodes(_episodes(8), pad_id=0)
    lengths = b.attention_mask.sum(1).tolist()
    groups = micro_batches(b, list(range(8)), token_budget=40)
    assert sorted(r for g in groups for r in g) == list(range(8))
    for g in groups:
        assert len(g) == 1 or max(lengths[r] for r in g) * len(g) <= 40


@pytest.mark.parametrize("agg", AGGREGATIONS)
def test_micro_batching_gives_the_full_batch_gradient(model, agg):
    """Gradient accumulated over small micro-batches == gradient of one full-batch loss (the reference), also with
    an episode without a policy token in the batch (the seq-mean modes do not count it)."""
    eps = _episodes(6, seed=1)
    empty = Episode(task_id="empty")
    empty.append([3, 4, 5], policy=False)
    eps.insert(2, empty)
    b = pad_episodes(eps, pad_id=0)
    assert b.loss_mask[2].sum() == 0
    adv = torch.randn(b.loss_mask.shape, generator=torch.Generator().manual_seed(2)) * b.loss_mask
    cfg = LossConfig(agg=agg, tis_cap=2.0)

    m_ref = copy.deepcopy(model)
    with torch.no_grad():
        old = token_logprobs(m_ref, b)
    loss, _ = policy_loss(
        token_logprobs(m_ref, b), old, b.rollout_logp, adv, b.loss_mask, LossConfig(tis_cap=2.0, agg=agg)
    )
    loss.backward()
    ref_grads = [p.grad.clone() for p in m_ref.parameters()]

    m = copy.deepcopy(model)
    captured = {}

    class Capture(torch.optim.SGD):
        def step(self, closure=None):
            captured["grads"] = [p.grad.clone() for p in m.parameters()]

    out = policy_update(m, Capture(m.parameters(), lr=0.0), b, adv, cfg, micro_batch_tokens=12, grad_clip=None)
    assert abs(out["loss"] - float(loss.detach())) < 1e-5
    for g, r in zip(captured["grads"], ref_grads):
        assert torch.allclose(g, r, atol=1e-6, rtol=1e-4)


def test_update_moves_the_policy_towards_positive_advantages(model):
    m = copy.deepcopy(model)
    eps = _episodes(6, seed=3)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.where(torch.arange(6).unsqueeze(1) < 3, 1.0, -1.0).expand_as(b.loss_mask) * b.loss_mask
    opt = build_muon_adamw(m, matrix_lr=0.01, lr=1e-3)
    with torch.no_grad():
        before = token_logprobs(m, b)
    names = [n for n, _ in route_parameters(m).muon]
    params = dict(m.named_parameters())
    out = policy_update(m, opt, b, adv, LossConfig(), minibatches=2, stat_matrices=[params[n] for n in names])
    with torch.no_grad():
        after = token_logprobs(m, b)
    gain = ((after - before) * b.loss_mask).sum(1)
    assert gain[:3].sum() > 0 > gain[3:].sum()
    assert out["update_rms"] > 0 and out["update_spectral_norm"] > 0 and out["skipped_steps"] == 0
    # first mini-batch: ratio == 1 exactly, so nothing is clipped there; TIS weights were applied
    assert 0 < out["tis_weight_mean"] <= 2.0


def test_slice_batch_trims_to_its_rows():
    b = pad_episodes(_episodes(4), pad_id=0)
    longest = int(b.attention_mask[[1, 2]].sum(1).max())
    s = slice_batch(b, [1, 2])
    assert s.input_ids.shape == (2, longest) and s.loss_mask.shape == (2, longest - 1)


def test_one_minibatch_reuses_the_forward_pass_as_old_logprobs(model):
    """With one minibatch the old log-probs come from the update's own forward pass; they must equal a separate
    no-grad pass on the pre-update weights (what two minibatches compute), and the ratio is then exactly 1."""
    eps = _episodes(6, seed=4)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.randn(b.loss_mask.shape, generator=torch.Generator().manual_seed(5)) * b.loss_mask
    m = copy.deepcopy(model)
    with torch.no_grad():
        reference = token_logprobs(m, b)
    out = policy_update(
        m,
        torch.optim.SGD(m.parameters(), lr=0.1),
        b,
        adv,
        LossConfig(tis_cap=None),
        micro_batch_tokens=20,
        return_old_logp=True,
    )
    for row, got in enumerate(out["old_logp_rows"]):
        assert torch.allclose(torch.tensor(got), reference[row, : len(got)], atol=1e-6)
    assert out["approx_kl"] == 0.0 and out["clip_frac_low"] == 0.0 and out["clip_frac_high"] == 0.0


def test_gradient_snr_by_hand():
    # parts (1, 0), (3, 0): mean (2, 0), |mean|^2 = 4; noise s^2 = (1 + 1) / (2 - 1) = 2; signal 4 - 2/2 = 3 -> 1.5
    assert gradient_snr([torch.tensor([1.0, 0.0]), torch.tensor([3.0, 0.0])]) == pytest.approx(1.5)
    # parts 0, 1, 2 (1-D): mean 1, s^2 = (1 + 0 + 1) / 2 = 1, signal 1 - 1/3 = 2/3
    assert gradient_snr([torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([2.0])]) == pytest.approx(2 / 3)
    # orthogonal parts of equal norm, (1, 0) and (0, 1): |mean|^2 = 0.5 is all noise: s^2 = 1, signal 0.5 - 0.5 = 0
    assert gradient_snr([torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]) == pytest.approx(0.0)
    assert gradient_snr([torch.tensor([1.0, 2.0])] * 2) == float("inf")
    assert math.isnan(gradient_snr([torch.zeros(3)] * 3))  # all advantages 0: no gradient, nothing to measure
    assert math.isnan(gradient_snr([torch.tensor([1.0])]))  # one part: no variance to estimate


def test_gradient_snr_of_noisy_estimates_recovers_the_true_ratio():
    """K noisy estimates g_k = mu + noise of known size: the estimate's mean over many draws is ||mu||^2 / (d s^2)."""
    gen = torch.Generator().manual_seed(0)
    d, k, sigma = 400, 8, 0.5
    mu = torch.full((d,), 0.05)  # ||mu||^2 = 400 * 0.0025 = 1; noise E||g - mu||^2 = d sigma^2 = 100 -> SNR 0.01
    draws = [gradient_snr([mu + sigma * torch.randn(d, generator=gen) for _ in range(k)]) for _ in range(400)]
    assert sum(draws) / len(draws) == pytest.approx(0.01, abs=0.004)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_grad_parts_keep_the_step_and_measure_the_parts_gradients(model, agg):
    """Back-propagating the parts one by one sums to the same gradient; grad_snr equals gradient_snr of each part's
    own loss gradient (an independent reference: one policy_loss per part, hidden matrices only)."""
    eps = _episodes(6, seed=6)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.randn(b.loss_mask.shape, generator=torch.Generator().manual_seed(7)) * b.loss_mask
    cfg = LossConfig(agg=agg, tis_cap=None)
    parts = [[0, 3], [1, 4, 5], [2]]
    names = [n for n, _ in route_parameters(model).muon]

    refs = []
    for part in parts:
        m_ref = copy.deepcopy(model)
        sub = slice_batch(b, part)
        with torch.no_grad():
            old = token_logprobs(m_ref, sub)
        loss, _ = policy_loss(
            token_logprobs(m_ref, sub),
            old,
            None,
            adv[part, : sub.width],
            sub.loss_mask,
            LossConfig(agg=agg, tis_cap=None),
        )
        loss.backward()
        params = dict(m_ref.named_parameters())
        refs.append(torch.cat([params[n].grad.flatten() for n in names]))

    captured = {}

    def run(grad_parts):
        m = copy.deepcopy(model)
        params = dict(m.named_parameters())

        class Capture(torch.optim.SGD):
            def step(self, closure=None):
                captured[grad_parts is None] = [p.grad.clone() for p in m.parameters()]

        return policy_update(
            m,
            Capture(m.parameters(), lr=0.0),
            b,
            adv,
            cfg,
            grad_clip=None,
            stat_matrices=[params[n] for n in names],
            grad_parts=grad_parts,
        )

    out = run(parts)
    assert out["grad_snr"] == pytest.approx(gradient_snr(refs), rel=1e-3)
    assert "grad_snr" not in run(None)
    for g, r in zip(captured[False], captured[True]):
        assert torch.allclose(g, r, atol=1e-6, rtol=1e-4)


def test_bf16_weights_round_an_rl_learning_rate_step_away_fp32_master_weights_keep_it():
    """Why the paper-scale configs keep float32 weights (model.dtype) and compute in bf16 (run.compute_dtype):
    Adam's first step moves each weight by about lr, and at lr 1e-6 that is under half a bf16 step of a weight of
    typical size (8 significant bits: half a step is 2^-9 to 2^-8 of the weight, 2e-5 or more at 0.01), so on bf16
    weights it rounds away (measured: 100% of fp32 weights moved, 1.9% of bf16 ones)."""
    torch.manual_seed(0)
    master = build_tiny_model(TinyModelSpec("minicpm-tiny", VOCAB))
    eps = _episodes(6, seed=3)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.where(torch.arange(6).unsqueeze(1) < 3, 1.0, -1.0).expand_as(b.loss_mask) * b.loss_mask
    moved = {}
    for dtype in (torch.float32, torch.bfloat16):
        m = copy.deepcopy(master).to(dtype)
        before = [p.detach().clone() for p in m.parameters()]
        policy_update(
            m,
            torch.optim.AdamW(m.parameters(), lr=1e-6, weight_decay=0.0),
            b,
            adv,
            LossConfig(),
            forward=ForwardSettings(autocast_dtype=torch.bfloat16),
        )
        changed = sum(int((p.detach() != q).sum()) for p, q in zip(m.parameters(), before))
        moved[dtype] = changed / sum(q.numel() for q in before)
    assert moved[torch.float32] > 0.9  # every weight with a gradient moves
    assert moved[torch.bfloat16] < 0.05  # only weights near zero (|w| < ~3e-4) move


@pytest.mark.parametrize("skip_first", [False, True])
def test_the_first_step_of_several_gives_its_rows_old_logprobs_exactly(model, skip_first):
    """With 4 minibatches the first step that runs scores its rows' old log-probs in its own forward passes (no
    separate pass for them): with one-episode micro-batches they are bit for bit a separate no-grad pass on the
    pre-update weights, row by row, also when the first minibatch has no signal and is skipped (the next one then
    fills them), and the update takes the same steps as with the separate pass."""
    eps = _episodes(8, seed=11)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.randn(b.loss_mask.shape, generator=torch.Generator().manual_seed(12)) * b.loss_mask
    if skip_first:
        adv[0::4] = 0.0  # minibatch 0 holds rows 0 and 4
    m = copy.deepcopy(model)
    with torch.no_grad():
        reference = [token_logprobs(m, slice_batch(b, [r]))[0] for r in range(8)]
    passes = []
    hook = m.register_forward_pre_hook(lambda *_: passes.append(torch.is_grad_enabled()))
    lean = lean_decoder(m)  # no-grad scoring takes the lean forward (the same logits), not the model's call
    real_logits = lean.logits
    lean.logits = lambda ids: (passes.append(torch.is_grad_enabled()), real_logits(ids))[1]
    out = policy_update(
        m,
        torch.optim.AdamW(m.parameters(), lr=1e-2),
        b,
        adv,
        LossConfig(),
        minibatches=4,
        micro_batch_tokens=1,
        return_old_logp=True,
        skip_no_signal=True,
    )
    hook.remove()
    assert out["steps"] == (3 if skip_first else 4) and out["skipped_steps"] == (1 if skip_first else 0)
    # the no-grad pass scored the 6 rows outside the first step that ran; each step ran one pass per row
    assert passes.count(False) == 6 and passes.count(True) == 2 * out["steps"]
    for row, got in enumerate(out["old_logp_rows"]):
        assert torch.equal(torch.tensor(got), reference[row][: len(got)]), row
    assert out["approx_kl"] != 0.0  # later steps are measured against the pre-update log-probs, not their own


def test_score_sequences_scores_each_sequence_on_its_own():
    """One no-grad pass per sequence: row r is exactly `token_logprobs` on that sequence alone (whatever else is
    scored with it), and equals one padded pass with an attention mask over all of them up to rounding."""
    torch.manual_seed(3)
    m = build_tiny_model(TinyModelSpec("qwen-tiny", VOCAB))
    eps = _episodes(6, seed=13)
    sequences = [(e.tokens, e.loss_mask) for e in eps]
    got = score_sequences(m, sequences, pad_id=0)
    alone = score_sequences(m, sequences[2:3], pad_id=0)
    b = pad_episodes(eps, pad_id=0)
    with torch.no_grad():
        padded = torch.log_softmax(m(input_ids=b.input_ids, attention_mask=b.attention_mask).logits[:, :-1], -1)
        padded = padded.gather(-1, b.input_ids[:, 1:, None])[..., 0]
        for r, e in enumerate(eps):
            n = e.length - 1
            assert torch.equal(got[r, :n], token_logprobs(m, slice_batch(b, [r]))[0, :n])
            assert torch.allclose(got[r, :n], padded[r, :n], atol=1e-5)
    assert torch.equal(alone[0, : eps[2].length - 1], got[2, : eps[2].length - 1])


def test_epochs_and_minibatches_take_that_many_steps_and_the_clip_binds(model):
    """PPO as verl runs it: epochs x minibatches optimizer steps, all against the pre-update log-probs, so after
    the first step the ratio leaves 1 and, at a large enough step, tokens are clipped (they never are with one)."""
    eps = _episodes(8, seed=6)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.where(torch.arange(8).unsqueeze(1) % 2 == 0, 1.0, -1.0).expand_as(b.loss_mask) * b.loss_mask
    calls = []

    def run(minibatches, epochs):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-2)
        original = opt.step
        opt.step = lambda *a, **k: (calls.append(1), original(*a, **k))[1]
        calls.clear()
        out = policy_update(m, opt, b, adv, LossConfig(), minibatches=minibatches, epochs=epochs)
        return out, len(calls)

    out, steps = run(1, 1)
    assert steps == out["steps"] == 1 and out["approx_kl"] == 0 and out["clip_frac_low"] == out["clip_frac_high"] == 0
    out, steps = run(4, 2)
    assert steps == out["steps"] == 8 and out["skipped_steps"] == 0
    assert out["approx_kl"] != 0 and out["clip_frac_low"] + out["clip_frac_high"] > 0


def test_a_minibatch_without_signal_skips_its_step(model):
    """All-zero advantages: a zero gradient, yet Adam's momentum from an earlier step would still move the
    weights; `skip_no_signal` skips the step (counted), and the statistics of a fully skipped update are None."""
    eps = _episodes(4, seed=7)
    b = pad_episodes(eps, pad_id=0)
    signal = torch.ones_like(b.loss_mask) * b.loss_mask
    m = copy.deepcopy(model)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    policy_update(m, opt, b, signal, LossConfig())  # momentum from a real step
    before = [p.detach().clone() for p in m.parameters()]
    zero = torch.zeros_like(b.loss_mask)
    out = policy_update(m, opt, b, zero, LossConfig(), minibatches=2, skip_no_signal=True)
    assert out["steps"] == 0 and out["skipped_steps"] == 2 and out["no_signal_steps"] == 2
    assert out["loss"] is None and out["grad_norm"] is None and out["update_rms"] is None
    assert all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    out = policy_update(m, opt, b, zero, LossConfig(), minibatches=2, skip_no_signal=False)
    assert (
        out["steps"] == 2
        and out["no_signal_steps"] == 2
        and not all(torch.equal(p, q) for p, q in zip(m.parameters(), before))
    )
    # only the half without signal is skipped
    half = torch.where(torch.arange(4).unsqueeze(1) % 2 == 0, 1.0, 0.0).expand_as(b.loss_mask) * b.loss_mask
    out = policy_update(m, opt, b, half, LossConfig(), minibatches=2, skip_no_signal=True)
    assert out["steps"] == 1 and out["skipped_steps"] == 1 and out["no_signal_steps"] == 1
    out = policy_update(m, opt, b, half, LossConfig(), minibatches=2, skip_no_signal=False)
    assert out["steps"] == 2 and out["skipped_steps"] == 0 and out["no_signal_steps"] == 1


def test_a_chunked_head_and_checkpointing_give_the_same_logprobs_and_gradients():
    """`run.logprob_chunk_tokens` and `run.activation_checkpointing` change memory, not results (up to rounding):
    log-probs, entropy and the gradient of their sum equal the whole-batch path's to 1e-6."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.distributed import enable_activation_checkpointing
    from trainer.update import ForwardSettings, token_logprobs

    config = AutoConfig.for_model(
        "qwen3",
        vocab_size=61,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    lean = copy.deepcopy(model)
    enable_activation_checkpointing(lean)
    lean.train()
    model.train()
    episodes = []
    for n in (13, 7, 10):
        e = Episode(task_id="t")
        e.tokens = torch.randint(1, 61, (n,)).tolist()
        e.loss_mask, e.rollout_logp, e.versions = [0] + [1] * (n - 1), [0.0] * n, [0] * n
        episodes.append(e)
    batch = pad_episodes(episodes, pad_id=0)
    want, want_entropy = token_logprobs(model, batch, 0.9, with_entropy=True)
    got, got_entropy = token_logprobs(lean, batch, 0.9, with_entropy=True, forward=ForwardSettings(chunk_tokens=4))
    assert torch.allclose(got, want, atol=1e-6) and torch.allclose(got_entropy, want_entropy, atol=1e-6)
    (want * batch.loss_mask).sum().backward()
    (got * batch.loss_mask).sum().backward()
    # the chunks sum the head's gradient over positions in another order: rounding on the scale of the whole tensor
    # (2 ulps of a 4.2-sized gradient on an AVX2 CPU), not of each element
    for (name, a), b in zip(model.named_parameters(), lean.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-6 * float(b.grad.abs().max())), name


def test_update_diagnostics_are_the_rms_and_top_singular_value_of_the_applied_update(model):
    """One optimizer step: update_rms is the RMS of (after - before) over every hidden matrix together, and
    update_spectral_norm the largest top singular value among them (an SVD here; the logged value is a power
    iteration, a lower bound within a few percent)."""
    m = copy.deepcopy(model)
    eps = _episodes(4, seed=5)
    b = pad_episodes(eps, pad_id=0)
    adv = torch.where(torch.arange(4).unsqueeze(1) < 2, 1.0, -1.0).expand_as(b.loss_mask) * b.loss_mask
    opt = build_muon_adamw(m, matrix_lr=0.01, lr=1e-3)
    params = dict(m.named_parameters())
    hidden = [params[n] for n, _ in route_parameters(m).muon]
    assert len({tuple(p.shape) for p in hidden}) > 1  # several shapes, so several batched groups
    before = [p.detach().clone() for p in hidden]
    out = policy_update(m, opt, b, adv, LossConfig(), minibatches=1, stat_matrices=hidden)
    deltas = [(p.detach() - q).double() for p, q in zip(hidden, before)]
    rms = math.sqrt(sum(float(d.pow(2).sum()) for d in deltas) / sum(d.numel() for d in deltas))
    top = max(float(torch.linalg.matrix_norm(d, ord=2)) for d in deltas)
    assert out["steps"] == 1
    assert out["update_rms"] == pytest.approx(rms, rel=1e-5)
    assert 0.9 * top <= out["update_spectral_norm"] <= top * (1 + 1e-5)


def test_embedding_and_head_steps_are_measured_beside_the_hidden_matrices(model):
    """embed_head_update_rms and _spectral_norm: the same measurement on the AdamW-trained matrices (embedding,
    head), against the applied update by hand (RMS over both together, an SVD for the top singular value)."""
    m = copy.deepcopy(model)
    b = pad_episodes(_episodes(4, seed=6), pad_id=0)
    adv = torch.where(torch.arange(4).unsqueeze(1) < 2, 1.0, -1.0).expand_as(b.loss_mask) * b.loss_mask
    opt = build_muon_adamw(m, matrix_lr=0.01, lr=1e-3)
    params, route = dict(m.named_parameters()), route_parameters(m)
    io = [params[n] for n, p in route.adamw if p.dim() == 2]
    assert io and all(p.shape[0] == m.config.vocab_size for p in io)
    before = [p.detach().clone() for p in io]
    out = policy_update(
        m,
        opt,
        b,
        adv,
        LossConfig(),
        minibatches=1,
        stat_matrices=[params[n] for n, _ in route.muon],
        embed_head_matrices=io,
    )
    deltas = [(p.detach() - q).double() for p, q in zip(io, before)]
    rms = math.sqrt(sum(float(d.pow(2).sum()) for d in deltas) / sum(d.numel() for d in deltas))
    top = max(float(torch.linalg.matrix_norm(d, ord=2)) for d in deltas)
    assert rms > 0 and out["embed_head_update_rms"] == pytest.approx(rms, rel=1e-5)
    assert 0.9 * top <= out["embed_head_update_spectral_norm"] <= top * (1 + 1e-5)
    assert out["update_rms"] > 0 and out["update_rms"] != out["embed_head_update_rms"]
    idle = copy.deepcopy(model)
    idle_io = [p for _, p in route_parameters(idle).adamw if p.dim() == 2]
    none = policy_update(
        idle,
        build_muon_adamw(idle),
        b,
        torch.zeros_like(adv),
        LossConfig(),
        minibatches=1,
        skip_no_signal=True,
        embed_head_matrices=idle_io,
    )
    assert none["embed_head_update_rms"] is None and none["embed_head_update_spectral_norm"] is None


def test_flash_requirement_is_checked_per_model_not_imposed_process_wide(model, monkeypatch):
    """`run.require_flash_attention` asks the kernel's conditions for the model's own head shape and compute dtype
    and refuses by the key's name; it no longer restricts torch's process-wide kernel flags (which barred an async
    rollout thread's masked attention on a GPU). On the CPU nothing is asked."""
    import trainer.update as update

    asked = []

    def refusal(device, dtype, heads, kv_heads, head_dim):
        asked.append((device.type, dtype, heads, kv_heads, head_dim))
        return "head dimension not supported" if dtype == torch.float32 else None

    monkeypatch.setattr(update, "flash_attention_refusal", refusal)
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    before = torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()
    update.check_flash_attention(model, torch.device("cpu"), torch.bfloat16)
    assert asked == []
    update.check_flash_attention(model, torch.device("cuda"), torch.bfloat16)
    assert asked == [("cuda", torch.bfloat16, c.num_attention_heads, c.num_key_value_heads, head_dim)]
    with pytest.raises(RuntimeError, match=r"run\.require_flash_attention.*head dimension not supported"):
        update.check_flash_attention(model, torch.device("cuda"), None)  # no compute dtype: the parameters' fp32
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


def test_the_trainer_checks_flash_attention_once_in_its_compute_dtype(tmp_path, monkeypatch):
    """The trainer asks once, at the start, about the dtype attention computes in (`run.compute_dtype`), not the
    parameters' fp32: sharded, FSDP2 computes in bf16 with fp32 parameters and no autocast, and asking about the
    parameters refused every sharded GPU cell. `run.require_flash_attention: false` asks nothing."""
    from builders import MINIREPO_CELL

    import trainer.train as train
    from trainer.config import config_from_dict

    seen = []
    monkeypatch.setattr(train, "check_flash_attention", lambda m, device, dtype: seen.append(dtype))
    run = {**MINIREPO_CELL["run"], "compute_dtype": "bfloat16"}
    train.Trainer(config_from_dict({**MINIREPO_CELL, "run": run}), tmp_path / "a")
    train.Trainer(config_from_dict({**MINIREPO_CELL, "run": {**run, "require_flash_attention": False}}), tmp_path / "b")
    assert seen == [torch.bfloat16]
