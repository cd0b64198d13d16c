"""The Muon/AdamW hybrid: routing by module, parity of each half, one state that round-trips."""

import copy

import pytest
import torch
from torch import nn

from trainer.optim.hybrid import MuonAdamW, build_adamw_by_role, build_muon_adamw, route_parameters
from trainer.optim.muon import Muon


class Toy(nn.Module):
    """Embedding -> two hidden linears (one conv-like 3-D weight) -> norm -> head; head optionally tied."""

    def __init__(self, vocab=17, d=12, tied=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d, bias=False)
        self.norm = nn.LayerNorm(d)
        self.scale = nn.Parameter(torch.ones(()))
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def get_output_embeddings(self):
        return self.head

    def forward(self, ids):
        h = self.embed(ids)
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(self.norm(h) * self.scale)


def _names(pairs):
    return sorted(n for n, _ in pairs)


@pytest.mark.parametrize("tied", [False, True])
def test_routing_by_module(tied):
    route = route_parameters(Toy(tied=tied))
    assert _names(route.muon) == ["down.weight", "up.weight"]
    expected_adamw = ["embed.weight", "norm.bias", "norm.weight", "scale", "up.bias"]
    if not tied:  # a tied head is the embedding's own parameter, listed once
        expected_adamw.append("head.weight")
    assert _names(route.adamw) == sorted(expected_adamw)


def test_routing_a_square_head_by_module_not_shape():
    model = Toy(vocab=12, d=12)  # head is 12x12, the same shape as nothing special: found by module
    assert "head.weight" in _names(route_parameters(model).adamw)


def test_routing_a_hugging_face_model():
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = transformers.LlamaForCausalLM(cfg)
    route = route_parameters(model)
    muon = _names(route.muon)
    assert len(muon) == 2 * 7  # q, k, v, o, gate, up, down per layer
    assert all(n.startswith("model.layers.") and n.endswith("proj.weight") for n in muon)
    adamw = _names(route.adamw)
    assert "lm_head.weight" in adamw and "model.embed_tokens.weight" in adamw
    assert all(p.dim() < 2 for n, p in route.adamw if n not in ("lm_head.weight", "model.embed_tokens.weight"))


def test_routing_qwen3_5_keeps_the_conv_kernels_and_gates_on_adamw():
    """A hybrid model (Gated DeltaNet + full attention): every 2-D projection of both kinds of layer is Muon's, the
    3-D depthwise conv1d kernels, A_log, dt_bias and the norms AdamW's."""
    import transformers

    cfg = transformers.AutoConfig.for_model(
        "qwen3_5_text",
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=False,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    route = route_parameters(model)
    muon, adamw = dict(route.muon), dict(route.adamw)
    assert {n for n, p in model.named_parameters() if p.dim() == 2} - set(muon) == {
        "model.embed_tokens.weight",
        "lm_head.weight",
    }
    assert all(p.dim() == 2 for p in muon.values())
    convs = [n for n in adamw if n.endswith("conv1d.weight")]
    assert len(convs) == cfg.layer_types.count("linear_attention") and all(adamw[n].dim() == 3 for n in convs)
    assert any(".linear_attn.in_proj_qkv." in n for n in muon) and any(".self_attn.q_proj." in n for n in muon)
    assert {n.rsplit(".", 1)[-1] for n in adamw if ".linear_attn." in n and "conv1d" not in n} >= {"A_log", "dt_bias"}


def _grads(model, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 17, (3, 5), generator=g)
    model.zero_grad()
    model(ids).logsumexp(-1).mean().backward()


def test_each_half_matches_its_reference_optimizer():
    torch.manual_seed(0)
    model = Toy()
    ref_model = copy.deepcopy(model)
    hybrid = build_muon_adamw(
        model, matrix_lr=0.02, muon_weight_decay=0.1, lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95)
    )
    route = route_parameters(ref_model)
    ref_muon = torch.optim.Muon([p for _, p in route.muon], lr=0.02, weight_decay=0.1)
    ref_adamw = torch.optim.AdamW([p for _, p in route.adamw], lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95))
    for step in range(5):
        _grads(model, step)
        _grads(ref_model, step)
        hybrid.step()
        ref_muon.step()
        ref_adamw.step()
    for (n, p), (_, q) in zip(model.named_parameters(), ref_model.named_parameters()):
        assert (p - q).abs().max().item() <= 1e-6, n


def test_state_dict_round_trip():
    torch.manual_seed(1)
    model = Toy()
    opt = build_muon_adamw(model)
    for step in range(3):
        _grads(model, step)
        opt.step()
    clone = copy.deepcopy(model)
    opt2 = build_muon_adamw(clone)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
    for step in range(3, 6):
        _grads(model, step)
        _grads(clone, step)
        opt.step()
        opt2.step()
    for p, q in zip(model.parameters(), clone.parameters()):
        assert torch.equal(p, q)
    # the saved state really holds both kinds
    kinds = {tuple(sorted(s)) for s in opt.state_dict()["state"].values()}
    assert ("momentum_buffer",) in kinds and ("exp_avg", "exp_avg_sq", "step") in kinds


