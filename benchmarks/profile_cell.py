"""Where one grid cell's time goes: its wall time split into phases, each beside its arithmetic lower bound.

    python benchmarks/profile_cell.py --policy results/policies/qwen-tiny [--study config.yaml] [--recipe full]
                                      [--updates 100] [--flop-updates 3] [--json OUT]

The cell config is the workflow's (as in bench_cell.py); the trainer runs in this process, one thread, with timers
wrapped around the functions that make up a phase (no change to the trainer, and the run's logged numbers are the
same as without them). A phase's time is exclusive: the time of the phases it calls is theirs, so the rows add up
to the loop's wall time. Phases are named by where they run: `rollout/decode` is a decode pass of the training
rollouts, `evaluate/decode` one of the held-out evaluations, `update/forward` the update's forward passes with
gradients, `update/old_logp` its no-grad pass, `spo/forward` SPO's re-scoring of the batch after the update.

The lower bound of a phase is its FLOPs (counted by torch's FlopCounterMode over `--flop-updates` updates of a
second run, matmuls and attention as they run, so the LM head and the attention count as executed) divided by
this machine's fp32 matmul rate at the model's shape (measured in this process: [rows x d] @ [d x 4d] with the
rows a phase feeds). Elementwise work is not counted: the bound says how far a phase is from being matmul-bound.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from trainer.config import config_from_dict  # noqa: E402
from trainer.study import RECIPE_OPTIMIZER, CellKey, Study  # noqa: E402


class PhaseTimer:
    """Exclusive wall time (and counted FLOPs, when a FlopCounterMode is set) per phase path, and call counts."""

    def __init__(self):
        self.stack: list[str] = []
        self.seconds: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.counter: FlopCounterMode | None = None
        self._mark = time.perf_counter()
        self._flop_mark = 0

    def _charge(self) -> None:
        now = time.perf_counter()
        path = "/".join(self.stack) if self.stack else "loop"
        self.seconds[path] += now - self._mark
        self._mark = now
        if self.counter is not None:
            total = self.counter.get_total_flops()
            self.flops[path] += total - self._flop_mark
            self._flop_mark = total

    @contextlib.contextmanager
    def phase(self, name: str):
        self._charge()
        self.stack.append(name)
        self.calls["/".join(self.stack)] += 1
        try:
            yield
        finally:
            self._charge()
            self.stack.pop()

    def wrap(self, owner, attr: str, name, restore: list) -> None:
        """Replace owner.attr by a timed version; `name` is a phase name or a function of the call's arguments."""
        original = getattr(owner, attr)
        restore.append((owner, attr, original))
        timer = self

        @functools.wraps(original)
        def timed(*args, **kwargs):
            with timer.phase(name(*args, **kwargs) if callable(name) else name):
                return original(*args, **kwargs)

        setattr(owner, attr, timed)


def _forward_kind(self, cache, chunks, starts, rows):
    return "decode" if max(len(c) for c in chunks) == 1 else "prefill"


def _logprob_kind(*args, **kwargs):
    return "forward" if torch.is_grad_enabled() else "old_logp"


def instrument(timer: PhaseTimer) -> list:
    """Wrap the trainer's phase functions; returns what to restore."""
    import trainer.logs.parquet_log as parquet_log
    import trainer.rollout.hf_engine as hf_engine
    import trainer.train as train
    import trainer.update as update
    from trainer.optim.hybrid import MuonAdamW
    from trainer.rl import estimators

    restore: list = []
    w = functools.partial(timer.wrap, restore=restore)
    w(train.Trainer, "train_step", "step")
    w(train.Trainer, "evaluate_heldout", "evaluate")
    w(train.Trainer, "checkpoint", "checkpoint")
    w(train.Trainer, "_publish", "publish")
    w(train, "episode_row", "logging")
    w(train, "update_row", "logging")
    w(parquet_log.MetricsLog, "flush", "logging")
    w(train.RolloutDriver, "next_batch", "rollout")
    w(hf_engine.HFEngine, "_forward", _forward_kind)
    w(hf_engine.HFEngine, "_forward_whole", "prefill")
    w(hf_engine, "sample_tokens", "sample")
    w(hf_engine, "end_actions", "env")
    w(train, "pad_episodes", "batching")
    w(train, "policy_update", "update")
    w(update, "token_logprobs", _logprob_kind)
    w(update, "policy_loss", "loss")
    w(update, "matrix_update_stats", "diagnostics")
    w(torch.nn.utils, "clip_grad_norm_", "clip")
    w(torch.Tensor, "backward", "backward")
    for cls in (torch.optim.AdamW, MuonAdamW):  # each optimizer class has its own step
        w(cls, "step", "optimizer")
    for cls in (estimators.SPOEstimator, estimators.GroupEstimator):
        w(cls, "advantages", "advantages")
        w(cls, "after_update", "spo")
        w(cls, "before_update", "spo")
    return restore


