"""Muon: momentum, then Newton-Schulz orthogonalisation, for hidden weight matrices.

`Muon` is a drop-in for `torch.optim.Muon` (torch 2.13): same constructor, same defaults, and with equal settings
the same fp32 parameters after every step, bit for bit (tested on CPU, including shapes on which batched matmuls
round differently). It holds because wherever the order or the kernel of an op could change a rounding, we call
torch's op on the same operands:

* **Newton-Schulz in bf16 (the default) runs per matrix with torch's calls**: `norm`, `X @ X.T`, then
  `addmm(A, A, A, beta=b, alpha=c)` and `addmm(X, B, X, beta=a)`, on the transposed view when rows > cols, in
  bf16 (`_newton_schulz_matrix`). Stacking same-shape matrices into one bmm/baddbmm is the same arithmetic but not
  the same kernel: PyTorch picks oneDNN, a naive loop or a BLAS gemm by size and batch count, their accumulation
  orders differ, and in bf16 a result near a rounding tie then rounds the other way (seen on CPU for a few inputs when
  min(rows, cols) <= 16, e.g. a 7x130 matrix). So bf16 NS is not batched.
* Momentum is `lerp_` / `lerp` as in torch (`_foreach` forms, which compute the same per element), weight decay
  `p *= 1 - lr * wd` before `p -= adjusted_lr * O`, and the lr factor is torch's formula in Python floats.

What it adds:

* **Speed where parity allows.** Momentum, weight decay and the update use `_foreach` kernels over same-shape
  buckets, and NS in fp32/fp64 (`ns_dtype`, which torch does not offer) runs batched over each bucket (bmm /
  baddbmm, `_newton_schulz_batched`); it is not bitwise a per-matrix computation (batched and single gemm
  kernels round differently), and has no torch counterpart to match.
* **No aliasing.** torch 2.13 normalises the momentum buffer in place when a parameter is bf16 and
  `nesterov=False` (`buf.bfloat16()` is `buf` itself, then `div_`). Our NS divides out of place (same values),
  so our state is never touched by NS, and `p.grad` is never written.
* **Options.** `adjust_lr_fn="spectral"` (sqrt(r/c), dion's rule) beside torch's "original" and
  "match_rms_adamw"; `adjust_lr_fn="match_spectral_adamw"`: each matrix's step has the top singular value of the
  step AdamW would take on the same gradients (its moments kept beside Muon's, with the group's `adamw_betas` and
  `adamw_eps`, both steps' top singular values by power iteration), so the two optimizers are matched in the
  norm the papers' trust-region argument names rather than in RMS (AdamW's steps are far from isotropic: at the
  same RMS its top singular value is several times Muon's); `ns_coefficients="polar_express"` (per-step
  minimax coefficients of arXiv:2505.16932, with the 1.02 normalisation safety factor); NS in bf16 (default, as
  torch) or fp32/fp64 (`ns_dtype`).
* **Diagnostics.** With `track_stats=True` each step records, per parameter group, the RMS of the applied update
  and a power-iteration estimate of its largest spectral norm: the mechanism the paper argues about, logged.
* **Sharded parameters (FSDP2 DTensors).** Momentum and weight decay act on each rank's shard (they are
  elementwise); the update is gathered to the full matrix (`full_tensor()`), orthogonalised on every rank by the
  same code as a local matrix, and each rank keeps its own rows (`distribute_tensor(..., src_data_rank=None)`,
  no communication); the lr factor comes from the global shape. So a sharded step equals the single-process step
  on the same global gradients, bit for bit, whatever the world size and however the rows divide (tested with 2
  gloo ranks against `torch.optim.Muon`). Every rank does the whole Newton-Schulz (the simplest correct design;
  dion and Moonlight split it across ranks, a later optimisation).
* **More than 2 dims.** A conv-like tensor is treated as the matrix (shape[0], rest), its lr factor taken from
  that flattened shape. Fewer than 2 dims is an error: it is what a flattened FSDP1/ZeRO-3 shard looks like,
  where Muon would silently do nothing sensible.

Momentum is torch's EMA form (buf <- lerp(buf, g, 1 - mu); nesterov: lerp(g, buf, mu)), kept in fp32 even for
bf16 parameters (so bf16 parameters do not match torch, whose buffer is bf16). Weight decay is decoupled and uses
the unadjusted lr, as every public Muon does.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import torch
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.optim import Optimizer

JORDAN_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
"""Keller Jordan's quintic: maximal slope at zero; singular values land in roughly [0.7, 1.2] after 5 steps."""