def test_lr_scheduler_drives_both_kinds():
    model = Toy()
    opt = build_muon_adamw(model, matrix_lr=0.02, lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5)
    _grads(model, 0)
    opt.step()
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.01, 5e-4]


def test_flattened_muon_parameter_is_rejected_by_name():
    with pytest.raises(ValueError, match="'shard'.*flattened shard"):
        MuonAdamW([dict(params=[torch.zeros(10, requires_grad=True)], names=["shard"], use_muon=True)])


def test_missing_use_muon_is_rejected():
    with pytest.raises(ValueError, match="use_muon"):
        MuonAdamW([dict(params=[torch.zeros(3, 3, requires_grad=True)])])


def test_hybrid_muon_stats_are_reported_per_group():
    model = Toy()
    opt = build_muon_adamw(model, track_stats=True)
    _grads(model, 0)
    opt.step()
    assert set(opt.last_stats[0]) == {"update_rms", "update_spectral_norm"} and opt.last_stats[1] == {}
    assert opt.last_stats[0]["update_rms"] > 0


def test_muon_class_and_hybrid_agree():
    torch.manual_seed(2)
    a = [torch.randn(8, 8, requires_grad=True) for _ in range(2)]
    b = [x.detach().clone().requires_grad_() for x in a]
    o1 = Muon(a, lr=0.03, adjust_lr_fn="spectral", ns_coefficients="polar_express")
    o2 = MuonAdamW([dict(params=b, use_muon=True, lr=0.03, adjust_lr_fn="spectral", ns_coefficients="polar_express")])
    for s in range(3):
        for x, y in zip(a, b):
            x.grad = torch.randn(8, 8, generator=torch.Generator().manual_seed(s))
            y.grad = x.grad.clone()
        o1.step()
        o2.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_newton_schulz_runs_in_fp32_on_a_cpu_and_in_bf16_on_a_gpu_unless_the_config_names_one():
    """`optim.ns_dtype: auto` (the default): bf16 where the parameters are on CUDA, fp32 on a CPU, where torch's bf16
    matmul is a reference loop on CPUs without AVX512-BF16 or AMX; a named dtype is used as it is."""
    from trainer.config import TrainConfig
    from trainer.optim.build import build_optimizer
    from trainer.optim.muon import resolve_ns_dtype

    assert resolve_ns_dtype("auto", "cpu") == "float32"
    assert resolve_ns_dtype("auto", torch.device("cuda", 3)) == "bfloat16"
    assert resolve_ns_dtype("bfloat16", "cpu") == "bfloat16"
    assert resolve_ns_dtype("float64", "cuda") == "float64"
    with pytest.raises(ValueError, match="ns_dtype"):
        resolve_ns_dtype("float16", "cpu")
    cfg = TrainConfig()
    assert cfg.optim.ns_dtype == "auto"
    muon_groups = [g for g in build_optimizer(Toy(), cfg.optim).param_groups if g["use_muon"]]
    assert [g["ns_dtype"] for g in muon_groups] == ["float32"]
    cfg.optim.ns_dtype = "bfloat16"
    muon_groups = [g for g in build_optimizer(Toy(), cfg.optim).param_groups if g["use_muon"]]
    assert [g["ns_dtype"] for g in muon_groups] == ["bfloat16"]


@pytest.mark.parametrize("name", ["adam", "muon"])
def test_adamw_eps_is_the_cells_under_either_optimizer(name):
    """`optim.eps` reaches every AdamW-trained parameter. First AdamW step, by hand: m_hat = g and v_hat = g^2,
    so the step is lr * g / (|g| + eps): half of lr where |g| = eps, all of it (to 1e-6) where eps is tiny."""
    from trainer.config import TrainConfig
    from trainer.optim.build import build_optimizer

    for eps, share in ((1e-6, 0.5), (1e-14, 1.0)):
        model, cfg = Toy(), TrainConfig()
        cfg.optim.name, cfg.optim.lr, cfg.optim.eps, cfg.optim.weight_decay = name, 1e-3, eps, 0.0
        opt = build_optimizer(model, cfg.optim)
        before = model.embed.weight.detach().clone()
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        model.embed.weight.grad.fill_(1e-6)
        opt.step()
        assert torch.allclose(
            before - model.embed.weight.detach(), torch.full_like(before, 1e-3 * share), rtol=1e-4, atol=0
        )


