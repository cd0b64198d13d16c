"""Muon against independent references: torch.optim.Muon, an fp64 SVD, and hand formulas."""

import copy
import math

import pytest
import torch

from trainer.optim.muon import JORDAN_COEFFICIENTS, Muon, matrix_update_stats, newton_schulz, resolve_coefficients

SHAPES = [(48, 48), (24, 80), (80, 24), (48, 48), (7, 5)]  # square (twice: one shape group of 2), wide, tall


def _pair(shapes, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    base = [torch.randn(s, generator=g, dtype=torch.float32).to(dtype) for s in shapes]
    return ([b.clone().requires_grad_() for b in base], [b.clone().requires_grad_() for b in base])


def _run(opt_a, opt_b, a, b, steps=10, seed=1):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for x, y in zip(a, b):
            grad = torch.randn(x.shape, generator=g).to(x.dtype)
            x.grad, y.grad = grad.clone(), grad.clone()
        opt_a.step()
        opt_b.step()


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", [None, "original", "match_rms_adamw"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_parity_with_torch_muon_after_10_steps(nesterov, adjust_lr_fn, weight_decay):
    a, b = _pair(SHAPES)
    kw = dict(lr=0.02, weight_decay=weight_decay, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    ours, ref = Muon(a, **kw), torch.optim.Muon(b, **kw)
    _run(ours, ref, a, b)
    for x, y in zip(a, b):
        assert torch.equal(x, y), (tuple(x.shape), (x - y).abs().max().item())
    # the parameters really moved (a parity test of two no-ops would prove nothing)
    a0, _ = _pair(SHAPES)
    assert all((x - x0).abs().max() > 1e-2 for x, x0 in zip(a, a0))


def test_parity_defaults_and_custom_coefficients():
    a, b = _pair(SHAPES, seed=3)
    coeffs = (3.0, -3.2, 1.2)
    ours = Muon(a, ns_coefficients=coeffs, ns_steps=3, eps=1e-6)
    ref = torch.optim.Muon(b, ns_coefficients=coeffs, ns_steps=3, eps=1e-6)
    _run(ours, ref, a, b, steps=10, seed=4)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


REVIEW_SHAPES = [(96, 32), (32, 96), (64, 64), (7, 130)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_bit_identical_to_torch_muon_on_small_min_dim(weight_decay):
    """A 7x130 matrix beside larger ones in one group: its bf16 NS products are small enough that a batched
    bmm/baddbmm would take another kernel than torch's addmm and round differently near ties (batched NS gives
    3.9e-5 after 10 steps at seed 13 on an AVX-512 CPU; which seeds hit a tie depends on the CPU's kernels)."""
    for seed in (13, 17, 35, 40, 41, 44, 58):
        torch.manual_seed(seed)
        base = [torch.randn(s) for s in REVIEW_SHAPES]
        a, b = [x.clone().requires_grad_() for x in base], [x.clone().requires_grad_() for x in base]
        ours, ref = Muon(a, lr=0.02, weight_decay=weight_decay), torch.optim.Muon(b, lr=0.02, weight_decay=weight_decay)
        for _ in range(10):
            for x, y in zip(a, b):
                g = torch.randn(x.shape)
                x.grad, y.grad = g.clone(), g.clone()
            ours.step()
            ref.step()
        for x, y in zip(a, b):
            assert torch.equal(x, y), (seed, tuple(x.shape), (x - y).abs().max().item())


def test_bf16_ns_equals_torch_zeropower_per_matrix_and_stacked():
    """newton_schulz in bf16, on one matrix or a stack, is torch's `_zeropower_via_newtonschulz` bit for bit, also
    on shapes and inputs where batched bmm/baddbmm rounds differently (seen on CPU: 7x130 seeds 5 and 21, 16x16)."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    for shape, n in [((7, 130), 1), ((130, 7), 2), ((16, 16), 3), ((5, 7), 3), ((80, 16), 3), ((48, 96), 2)]:
        for seed in (0, 1, 2, 5, 6, 21):
            G = torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))
            expected = torch.stack([_zeropower_via_newtonschulz(g, JORDAN_COEFFICIENTS, 5, 1e-7) for g in G])
            assert torch.equal(newton_schulz(G, [JORDAN_COEFFICIENTS] * 5), expected), (shape, seed)
            assert torch.equal(newton_schulz(G[0], [JORDAN_COEFFICIENTS] * 5), expected[0]), (shape, seed)


def _polynomial_map(x: torch.Tensor, coefficients) -> torch.Tensor:
    """The scalar map NS applies to each normalised singular value: x <- a x + b x^3 + c x^5."""
    for a, b, c in coefficients:
        x = a * x + b * x**3 + c * x**5
    return x


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (40, 40)])
@pytest.mark.parametrize("name", ["jordan", "polar_express"])
def test_ns_acts_on_singular_values_only_fp64(shape, name):
    """In fp64, NS(G) = U f(S / (s ||G||_F)) V^T exactly, with f the composed quintic: checked by SVD."""
    coefficients, norm_scale = resolve_coefficients(name, 5)
    G = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    U, S, Vh = torch.linalg.svd(G, full_matrices=False)
    expected = U @ torch.diag(_polynomial_map(S / (S.norm() * norm_scale), coefficients)) @ Vh
    out = newton_schulz(G, coefficients, norm_scale=norm_scale, dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1e-10)


@pytest.mark.parametrize("shape", [(32, 128), (128, 32), (256, 1024)])
def test_ns_bf16_singular_values_stay_in_the_promised_band(shape):
    """bf16 NS output, measured by an fp64 SVD: Jordan's quintic lands well-conditioned inputs in about
    [0.68, 1.2], Polar Express in about [0.86, 1.14] (their papers' claims), and both keep the singular vectors."""
    G = torch.randn(*shape, generator=torch.Generator().manual_seed(6))
    U, S, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    for name, lo, hi in [("jordan", 0.6, 1.25), ("polar_express", 0.8, 1.2)]:
        coefficients, norm_scale = resolve_coefficients(name, 5)
        out = newton_schulz(G, coefficients, norm_scale=norm_scale).double()
        assert out.dtype == torch.float64
        sv = torch.linalg.svdvals(out)
        assert lo <= sv.min() and sv.max() <= hi, (name, sv.min(), sv.max())
        # bf16 arithmetic stays close to the exact scalar map of the same polynomial
        predicted = _polynomial_map(S / (S.norm() * norm_scale), coefficients)
        assert (sv - predicted.sort(descending=True).values).abs().max() < 0.08
        # and the singular vectors are G's: U^T O V is nearly diagonal
        M = U.T @ out @ Vh.T
        assert (M - torch.diag(torch.diag(M))).norm() / M.norm() < 0.05


def test_polar_express_is_closer_to_the_polar_factor_than_jordan():
    G = torch.randn(64, 256, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh
    errs = {}
    for name in ("jordan", "polar_express"):
        coefficients, scale = resolve_coefficients(name, 5)
        errs[name] = (
            (newton_schulz(G.float(), coefficients, norm_scale=scale).double() - polar).norm() / polar.norm()
        ).item()
    assert errs["polar_express"] < 0.7 * errs["jordan"], errs


def test_step_never_mutates_grad():
    p = torch.randn(16, 24, requires_grad=True)
    p.grad = torch.randn(16, 24)
    before = p.grad.clone()
    opt = Muon([p], nesterov=True)
    for _ in range(3):
        opt.step()
    assert torch.equal(p.grad, before)


def test_bf16_param_without_nesterov_keeps_its_momentum_buffer():
    """torch 2.13 normalises the state in place here (buf.bfloat16() is buf, then div_); ours must not."""
    grad = torch.randn(32, 32, generator=torch.Generator().manual_seed(8)) * 3

    def one_step(cls):
        p = torch.zeros(32, 32, dtype=torch.bfloat16, requires_grad=True)
        p.grad = grad.to(torch.bfloat16)
        opt = cls([p], momentum=0.95, nesterov=False)
        opt.step()
        return opt.state[p]["momentum_buffer"].float()

    expected = 0.05 * grad.to(torch.bfloat16).float()  # buf = lerp(0, g, 1 - 0.95) = 0.05 g
    ours = one_step(Muon)
    assert torch.allclose(ours, expected, rtol=1e-2, atol=1e-3)
    torch_buf = one_step(torch.optim.Muon)
    # document the upstream bug this test guards against: torch's buffer was normalised to unit norm
    assert abs(torch_buf.norm().item() - 1.0) < 1e-2
    assert abs(ours.norm().item() - expected.norm().item()) < 1e-2 * expected.norm().item()


def test_spectral_lr_rule_by_hand():
    """momentum 0 (buf = g, no nesterov), no weight decay: p1 = p0 - lr * sqrt(r/c) * NS(g)."""
    for shape in [(12, 48), (48, 12)]:
        p0 = torch.randn(*shape)
        g = torch.randn(*shape)
        p = p0.clone().requires_grad_()
        p.grad = g.clone()
        Muon([p], lr=0.1, momentum=0.0, nesterov=False, weight_decay=0.0, adjust_lr_fn="spectral").step()
        expected = p0 - 0.1 * math.sqrt(shape[0] / shape[1]) * newton_schulz(g, [JORDAN_COEFFICIENTS] * 5).float()
        assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_weight_decay_uses_unadjusted_lr():
    p = torch.ones(40, 10, requires_grad=True)  # tall: "original" factor sqrt(4) = 2
    p.grad = torch.zeros(40, 10)  # NS(0) = 0: only decay acts
    Muon([p], lr=0.1, weight_decay=0.5).step()
    assert torch.allclose(p.detach(), torch.full((40, 10), 1 - 0.1 * 0.5))


def test_zero_gradient_is_finite():
    p = torch.randn(8, 8, requires_grad=True)
    p.grad = torch.zeros(8, 8)
    p0 = p.detach().clone()
    Muon([p], weight_decay=0.0).step()
    assert torch.equal(p.detach(), p0)


def test_flattened_parameter_is_an_error_that_says_so():
    with pytest.raises(ValueError, match="flattened shard"):
        Muon([torch.zeros(64, requires_grad=True)])


def test_conv_like_parameter_is_treated_as_its_flattened_matrix():
    g = torch.randn(6, 3, 2, 2)
    p = torch.zeros(6, 3, 2, 2, requires_grad=True)
    p.grad = g.clone()
    Muon([p], lr=1.0, momentum=0.0, nesterov=False, weight_decay=0.0).step()
    expected = -newton_schulz(g.reshape(6, 12), [JORDAN_COEFFICIENTS] * 5).float().reshape(6, 3, 2, 2)
    assert torch.allclose(p.detach(), expected, atol=1e-6)


def test_fp32_ns_option_is_close_to_bf16():
    g = torch.randn(32, 64)
    outs = []
    for dtype in (torch.bfloat16, torch.float32):
        p = torch.zeros(32, 64, requires_grad=True)
        p.grad = g.clone()
        Muon([p], lr=1.0, momentum=0.0, nesterov=False, weight_decay=0.0, ns_dtype=dtype).step()
        outs.append(p.detach().clone())
    assert not torch.equal(outs[0], outs[1])
    assert (outs[0] - outs[1]).abs().max() < 0.05


def test_bad_arguments_are_rejected():
    p = [torch.zeros(4, 4, requires_grad=True)]
    with pytest.raises(ValueError, match="adjust_lr_fn|Adjust learning rate"):
        Muon(p, adjust_lr_fn="bogus")
    with pytest.raises(ValueError, match="ns_coefficients"):
        Muon(p, ns_coefficients="bogus")
    with pytest.raises(ValueError, match="ns_steps"):
        Muon(p, ns_steps=0)
    with pytest.raises(ValueError, match="Learning rate"):
        Muon(p, lr=-1.0)


def test_state_dict_round_trip_continues_identically():
    a, b = _pair(SHAPES, seed=9)
    opt_a = Muon(a, lr=0.02)
    _run(opt_a, Muon(b, lr=0.02), a, b, steps=3)
    saved = copy.deepcopy(opt_a.state_dict())
    c = [x.detach().clone().requires_grad_() for x in a]
    opt_c = Muon(c, lr=0.02)
    opt_c.load_state_dict(saved)
    _run(opt_a, opt_c, a, c, steps=3, seed=10)
    assert all(torch.equal(x, y) for x, y in zip(a, c))


def test_tracked_stats_match_the_measured_update():
    for seed in range(10):
        g = torch.Generator().manual_seed(seed)
        p = torch.randn(64, 32, generator=g).requires_grad_()
        p.grad = torch.randn(64, 32, generator=g)
        before = p.detach().clone()
        opt = Muon([p], lr=0.05, weight_decay=0.0, track_stats=True)
        opt.step()
        delta = p.detach() - before
        stats = opt.last_stats[0]
        assert math.isclose(stats["update_rms"], delta.pow(2).mean().sqrt().item(), rel_tol=1e-3)
        true_spec = torch.linalg.matrix_norm(delta.double(), ord=2).item()
        # a power-iteration lower bound, within 10% of the SVD value on Muon's clustered spectra
        assert 0.9 * true_spec <= stats["update_spectral_norm"] <= true_spec * (1 + 1e-4)


def test_matrix_update_stats_against_svd():
    M = torch.randn(3, 20, 30, generator=torch.Generator().manual_seed(11))
    rms, spec = matrix_update_stats(M, iters=50)
    assert torch.allclose(rms, M.pow(2).mean(dim=(1, 2)).sqrt())
    assert torch.allclose(spec, torch.linalg.matrix_norm(M, ord=2), rtol=1e-3)


@pytest.mark.parametrize("shape", [(5, 40, 12), (4, 12, 40), (2, 16, 16)])
def test_matrix_update_stats_follows_plain_power_iteration(shape):
    """The Gram-matrix shortcut gives the iterates of the textbook power iteration v <- U^T (U v) / norm from the
    same start vector (float64 here), on tall, wide and square matrices, 16 iterations; a zero update gives 0."""
    U = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 1e-3
    _, spec = matrix_update_stats(U, iters=16)
    for m, got in zip(U.double(), spec):
        v = torch.ones(m.shape[1], 1, dtype=torch.float64) + torch.linspace(0, 1, m.shape[1]).double().view(-1, 1)
        for _ in range(16):
            v = m.T @ (m @ v)
            v = v / v.norm()
        assert float(got) == pytest.approx(float((m @ v).norm()), rel=1e-5)
    assert matrix_update_stats(torch.zeros(1, 3, 4))[1].tolist() == [0.0]


def test_matrix_update_stats_does_not_underflow_on_a_flat_spectrum_over_many_iterations():
    Q = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)))[0] * 1e-3
    assert float(matrix_update_stats(Q[None], iters=50)[1][0]) == pytest.approx(1e-3, rel=1e-4)


def _spiky_low_rank_grads(shape, steps, seed):
    """Policy-gradient-like gradients: a few outer products plus noise, of varying size (AdamW's steps on these
    are far from isotropic, so their top singular value is several times that of an RMS-matched Muon step)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        u, v = torch.randn(shape[0], 2, generator=g), torch.randn(2, shape[1], generator=g)
        scale = float(torch.rand((), generator=g)) * 3 + 0.1
        out.append(scale * (u @ v + 0.3 * torch.randn(shape, generator=g)))
    return out


@pytest.mark.parametrize("shape", [(24, 80), (80, 24), (48, 48)])
def test_match_spectral_adamw_steps_have_adamws_top_singular_value(shape):
    """Against torch.optim.AdamW fed the same gradients: at every step the Muon step's top singular value (SVD)
    equals AdamW's to within the power iterations' error (both are estimated; 5% here), while its RMS differs
    (it is Muon's direction, with AdamW's spectral norm)."""
    grads = _spiky_low_rank_grads(shape, 8, seed=3)
    a = torch.randn(shape).requires_grad_()
    m = a.detach().clone().requires_grad_()
    adamw = torch.optim.AdamW([a], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    muon = Muon(
        [m],
        lr=1e-3,
        weight_decay=0.0,
        adjust_lr_fn="match_spectral_adamw",
        adamw_betas=(0.9, 0.95),
        ns_dtype=torch.float32,
    )
    rms_ratios = []
    for grad in grads:
        before_a, before_m = a.detach().clone(), m.detach().clone()
        a.grad, m.grad = grad.clone(), grad.clone()
        adamw.step()
        muon.step()
        da, dm = (a.detach() - before_a).double(), (m.detach() - before_m).double()
        top_a, top_m = (float(torch.linalg.matrix_norm(d, ord=2)) for d in (da, dm))
        assert top_m == pytest.approx(top_a, rel=0.05)
        rms_ratios.append(float(dm.pow(2).mean().sqrt() / da.pow(2).mean().sqrt()))
    assert max(rms_ratios) > 1.5  # not an RMS match: AdamW's low-rank steps have a small RMS for their norm


def test_match_spectral_adamw_keeps_muons_direction_and_resumes_identically():
    """The first step is the RMS-matched step times one positive number per matrix (the rule changes the size,
    not the direction); the AdamW moments it keeps are in the state, so a reloaded optimizer continues
    bit-identically."""
    a, b = _pair(SHAPES, seed=4)
    grads = [torch.randn(x.shape, generator=torch.Generator().manual_seed(i)) for i, x in enumerate(a)]
    before = [x.detach().clone() for x in a]
    for x, y, grad in zip(a, b, grads):
        x.grad, y.grad = grad.clone(), grad.clone()
    opt = Muon(a, lr=0.01, weight_decay=0.0, adjust_lr_fn="match_spectral_adamw", ns_dtype=torch.float32)
    opt.step()
    Muon(b, lr=0.01, weight_decay=0.0, adjust_lr_fn="match_rms_adamw", ns_dtype=torch.float32).step()
    for x, y, p0 in zip(a, b, before):
        dx, dy = (x.detach() - p0).flatten().double(), (y.detach() - p0).flatten().double()
        assert float(dx @ dy) / float(dx.norm() * dy.norm()) > 1 - 1e-6
    assert all("adamw_exp_avg_sq" in opt.state[x] for x in a)
    saved = copy.deepcopy(opt.state_dict())
    c = [x.detach().clone().requires_grad_() for x in a]
    opt_c = Muon(c, lr=0.01, weight_decay=0.0, adjust_lr_fn="match_spectral_adamw", ns_dtype=torch.float32)
    opt_c.load_state_dict(saved)
    _run(opt, opt_c, a, c, steps=3, seed=11)
    assert all(torch.equal(x, y) for x, y in zip(a, c))