POLAR_EXPRESS_COEFFICIENTS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)
"""Polar Express (Amsel et al., arXiv:2505.16932), 5 steps, as published with a 2% safety margin for bf16."""

POLAR_EXPRESS_NORM_SCALE = 1.02
ADJUST_LR_FNS = ("original", "match_rms_adamw", "spectral", "match_spectral_adamw")
MEASURED_LR_FNS = ("match_spectral_adamw",)
"""Rules whose scale is measured per matrix and step, not a function of the shape (`lr_shape_factor`)."""


def resolve_coefficients(ns_coefficients, ns_steps: int) -> tuple[list[tuple[float, float, float]], float]:
    """Per-step (a, b, c) triples and the Frobenius-norm scale for a coefficient spec.

    A single triple is used at every step (torch's meaning); a sequence of triples gives one per step (the last
    repeats if there are more steps); "jordan" and "polar_express" name the published sets.
    """
    if not 0 < ns_steps < 100:
        raise ValueError(f"ns_steps must be in [1, 99], got {ns_steps}")
    norm_scale = 1.0
    if isinstance(ns_coefficients, str):
        if ns_coefficients == "jordan":
            ns_coefficients = JORDAN_COEFFICIENTS
        elif ns_coefficients == "polar_express":
            ns_coefficients, norm_scale = POLAR_EXPRESS_COEFFICIENTS, POLAR_EXPRESS_NORM_SCALE
        else:
            raise ValueError(
                f"unknown ns_coefficients {ns_coefficients!r}: use 'jordan', 'polar_express', "
                "a triple (a, b, c) or a sequence of triples"
            )
    seq = list(ns_coefficients)
    if len(seq) == 3 and all(isinstance(x, (int, float)) for x in seq):
        steps = [tuple(float(x) for x in seq)] * ns_steps
    elif seq and all(len(t) == 3 for t in seq):
        steps = [tuple(float(x) for x in seq[min(i, len(seq) - 1)]) for i in range(ns_steps)]
    else:
        raise ValueError(f"ns_coefficients must be a triple or a sequence of triples, got {ns_coefficients!r}")
    return steps, norm_scale