def test_a_spectrally_matched_muon_cell_matches_the_cells_own_adamw():
    """`optim.adjust_lr_fn: match_spectral_adamw`: the Muon group measures the step of the AdamW the cell
    configures (its betas and eps), and the step it takes has that step's top singular value."""
    from trainer.config import TrainConfig
    from trainer.optim.build import build_optimizer

    cfg = TrainConfig()
    cfg.optim.adjust_lr_fn, cfg.optim.betas, cfg.optim.eps, cfg.optim.weight_decay = (
        "match_spectral_adamw",
        (0.8, 0.99),
        1e-7,
        0.0,
    )
    model = Toy()
    opt = build_optimizer(model, cfg.optim)
    muon = next(g for g in opt.param_groups if g["use_muon"])
    assert muon["adamw_betas"] == (0.8, 0.99) and muon["adamw_eps"] == 1e-7
    reference = copy.deepcopy(model.down.weight)
    adamw = torch.optim.AdamW([reference], lr=cfg.optim.lr, betas=(0.8, 0.99), eps=1e-7, weight_decay=0.0)
    before = model.down.weight.detach().clone()
    _grads(model, 3)
    reference.grad = model.down.weight.grad.clone()
    opt.step()
    adamw.step()
    ours, theirs = (
        torch.linalg.matrix_norm((w.detach() - before).double(), ord=2) for w in (model.down.weight, reference)
    )
    assert float(ours) == pytest.approx(float(theirs), rel=0.05)


def test_adamw_by_role_moves_the_hidden_matrices_at_matrix_lr_and_the_rest_at_lr():
    """AdamW's first step is lr x g / (|g| + eps) (bias-corrected moments of one gradient): a step of ~lr on every
    entry with a gradient, so each parameter's largest move names the lr of its group."""
    torch.manual_seed(0)
    model = Toy()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_adamw_by_role(model, lr=1e-3, matrix_lr=4e-3, weight_decay=0.0)
    model(torch.randint(17, (3, 5))).square().mean().backward()
    opt.step()
    moved = {n: (p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters()}
    hidden = {"up.weight", "down.weight"}
    assert set(_names(route_parameters(model).muon)) == hidden
    for name, step in moved.items():
        assert step == pytest.approx(4e-3 if name in hidden else 1e-3, rel=1e-3), name


def test_adamw_by_role_without_matrix_lr_is_torchs_adamw_bit_for_bit():
    torch.manual_seed(0)
    a, b = Toy(), Toy()
    b.load_state_dict(a.state_dict())
    opts = (
        build_adamw_by_role(a, lr=3e-4, betas=(0.9, 0.95)),
        torch.optim.AdamW(b.parameters(), lr=3e-4, betas=(0.9, 0.95)),
    )
    ids = torch.randint(17, (3, 5))
    for _ in range(3):
        for model, opt in zip((a, b), opts):
            opt.zero_grad()
            model(ids).square().mean().backward()
            opt.step()
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_the_warm_start_builds_its_optimizer_with_the_cells_builder_at_its_own_defaults():
    """The warm start's `optim` is the cells' section with the warm start's defaults, built by the cells' builder:
    under "muon" Muon at 0.02 (torch's shape rule, decay 0.1) on the hidden matrices and AdamW at 3e-3 (torch's
    betas, no decay) on the rest; under "adam" with `matrix_lr: 3e-3`, torch's AdamW at 3e-3 on everything. Three
    steps of each equal the references bit for bit."""
    from trainer.config import WarmStartConfig
    from trainer.optim.build import build_optimizer
    from trainer.optim.config import OptimConfig, WarmStartOptimConfig

    assert isinstance(WarmStartConfig().optim, OptimConfig)
    # a left-out matrix rate: Muon's 0.02 under Muon; under AdamW the rest's rate, never Muon's
    assert (WarmStartOptimConfig().matrix_lr, WarmStartOptimConfig(name="adam").matrix_lr) == (0.02, 3e-3)
    for optim, reference in (
        (
            WarmStartOptimConfig(),
            lambda m: build_muon_adamw(m, matrix_lr=0.02, muon_weight_decay=0.1, lr=3e-3, ns_dtype="float32"),
        ),
        (
            WarmStartOptimConfig(name="adam", matrix_lr=3e-3),
            lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
        ),
    ):
        torch.manual_seed(0)
        ours_model = Toy()
        theirs_model = copy.deepcopy(ours_model)
        ours, theirs = build_optimizer(ours_model, optim), reference(theirs_model)
        for step in range(3):
            for model, opt in ((ours_model, ours), (theirs_model, theirs)):
                _grads(model, step)
                opt.step()
        assert all(torch.equal(a, b) for a, b in zip(ours_model.parameters(), theirs_model.parameters(), strict=True))


def test_a_left_out_matrix_lr_is_the_lr_once_the_section_is_built():
    """`optim.matrix_lr` left out means `lr` (one number, one step size under both optimizers), resolved when the
    section is built, so the builder, the plan and the logs all read a rate."""
    from trainer.config import config_from_dict

    cfg = config_from_dict({"optim": {"name": "muon", "lr": 2e-4}})
    assert (cfg.optim.lr, cfg.optim.matrix_lr) == (2e-4, 2e-4)
    cfg = config_from_dict({"optim": {"name": "muon", "lr": 2e-4, "matrix_lr": 6e-4}})
    assert (cfg.optim.lr, cfg.optim.matrix_lr) == (2e-4, 6e-4)
