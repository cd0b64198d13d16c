"""The `optim` section: which optimizer trains a cell (or a warm start) and its settings, the learning rates named by
role (`lr` for what AdamW trains, `matrix_lr` for the hidden matrices Muon trains). Built into an optimizer by
`trainer.optim.build.build_optimizer`; torch-free, so the workflow reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.knobs import Section, knob


@dataclass
class OptimConfig(Section):
    """The optimizer of a cell, its learning rates named by the parameters they move."""

    name: Literal["muon", "adam", "adam_high_lr"] = "muon"
    """"muon": Muon on the hidden matrices (at `matrix_lr`) and AdamW on the rest (at `lr`). "adam": AdamW on
    everything: the hidden matrices at `matrix_lr`, the rest at `lr`. "adam_high_lr": the same AdamW under a label of its own, the companion paper's control (is
    Muon's gain only its larger step size?): a study runs it at its Muon cells' lr (trainer/study/cells.py Study.cell_lrs), and
    the label keeps it apart from the plain AdamW cells in the grid."""
    lr: float = knob(1e-3, ge=0)
    """The learning rate of the embeddings, head and norms (AdamW-trained under every optimizer), and of the hidden
    matrices too where `matrix_lr` is None."""
    matrix_lr: float | None = knob(None, ge=0)
    """The learning rate of the hidden matrices (the ones Muon trains under "muon"; AdamW's under "adam" and
    "adam_high_lr", so either optimizer can move them faster than the rest). Left out: `lr`, set when the section
    is built, so every reader sees the rate itself (Moonlight's rule: with `adjust_lr_fn: match_rms_adamw` one
    number then means a step of the same RMS under both optimizers)."""
    weight_decay: float = knob(0.0, ge=0)
    """AdamW decoupled weight decay."""
    muon_weight_decay: float = knob(0.0, ge=0)
    """Muon decoupled weight decay (uses the unadjusted lr)."""
    betas: tuple[float, float] = knob((0.9, 0.95), ge=0, lt=1)
    """AdamW's (beta1, beta2), on every parameter under "adam" and on embeddings, head and norms under "muon".
    0.95 (the project's default) forgets a gradient spike's second moment within ~20 steps; verl's actor and
    torch's default is 0.999, under which a spike after a quiet stretch is divided by a stale, small moment."""
    eps: float = knob(1e-8, gt=0)
    """AdamW's epsilon, added to the root of the second moment (torch's default): where gradients are smaller than
    it, AdamW's step shrinks below lr instead of normalising to it."""
    momentum: float = knob(0.95, ge=0, lt=1)
    nesterov: bool = True
    ns_coefficients: str = "jordan"
    """"jordan" (torch's default) or "polar_express"."""
    adjust_lr_fn: Literal["original", "match_rms_adamw", "spectral", "match_spectral_adamw"] = "match_rms_adamw"
    """How Muon scales its orthogonalised update by the matrix shape. "match_rms_adamw" (Moonlight): RMS 0.2 x lr,
    AdamW's typical update RMS, so one lr means the same step size under both optimizers: the project's rule at
    every scale. "original" (torch's default): lr x sqrt(max(1, rows/cols)), an RMS of about lr/sqrt(cols), which
    makes Muon's steps at a given lr several times smaller than AdamW's; "spectral": spectral norm lr x
    sqrt(rows/cols); "match_spectral_adamw": each matrix's step gets the top singular value of the step AdamW (with
    `betas` and `eps`) would take on the same gradients at lr, measured every step (its moments kept beside
    Muon's), so the optimizers are matched in spectral norm, not RMS (at equal RMS AdamW's top singular value is
    several times Muon's)."""
    grad_clip: float | None = knob(1.0, gt=0)
    """Clip the global norm of the raw gradients (never Muon's orthogonalised update); None: off."""
    ns_dtype: Literal["auto", "bfloat16", "float32", "float64"] = "auto"
    """Precision of Muon's Newton-Schulz iteration. "auto": bfloat16 where the parameters live on CUDA (the papers'
    and torch's choice), float32 anywhere else: on a CPU torch's bf16 matmul is a reference loop unless the CPU has
    AVX512-BF16 or AMX (one qwen-tiny step: 1,124 ms in bf16 vs 54 ms in fp32 on an AVX2 EPYC), and where one
    precision for every CPU keeps a study's numbers independent of which kind of CPU ran it."""

    def validate(self) -> None:
        super().validate()
        if self.matrix_lr is None:  # the one place where a left-out matrix_lr becomes a rate (set once: a later
            self.matrix_lr = self.lr  # change of lr leaves it as it is)


@dataclass
class WarmStartOptimConfig(OptimConfig):
    """The warm start's optimizer: the same section with the defaults the embedded studies' warm starts ran. Muon
    on the hidden matrices at 0.02 (torch's default shape rule, decay 0.1), AdamW on the rest at 3e-3 (torch's
    betas): it reached AdamW's 750-step cloning loss in about 200 steps in our warm-start runs. `name: adam` gives
    an AdamW-trained base policy, as the papers' checkpoints are (the studies' AdamW warm starts name their
    matrix rate, 3.0e-3). Independent of the RL cells' optimizer."""

    lr: float = knob(3e-3, gt=0)
    matrix_lr: float | None = knob(None, gt=0)
    """Left out: 0.02 under "muon" (Muon's rate), `lr` under "adam" (AdamW's matrices move with the rest)."""
    muon_weight_decay: float = knob(0.1, ge=0)
    betas: tuple[float, float] = knob((0.9, 0.999), ge=0, lt=1)
    adjust_lr_fn: Literal["original", "match_rms_adamw", "spectral", "match_spectral_adamw"] = "original"

    def validate(self) -> None:
        if self.matrix_lr is None:
            self.matrix_lr = 0.02 if self.name == "muon" else self.lr
        super().validate()