def newton_schulz(
    G: torch.Tensor,
    coefficients: Sequence[tuple[float, float, float]],
    *,
    eps: float = 1e-7,
    norm_scale: float = 1.0,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """Approximate the orthogonal polar factor U V^T of a matrix G [r, c], or of each matrix in G [n, r, c].

    Computed in `dtype`, on the wide orientation (X = G^T when r > c, so the Gram matrix X X^T is min(r, c)
    square). X is divided by its Frobenius norm (times `norm_scale`), clamped below at `eps`, so every singular
    value starts in [0, 1]; then per step A = X X^T, B = b A + c A A, X = a X + B X. G is never written.

    In bf16 each matrix goes through `_newton_schulz_matrix` (torch.optim.Muon's exact op sequence, so the result
    is torch's bit for bit); in fp32/fp64, which torch does not offer, the stack goes through one batched
    computation (`_newton_schulz_batched`).
    """
    if G.dim() not in (2, 3):
        raise ValueError(f"newton_schulz needs a matrix [r, c] or a stack [n, r, c], got shape {tuple(G.shape)}")
    if dtype != torch.bfloat16:
        return _newton_schulz_batched(G, coefficients, eps, norm_scale, dtype)
    if G.dim() == 3:
        return _stack_like_batched(
            [_newton_schulz_matrix(g, coefficients, eps, norm_scale, dtype) for g in G.unbind(0)]
        )
    return _newton_schulz_matrix(G, coefficients, eps, norm_scale, dtype)


def _newton_schulz_matrix(
    G: torch.Tensor,
    coefficients: Sequence[tuple[float, float, float]],
    eps: float,
    norm_scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """NS on one 2-D matrix with the calls of torch's `_zeropower_via_newtonschulz` (torch 2.13), one for one.

    Same ops (`norm`, `@`, `addmm`), operand layouts (the transposed view for tall G) and dtype, hence the same
    kernels and roundings: with torch's coefficients the result is torch's bit for bit. Not batched on purpose
    (see the module docstring). The one departure from torch's code: the normalisation is out of place (torch's
    in-place `div_` writes into G when G is already `dtype`); the values are the same.
    """
    X = G.to(dtype)  # G itself when it is already `dtype`: nothing below writes into X
    tall = G.size(0) > G.size(1)
    if tall:
        X = X.T
    norm = X.norm()
    if norm_scale != 1.0:
        norm = norm * norm_scale
    X = X / norm.clamp(min=eps)
    for a, b, c in coefficients:
        A = X @ X.T
        B = torch.addmm(A, A, A, beta=b, alpha=c)
        X = torch.addmm(X, B, X, beta=a)
    return X.T if tall else X


def _newton_schulz_batched(
    G: torch.Tensor,
    coefficients: Sequence[tuple[float, float, float]],
    eps: float,
    norm_scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The same iteration on a stack [n, r, c] (or one matrix) at once with bmm/baddbmm (see `newton_schulz`)."""
    X = G.to(dtype)  # a copy whenever G is not already `dtype`; the division below is out of place regardless
    batched = X.dim() == 3
    if not batched:
        X = X.unsqueeze(0)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True)
    if norm_scale != 1.0:
        norm = norm * norm_scale
    X = X / norm.clamp(min=eps)
    for a, b, c in coefficients:
        A = torch.bmm(X, X.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)
        X = torch.baddbmm(X, B, X, beta=a)
    if tall:
        X = X.mT
    return X if batched else X.squeeze(0)


def lr_shape_factor(adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """Multiplier on lr so the orthogonal update's size suits the matrix shape."""
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    if adjust_lr_fn == "spectral":
        return math.sqrt(rows / cols)
    if adjust_lr_fn in MEASURED_LR_FNS:
        raise ValueError(f"adjust_lr_fn {adjust_lr_fn!r} is measured per step, not a function of the shape")
    raise ValueError(f"adjust_lr_fn {adjust_lr_fn!r} is not one of {ADJUST_LR_FNS}")


def matrix_update_stats(updates: torch.Tensor, iters: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """RMS and an estimate of the spectral norm of each matrix in `updates` [n, r, c], both fp32 [n].

    The spectral norm comes from `iters` power iterations on U^T U from a fixed start vector (no global RNG is
    touched, so logging never changes a run). It is a lower bound; on Muon's updates, whose singular values
    cluster near the top, 16 iterations land within ~6% of the SVD value (measured over 100 random matrices:
    worst 0.944, mean 0.989).

    Each matrix iterates with the Gram matrix of its smaller side, scaled to unit Frobenius norm, and the vector
    is renormalised when it has shrunk below 1e-15 (checked every 8 products but the last; a flat spectrum shrinks
    it by ~sqrt(side) a product, so with 16 products only sides over ~10^4 get there): v_16 = (U^T U)^16 v_0
    directly when c <= r, else as U^T (U U^T)^15 U v_0. The same iterates as 16 products with U and U^T, up to
    rounding, in a third of the small ops (a diagnostic runs after every optimizer step, and on a CPU such ops cost
    their dispatch, not their arithmetic; batching matrix-vector products with bmm was slower still).
    """
    U = updates.float()
    rms = U.pow(2).mean(dim=(-2, -1)).sqrt()
    rows, cols = U.shape[-2:]
    # a fixed, non-symmetric start avoids being orthogonal to the top singular vector in structured cases
    start = torch.ones(cols, 1, dtype=U.dtype, device=U.device)
    start = start + torch.linspace(0.0, 1.0, cols, device=U.device).view(-1, 1)
    specs = []
    for m in U.unbind(0):
        gram = m.T @ m if cols <= rows else m @ m.T
        gram = gram / torch.linalg.matrix_norm(gram).clamp(min=1e-30)
        v = start if cols <= rows else m @ start
        products = iters if cols <= rows else iters - 1
        for k in range(products):
            v = gram @ v
            if k % 8 == 7 and k < products - 1 and float(v.norm()) < 1e-15:
                v = v / v.norm().clamp(min=1e-30)
        if cols > rows:
            v = m.T @ v
        specs.append((m @ v).norm() / v.norm().clamp(min=1e-30))
    return rms, torch.stack(specs)


def _as_matrix(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 else t.reshape(t.size(0), -1)


def _stack_like_batched(ortho: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-matrix NS outputs [r, c] as one [n, r, c] with the layout `_newton_schulz_batched` returns (for tall
    matrices the transpose of a contiguous [n, c, r]), so that reductions over it round as they do on that."""
    if ortho[0].size(0) > ortho[0].size(1):
        return torch.stack([o.T for o in ortho]).mT
    return torch.stack(ortho)


class Muon(Optimizer):
    """Drop-in for `torch.optim.Muon`, bit-identical for fp32 parameters. See the module docstring."""

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients=JORDAN_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        ns_dtype: torch.dtype = torch.bfloat16,
        adamw_betas: tuple[float, float] = (0.9, 0.999),
        adamw_eps: float = 1e-8,
        track_stats: bool = False,
    ):
        if isinstance(lr, torch.Tensor):
            if lr.numel() != 1:
                raise ValueError("Tensor lr must be 1-element")
            lr = float(lr)
        if not lr >= 0.0:
            raise ValueError(f"Learning rate should be >= 0 but is: {lr}")
        if not momentum >= 0.0:
            raise ValueError(f"momentum should be >= 0 but is: {momentum}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight decay should be >= 0 but is: {weight_decay}")
        if adjust_lr_fn is not None and adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(
                f"Adjust learning rate function {adjust_lr_fn} is not supported: use one of {ADJUST_LR_FNS}"
            )
        ns_dtype = ns_dtype_name(ns_dtype)
        resolve_coefficients(ns_coefficients, ns_steps)  # validate early
        defaults = dict(
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            nesterov=nesterov,
            ns_coefficients=ns_coefficients,
            eps=eps,
            ns_steps=ns_steps,
            adjust_lr_fn=adjust_lr_fn,
            ns_dtype=ns_dtype,
            adamw_betas=tuple(adamw_betas),
            adamw_eps=adamw_eps,
        )
        super().__init__(params, defaults)
        self.track_stats = track_stats
        self.last_stats: list[dict[str, float]] = []
        for group in self.param_groups:
            for p in group["params"]:
                check_muon_param(p)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_stats = []
        for group in self.param_groups:
            stats = muon_group_step(group, self.state, track_stats=self.track_stats)
            self.last_stats.append(stats)
        return loss


NS_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def ns_dtype_name(dtype) -> str:
    """The Newton-Schulz dtype as its name: param groups hold the name, which checkpoints (torch.save, and DCP's
    state dicts, which take no torch.dtype values) carry; a torch.dtype is accepted."""
    name = str(dtype).removeprefix("torch.")
    if name not in NS_DTYPES:
        raise ValueError(f"ns_dtype must be bfloat16, float32 or float64, got {dtype}")
    return name


def resolve_ns_dtype(name: str, device: torch.device | str) -> str:
    """A config's `ns_dtype` for parameters on `device`: "auto" is bfloat16 on CUDA and float32 anywhere else (a
    CPU's bf16 matmul is a slow reference loop without AVX512-BF16 or AMX); any other name is itself."""
    if name != "auto":
        return ns_dtype_name(name)
    return "bfloat16" if torch.device(device).type == "cuda" else "float32"


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: writes land in the DTensor); any other tensor as it is."""
    return t._local_tensor if isinstance(t, DTensor) else t


def _full(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The whole tensor of which `local` is this rank's shard laid out like `like` (all-gather); `local` itself when
    `like` is not a DTensor. Shape and stride are given, so shards of unequal size gather right."""
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(
        local, like.device_mesh, like.placements, run_check=False, shape=like.shape, stride=like.stride()
    ).full_tensor()


def _shard_of(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of a full tensor, by `like`'s placements (a local slice, no communication)."""
    if not isinstance(like, DTensor):
        return full
    return distribute_tensor(full, like.device_mesh, like.placements, src_data_rank=None).to_local()


def check_muon_param(p: torch.Tensor, name: str = "") -> None:
    label = f" {name!r}" if name else ""
    if p.dim() < 2:
        raise ValueError(
            f"Muon parameter{label} has shape {tuple(p.shape)}: Muon needs a matrix (>= 2 dims). "
            "A 1-D weight here is usually a flattened shard (FSDP1 / ZeRO-3); route it to AdamW "
            "or keep parameters unflattened."
        )
    if torch.is_complex(p):
        raise ValueError(f"Muon parameter{label} is complex; Muon supports real parameters only")


def _adamw_directions(
    params: list[torch.Tensor], grads: list[torch.Tensor], state: dict, group: dict
) -> list[torch.Tensor]:
    """The step direction AdamW would take on these gradients, m_hat / (sqrt(v_hat) + eps) (this rank's shard), its
    moments kept in the parameters' state under their own keys and advanced here."""
    beta1, beta2 = group.get("adamw_betas", (0.9, 0.999))
    eps = group.get("adamw_eps", 1e-8)
    out = []
    for p, g in zip(params, grads):
        st = state[p]
        if "adamw_exp_avg" not in st:  # laid out like the parameter (a DTensor when it is one), as AdamW's state
            st["adamw_step"] = torch.tensor(0.0, dtype=torch.float32)
            st["adamw_exp_avg"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
            st["adamw_exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32, memory_format=torch.preserve_format)
        st["adamw_step"] += 1
        t, m, v = float(st["adamw_step"]), _local(st["adamw_exp_avg"]), _local(st["adamw_exp_avg_sq"])
        g = g.float()
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        out.append((m / (1.0 - beta1**t)) / ((v / (1.0 - beta2**t)).sqrt() + eps))
    return out


def muon_group_step(group: dict, state: dict, *, track_stats: bool = False) -> dict[str, float]:
    """One Muon step on a parameter group, bucketed by shape (see the module docstring). Returns its stats."""
    lr, wd, mu = float(group["lr"]), group["weight_decay"], group["momentum"]
    coefficients, norm_scale = resolve_coefficients(group["ns_coefficients"], group["ns_steps"])

    buckets: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError("Muon does not support sparse gradients")
        check_muon_param(p)
        buckets[(tuple(p.shape), p.dtype, p.device)].append(p)

    sq_sum, count, spec_max = 0.0, 0, 0.0
    for (shape, _dtype, _device), params in buckets.items():
        grads = [_local(p.grad) for p in params]
        bufs = []
        for p in params:
            st = state[p]
            if "momentum_buffer" not in st:
                st["momentum_buffer"] = torch.zeros_like(
                    p, dtype=torch.promote_types(p.dtype, torch.float32), memory_format=torch.preserve_format
                )
            bufs.append(_local(st["momentum_buffer"]))
        if grads[0].dtype != bufs[0].dtype:
            grads = [g.to(bufs[0].dtype) for g in grads]
        torch._foreach_lerp_(bufs, grads, 1.0 - mu)
        updates = torch._foreach_lerp(grads, bufs, mu) if group["nesterov"] else bufs
        matrices = [_as_matrix(_full(u, p)) for u, p in zip(updates, params)]
        ns_dtype = NS_DTYPES[ns_dtype_name(group["ns_dtype"])]
        if ns_dtype == torch.bfloat16:
            # torch's per-matrix op sequence on the updates as they are (see _newton_schulz_matrix)
            ortho = [_newton_schulz_matrix(m, coefficients, group["eps"], norm_scale, torch.bfloat16) for m in matrices]
            stacked = None
        else:
            # torch.stack copies, so NS never sees the momentum buffers themselves
            stacked = _newton_schulz_batched(torch.stack(matrices), coefficients, group["eps"], norm_scale, ns_dtype)
            ortho = stacked.unbind(0)
        rows, cols = matrices[0].shape
        measured = group["adjust_lr_fn"] == "match_spectral_adamw"
        # RMS and top singular value of each orthogonalised update, for the measured rule and the stats alike
        rms, spec = (
            matrix_update_stats(_stack_like_batched(ortho) if stacked is None else stacked)
            if measured or track_stats
            else (None, None)
        )
        if measured:
            adamw = _adamw_directions(params, grads, state, group)
            target = matrix_update_stats(torch.stack([_as_matrix(_full(d, p)) for d, p in zip(adamw, params)]))[1]
            adjusted = [lr * float(t) / max(float(o), 1e-30) for t, o in zip(target, spec)]
        else:
            adjusted = [lr * lr_shape_factor(group["adjust_lr_fn"], rows, cols)] * len(params)
        if wd != 0:
            torch._foreach_mul_([_local(p) for p in params], 1.0 - lr * wd)
        for p, o, alpha in zip(params, ortho, adjusted):
            _local(p).add_(_shard_of(o.reshape(shape), p), alpha=-alpha)
        if track_stats:
            if len(set(adjusted)) == 1:
                sq_sum += float((rms * adjusted[0]).pow(2).sum()) * rows * cols
                spec_max = max(spec_max, float(spec.max()) * adjusted[0])
            else:
                scale = torch.tensor(adjusted, dtype=rms.dtype)
                sq_sum += float((rms * scale).pow(2).sum()) * rows * cols
                spec_max = max(spec_max, float((spec * scale).max()))
            count += rows * cols * len(params)
    if not track_stats or count == 0:
        return {}
    return {"update_rms": math.sqrt(sq_sum / count), "update_spectral_norm": spec_max}
