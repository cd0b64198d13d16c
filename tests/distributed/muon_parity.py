"""Run under `torchrun --nproc-per-node N` (gloo, CPU; `--device cuda`: NCCL, one GPU per rank, the GPU check of
benchmarks/gpu_check_trainer.py --long-episodes): sharded Muon steps equal single-process steps bit for bit.

Every rank builds the same full parameters and gradients; the reference steps run on whole tensors in each rank,
the sharded ones on `distribute_tensor(..., [Shard(0)])` copies (FSDP2's layout), with rows that do not divide by
the world size. Exits non-zero (an AssertionError naming the case) on any difference.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from trainer.optim.hybrid import MuonAdamW
from trainer.optim.muon import Muon

SHAPES = [(7, 24), (33, 16), (64, 64), (96, 32), (24, 7), (64, 64)]
STEPS = 4


def _data(seed: int, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g).to(device) for s in SHAPES]
    grads = [[torch.randn(s, generator=g).to(device) for s in SHAPES] for _ in range(STEPS)]
    return params, grads


def _run(make, params, grads, mesh=None):
    """Parameters after STEPS steps of the optimizer `make(list_of_params)` (full tensors)."""
    shard = (lambda t: distribute_tensor(t.clone(), mesh, [Shard(0)])) if mesh is not None else torch.clone
    ps = [torch.nn.Parameter(shard(p)) for p in params]
    opt = make(ps)
    for step_grads in grads:
        for p, g in zip(ps, step_grads):
            p.grad = shard(g)
        opt.step()
    return [p.full_tensor() if mesh is not None else p.detach() for p in ps]


def _same(name, got, want):
    for i, (a, b) in enumerate(zip(got, want)):
        assert torch.equal(a, b), f"{name}: parameter {i} {tuple(b.shape)} differs by {(a - b).abs().max().item():.3g}"


def main() -> int:
    device = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if device == "cuda" else "gloo")
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    for seed in (0, 1):
        params, grads = _data(seed, device)
        for wd in (0.0, 0.1):
            want = _run(lambda ps, wd=wd: torch.optim.Muon(ps, lr=0.02, weight_decay=wd), params, grads)
            _same(
                f"bf16 NS vs torch.optim.Muon (seed {seed}, wd {wd})",
                _run(lambda ps, wd=wd: Muon(ps, lr=0.02, weight_decay=wd), params, grads, mesh),
                want,
            )
        for adjust in (None, "match_rms_adamw", "spectral", "match_spectral_adamw"):
            make = lambda ps, adjust=adjust: Muon(
                ps,
                lr=0.02,
                weight_decay=0.1,
                ns_dtype=torch.float32,
                adjust_lr_fn=adjust,
                nesterov=False,
            )
            _same(
                f"fp32 NS, adjust_lr_fn {adjust} (seed {seed})",
                _run(make, params, grads, mesh),
                _run(make, params, grads),
            )

        def hybrid(ps):
            return MuonAdamW(
                [
                    dict(params=ps[:4], use_muon=True, lr=0.02),
                    dict(params=ps[4:], use_muon=False, lr=1e-3, weight_decay=0.01),
                ]
            )

        _same(f"MuonAdamW (seed {seed})", _run(hybrid, params, grads, mesh), _run(hybrid, params, grads))
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"muon parity OK on {dist.get_world_size()} ranks")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
