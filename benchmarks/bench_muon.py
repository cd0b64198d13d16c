"""One optimizer step: our Muon vs torch.optim.Muon vs torch.optim.AdamW, side by side.

    python benchmarks/bench_muon.py [--rounds 15] [--threads 1] [--json out.json]

Besides ours in bf16 (torch's default, the GPU setting) it times ours with Newton-Schulz in fp32 (`optim.ns_dtype`'s
"auto" on a CPU): on a CPU without AVX512-BF16 or AMX torch's bf16 matmul is a reference loop, so fp32 is many times
faster there (the `fp32/bf16` column).

Cases: (a) the hidden matrices of the embedded tiny models, (b) 8 matrices of 256x256, (c) the hidden matrices
of a 4-layer d=512 transformer (q, k, v, o, 4d up, 4d down per layer). Each round times every optimizer once on
the same gradients, in a rotating order; we report per-optimizer medians and the median of per-round ratios,
because this machine is shared and noisy. Before timing, ours and torch's run the same steps from the same
parameters and must agree bit-for-bit (max |diff| is printed): speed is only worth reporting at parity.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from trainer.optim.muon import Muon


def tiny_model_shapes() -> list[tuple[int, int]]:
    from trainer.optim.hybrid import route_parameters
    from trainer.policy.tiny import TINY_PRESETS, TinyModelSpec, build_tiny_model

    shapes = []
    for preset in TINY_PRESETS:
        model = build_tiny_model(TinyModelSpec(preset, vocab_size=96))
        shapes += [tuple(p.shape) for _, p in route_parameters(model).muon]
    return shapes


def transformer_shapes(d=512, layers=4) -> list[tuple[int, int]]:
    return [(d, d)] * 4 * layers + [(4 * d, d), (d, 4 * d)] * layers


CASES = {
    "a_tiny_models": tiny_model_shapes,
    "b_8x256x256": lambda: [(256, 256)] * 8,
    "c_4layer_d512": transformer_shapes,
}


def make(cls, shapes, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    params = [torch.randn(s, generator=g).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params, cls(params, **kw)


def parity(shapes, steps=3) -> float:
    a, ours = make(Muon, shapes, lr=0.02)
    b, ref = make(torch.optim.Muon, shapes, lr=0.02)
    for _ in range(steps):
        ours.step()
        ref.step()
    return max((x - y).abs().max().item() for x, y in zip(a, b))


def bench_case(shapes, rounds: int) -> dict:
    opts = {
        "ours_muon": make(Muon, shapes, lr=0.02)[1],
        "ours_muon_fp32": make(Muon, shapes, lr=0.02, ns_dtype=torch.float32)[1],
        "torch_muon": make(torch.optim.Muon, shapes, lr=0.02)[1],
        "torch_adamw": make(torch.optim.AdamW, shapes, lr=1e-3, foreach=True)[1],
    }
    names = list(opts)
    for opt in opts.values():  # warm-up
        opt.step()
    times = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            opts[n].step()
            times[n].append(time.perf_counter() - t0)
    ratio = lambda x, y: statistics.median(a / b for a, b in zip(times[x], times[y]))
    return {
        "n_matrices": len(shapes),
        "n_params": sum(r * c for r, c in shapes),
        **{f"{n}_ms": statistics.median(times[n]) * 1e3 for n in names},
        "ours/torch_muon": ratio("ours_muon", "torch_muon"),
        "fp32/bf16_ns": ratio("ours_muon_fp32", "ours_muon"),
        "ours/torch_adamw": ratio("ours_muon", "torch_adamw"),
        "torch_muon/torch_adamw": ratio("torch_muon", "torch_adamw"),
        "parity_max_abs_diff": parity(shapes),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results = {
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": args.threads,
        "rounds": args.rounds,
        "cases": {},
    }
    print(
        f"torch {torch.__version__}, {results['cpu_capability']}, {args.threads} thread(s), "
        f"{args.rounds} interleaved rounds; times are medians in ms"
    )
    header = (
        f"{'case':<16}{'mats':>5}{'ours':>9}{'ours fp32':>10}{'torch':>9}{'adamw':>8}{'ours/torch':>12}"
        f"{'fp32/bf16':>11}{'torch/adamw':>13}{'parity':>9}"
    )
    print(header)
    for name in args.cases:
        r = bench_case(CASES[name](), args.rounds)
        results["cases"][name] = r
        print(
            f"{name:<16}{r['n_matrices']:>5}{r['ours_muon_ms']:>9.2f}{r['ours_muon_fp32_ms']:>10.2f}"
            f"{r['torch_muon_ms']:>9.2f}{r['torch_adamw_ms']:>8.2f}{r['ours/torch_muon']:>12.2f}"
            f"{r['fp32/bf16_ns']:>11.3f}{r['torch_muon/torch_adamw']:>13.1f}{r['parity_max_abs_diff']:>9.1e}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