def uninstrument(restore: list) -> None:
    for owner, attr, original in reversed(restore):
        setattr(owner, attr, original)


def matmul_rate(rows: int, d: int, reps: int = 50) -> float:
    """fp32 FLOP/s of [rows x d] @ [d x 4d], one thread (the shapes a forward pass multiplies)."""
    a, b = torch.randn(rows, d), torch.randn(d, 4 * d)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        best = min(best, (time.perf_counter() - t) / reps)
    return 2 * rows * d * 4 * d / best


def run_cell(cfg_dict: dict, out: Path, timer: PhaseTimer, count_flops: bool) -> float:
    from trainer.train import Trainer

    restore = instrument(timer)
    try:
        t0 = time.perf_counter()
        trainer = Trainer(config_from_dict(cfg_dict), out)
        startup = time.perf_counter() - t0
        timer._mark = time.perf_counter()
        with FlopCounterMode(display=False) if count_flops else contextlib.nullcontext() as counter:
            timer.counter = counter
            trainer.run(progress=False)
            timer._charge()
    finally:
        uninstrument(restore)
    return startup


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="warm-started base policy directory")
    ap.add_argument("--study", default=str(ROOT / "config.yaml"))
    ap.add_argument("--recipe", default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--updates", type=int, default=100)
    ap.add_argument("--flop-updates", type=int, default=3, help="updates of the FLOP-counting run (0: none)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    study = Study.load(yaml.safe_load(Path(args.study).read_text()), root=ROOT, source=args.study)
    model = Path(args.policy).resolve().name
    if model not in study.config.models:
        sys.exit(f"--policy {args.policy}: {model!r} is not a model of {args.study} ({sorted(study.config.models)})")
    key = CellKey(model, args.recipe, RECIPE_OPTIMIZER[args.recipe], args.seed)
    cfg = study.cell_config(key, model_path=str(Path(args.policy).resolve()))
    cfg["run"].update(updates=args.updates, threads=1)
    timer = PhaseTimer()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        startup = run_cell(cfg, Path(tmp, "timed"), timer, count_flops=False)
        wall = time.perf_counter() - t0
        flop_timer = PhaseTimer()
        if args.flop_updates:
            short = {
                **cfg,
                "run": {
                    **cfg["run"],
                    "updates": args.flop_updates,
                    "eval_every": args.flop_updates,
                    "checkpoint_every": 0,
                },
            }
            run_cell(short, Path(tmp, "flops"), flop_timer, count_flops=True)
    from trainer.policy.load import load_policy

    d = int(load_policy(args.policy, "float32")[0].config.hidden_size)
    rates = {"decode": matmul_rate(cfg["rollout"]["batch_size"], d), "other": matmul_rate(512, d)}
    rows = []
    for path in sorted(timer.seconds, key=lambda p: -timer.seconds[p]):
        leaf = path.rsplit("/", 1)[-1]
        flops_run = flop_timer.calls.get(path, 0)
        # FLOPs per call from the short run, times this run's calls: a per-call average
        per_call = flop_timer.flops.get(path, 0.0) / flops_run if flops_run else 0.0
        flops = per_call * timer.calls.get(path, 0)
        rate = rates["decode"] if leaf == "decode" else rates["other"]
        bound = flops / rate if flops else 0.0
        rows.append(
            {
                "phase": path,
                "seconds": round(timer.seconds[path], 2),
                "per_update_ms": round(1000 * timer.seconds[path] / args.updates, 2),
                "share": round(timer.seconds[path] / wall, 4),
                "calls": timer.calls.get(path, 0),
                "gflop": round(flops / 1e9, 2),
                "bound_s": round(bound, 2),
                "x_bound": round(timer.seconds[path] / bound, 1) if bound > 0 else None,
            }
        )
    print(
        f"cell {model} / {args.recipe} / seed {args.seed}: {args.updates} updates in {wall:.1f} s "
        f"(start-up {startup:.1f} s); fp32 matmul rate {rates['decode'] / 1e9:.0f} GFLOP/s at "
        f"{cfg['rollout']['batch_size']} rows, {rates['other'] / 1e9:.0f} at 512 rows (d={d})"
    )
    header = (
        f"{'phase':34s} {'s':>8s} {'ms/upd':>8s} {'share':>6s} {'calls':>7s} {'GFLOP':>7s} {'bound s':>8s} {'x':>6s}"
    )
    print(header)
    for r in rows:
        x = f"{r['x_bound']:.1f}" if r["x_bound"] is not None else "-"
        print(
            f"{r['phase']:34s} {r['seconds']:8.2f} {r['per_update_ms']:8.2f} {r['share']:6.1%} {r['calls']:7d} "
            f"{r['gflop']:7.2f} {r['bound_s']:8.2f} {x:>6s}"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"wall_s": wall, "startup_s": startup, "rows": rows, "matmul_rates": rates}, indent=1)
        )


if __name__ == "__main__":
    main()
