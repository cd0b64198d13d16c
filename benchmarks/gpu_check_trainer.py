"""One prepared check of the trainer on a CUDA GPU (`run.device: cuda`): the paper-scale path, vLLM aside.

    python benchmarks/gpu_check_trainer.py [--out result.json] [--updates 5] [--keep DIR] [--memory-probe [SHAPE ...]]
                                            [--long-episodes] [--skip-trainer] [--device cpu] [--shape small]

It downloads nothing and needs no vLLM (benchmarks/gpu_check_vllm.py checks that engine). It

1. steps `trainer.optim.muon.Muon` and `torch.optim.Muon` side by side on the GPU, fp32 and bf16 parameters, and
   compares the parameters after 5 steps with torch's and with ours on the CPU (thresholds below), and checks the
   singular values of one orthogonalised update by an fp64 SVD;
2. writes a checkpoint of the Qwen3 family as released (`--shape`, default Qwen3-0.6B's widths and depth; random
   weights saved in bf16; the family's tokenizer layout and Qwen's own chat template, trainer/policy/standins.py),
   which the cells load with the shipped `qwen3-stable` template, as configs/paper.yaml loads Qwen3.5-4B;
3. builds a cell config as the workflow does (trainer/study/; paper-like settings: fp32 master
   weights, bf16 compute, lagged or async rollouts, but the HF engine for vLLM, minirepo for swe, lr 1e-5) and runs
   `python -m trainer train` on it on the GPU, recipe no_tool: with Muon in lagged mode with checkpoints, and with
   Adam in async mode (a rollout thread beside the updates on the same device); every update must be logged,
   finite, and move the weights, and the rollouts' staleness must be the mode's (lagged: one update; async: at
   most max_staleness);
4. deletes the newest checkpoint of the lagged run (none is written after the last update), resumes a copy of it
   (`--resume`), and checks that the resumed run logs every update; on CPU its logs must equal the uninterrupted
   run's, on a GPU that is reported only (non-deterministic kernels may change a sampled token);
5. with `--memory-probe`, measures the peak GPU memory of one trainer micro-batch of real-size models (Qwen3-4B's
   and Qwen2.5-0.5B's shapes, random weights): fp32 master weights, bf16 autocast, backward and a Muon+AdamW step,
   from 2k tokens up to 64k or the first that does not fit;
6. with `--long-episodes`, runs the paper configuration's update (activation checkpointing, a 2,048-position
   head, flash attention) for the 4B shape at 8k/16k/32k tokens beside the memory planner's prediction, and
   sharded Muon against torch.optim.Muon over NCCL when 2 or more GPUs are visible;
7. prints one JSON line with every check, its value, threshold and PASS or FAIL (also written to `--out`).

`--device cpu` is a dry run of the script itself (every check but the memory probe, on the CPU), not a GPU result.
Exit status 0 PASS, 1 FAIL, 2 the check itself crashed (no GPU, an exception).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.policy.standins import FAMILIES  # noqa: E402
from trainer.study import CellKey, Study, write_yaml  # noqa: E402

QWEN3_OWN_TEMPLATE = ROOT / "tests" / "data" / "templates" / "qwen3.jinja"
"""Qwen3's chat template as its checkpoints ship it: the check's checkpoint carries it, the cell replaces it."""
MUON_VS_TORCH = {torch.float32: 1e-3, torch.bfloat16: 5e-2}
"""Largest allowed ||ours - torch.optim.Muon|| / ||how far torch's parameters moved|| after 5 steps. fp32: 0 on
CPU. bf16: 0.011-0.020 on CPU, by design: our momentum buffer is fp32, torch's has the parameter's dtype."""
MUON_VS_CPU = {torch.float32: 1e-2, torch.bfloat16: 5e-2}
"""The same, ours on the GPU against ours on the CPU (Newton-Schulz in bf16 on another device's kernels). First set
at 1e-2 for both; an H200 measured 0.004 (fp32) and 0.015 (bf16). bf16 parameters are rounded after every step,
and here a step is only a few bf16 spacings of a weight, so one rounding flip is a sizeable share of that weight's
move: bf16 gets the bf16-level threshold of MUON_VS_TORCH."""
SINGULAR_BAND = (0.5, 1.5)
"""One orthogonalised update's singular values (lr factor removed) must lie here (Jordan's quintic: ~0.7-1.2)."""
STUDY_CELL = {  # the paper's cell settings (configs/paper.yaml) at a size one GPU runs in seconds, HF engine
    "model": {"dtype": "float32"},  # master weights; the checkpoint on disk is bf16, as the real ones are
    # (the checkpoint's template: models.NAME.model_options below, as configs/paper.yaml gives it)
    "env": {
        "name": "minirepo",
        "options": {"seed": 0, "max_depth": 0, "max_turns": 6, "bug_kinds": ["op"]},
        "eval_tasks": 8,
    },
    "optim": {"lr": 1.0e-5, "matrix_lr": 1.0e-5, "adjust_lr_fn": "match_rms_adamw"},
    "shaping": {"length_threshold": 24},
    "rollout": {"engine": "hf", "batch_size": 8, "max_turn_tokens": 32, "max_episode_tokens": 2048},
    "run": {"eval_every": 2, "checkpoint_every": 2, "compute_dtype": "bfloat16", "device": "cuda"},
}
TIMING = ["rollout_s", "train_s", "wall_s"]
STOP_PROBABILITY = 0.05
"""Per-token probability of the end-of-turn token in the random policy: actions of varied length."""
DEVICE = "cuda"
"""`--device cpu` runs the same checks on CPU: a dry run of this script, not a GPU result."""


def check(results: list, name: str, value, ok: bool, threshold) -> None:
    results.append({"check": name, "value": value, "threshold": threshold, "ok": bool(ok)})
    print(f"{'PASS' if ok else 'FAIL'} {name}: {value} (threshold {threshold})", flush=True)


def _muon_steps(opt_cls, base: list, grads: list, device: str, kw: dict) -> list:
    params = [b.clone().to(device).requires_grad_() for b in base]
    opt = opt_cls(params, **kw)
    for step_grads in grads:
        for p, grad in zip(params, step_grads):
            p.grad = grad.to(device)
        opt.step()
    return [p.detach().cpu().float() for p in params]


def muon_checks(results: list) -> None:
    from trainer.optim.muon import Muon

    shapes = [(512, 512), (512, 512), (384, 1024), (1024, 384), (7, 5)]
    kw = dict(lr=0.02, weight_decay=0.01, momentum=0.95, nesterov=True, adjust_lr_fn="original")
    for dtype in (torch.float32, torch.bfloat16):
        g = torch.Generator().manual_seed(0)  # inputs drawn on the CPU: every run sees the same numbers
        base = [(0.02 * torch.randn(s, generator=g)).to(dtype) for s in shapes]
        grads = [[torch.randn(s, generator=g).to(dtype) for s in shapes] for _ in range(5)]
        ours = _muon_steps(Muon, base, grads, DEVICE, kw)
        ref = _muon_steps(torch.optim.Muon, base, grads, DEVICE, kw)
        ours_cpu = _muon_steps(Muon, base, grads, "cpu", kw)
        name = str(dtype).removeprefix("torch.")
        for label, other, limit in (("vs_torch", ref, MUON_VS_TORCH[dtype]), ("vs_cpu", ours_cpu, MUON_VS_CPU[dtype])):
            worst = max(((a - b).norm() / (b - b0.float()).norm()).item() for a, b, b0 in zip(ours, other, base))
            check(results, f"muon_{label}_rel_diff_{name}", worst, worst <= limit, limit)
        results.append(
            {
                "check": f"muon_vs_torch_bit_identical_{name}",
                "ok": True,
                "threshold": "reported",
                "value": all(torch.equal(a, b) for a, b in zip(ours, ref)),
            }
        )
    # One step from zero momentum: the update is -lr * factor * NS(g); its singular values, by SVD in fp64.
    p = torch.zeros(384, 1024, device=DEVICE, requires_grad=True)
    p.grad = torch.randn(384, 1024, device=DEVICE, generator=torch.Generator(device=DEVICE).manual_seed(1))
    opt = Muon([p], lr=1.0, momentum=0.0, nesterov=False, adjust_lr_fn="original", weight_decay=0.0)
    opt.step()
    factor = max(1.0, 384 / 1024) ** 0.5  # torch's "original": sqrt(max(1, rows / cols))
    s = torch.linalg.svdvals((-p.detach() / factor).double().cpu())
    check(
        results,
        "muon_update_singular_values",
        [round(s.min().item(), 3), round(s.max().item(), 3)],
        SINGULAR_BAND[0] <= s.min().item() and s.max().item() <= SINGULAR_BAND[1],
        SINGULAR_BAND,
    )


def write_checkpoint(directory: Path, shape: str) -> int:
    """A Qwen3 checkpoint as released (trainer/policy/standins.py: the family's config at `shape`, its tokenizer
    layout, Qwen's own chat template, random bf16 weights); returns its parameter count. The cell loads it with the
    shipped `qwen3-stable` template, as configs/paper.yaml loads Qwen3.5-4B."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.config import EnvConfig
    from trainer.environments.suite import make_suite
    from trainer.policy.standins import write_standin_checkpoint

    texts = make_suite(EnvConfig(**STUDY_CELL["env"])).sample_texts()
    write_standin_checkpoint("qwen3", directory, texts, chat_template=QWEN3_OWN_TEMPLATE.read_text(), shape=shape)
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    with torch.no_grad():
        # Random weights never stop an action (1 token in 1,024), so every turn would be cut at the same length and
        # every advantage would be equal (zero after standardisation): no update could be seen. The stop token's
        # output row is set along the mean hidden direction so that it takes ~5% of the mass per token.
        stream = [i for text in texts for i in tok.encode(text)][: 32 * 64]
        hidden = model.model(input_ids=torch.tensor(stream).reshape(-1, 64)).last_hidden_state.flatten(0, 1)
        stop = tok.convert_tokens_to_ids("<|im_end|>")
        weight = model.lm_head.weight
        logits = hidden @ weight.T
        others = torch.logsumexp(torch.cat([logits[:, :stop], logits[:, stop + 1 :]], 1), -1)
        direction = hidden.mean(0) / hidden.mean(0).norm()
        lo, hi = 0.0, 1000.0
        for _ in range(50):
            scale = (lo + hi) / 2
            p_stop = torch.sigmoid(scale * (hidden @ direction) - others).mean()
            lo, hi = (scale, hi) if p_stop < STOP_PROBABILITY else (lo, scale)
        weight[stop] = scale * direction
    model.to(torch.bfloat16).save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def run_cell(config: Path, out: Path, resume: bool) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "trainer", "train", "--config", str(config), "--out", str(out), "--no-progress"]
    proc = subprocess.run(
        cmd + (["--resume"] if resume else []),
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    print(proc.stdout[-2000:], proc.stderr[-4000:], sep="\n", flush=True)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
    return time.perf_counter() - t0


def trainer_checks(results: list, work: Path, updates: int, shape: str) -> None:
    ckpt = work / "checkpoint"
    n_params = write_checkpoint(ckpt, shape)
    results.append(
        {"check": "checkpoint_parameters", "value": n_params, "ok": True, "threshold": f"reported ({shape})"}
    )
    entry = {"path": str(ckpt), "model_options": {"chat_template": "qwen3-stable"}}
    study = {"models": {"gpu-qwen3": entry}, "cell": json.loads(json.dumps(STUDY_CELL))}
    study["cell"]["run"]["updates"] = updates
    study["grid"] = [{"recipes": ["no_tool"], "optimizer": name, "seeds": [0]} for name in ("muon", "adam")]
    study = Study.load(study, root=work)
    runs = {}
    # Recipe no_tool: a random policy's every action is invalid, so the tool penalty is the same on every turn; the
    # length penalty varies with the actions' lengths and gives the advantages a spread.
    for name, optimizer, mode in (("muon_lagged", "muon", "lagged"), ("adam_async", "adam", "async")):
        cfg = study.cell_config(CellKey("gpu-qwen3", "no_tool", optimizer, 0))
        cfg["rollout"]["mode"] = mode
        write_yaml(cfg, work / f"{name}.yaml")
        wall = run_cell(work / f"{name}.yaml", work / name, resume=False)
        m = pd.read_parquet(work / name / "metrics.parquet")
        runs[name] = m
        results.append({"check": f"{name}_wall_s", "value": round(wall, 1), "ok": True, "threshold": "reported"})
        check(results, f"{name}_updates_logged", len(m), list(m["update"]) == list(range(updates)), updates)
        finite = bool(
            m[["loss", "grad_norm", "entropy"]].notna().all().all()
            and m[["loss", "grad_norm"]].abs().lt(float("inf")).all().all()
        )
        check(results, f"{name}_loss_and_grad_finite", finite, finite, True)
        rms = m["update_rms"]
        check(results, f"{name}_min_update_rms", float(rms.min()), bool(rms.gt(0).all()), "> 0 at every update")
        staleness = [round(float(s), 2) for s in m["staleness_mean"]]
        if mode == "lagged":  # lag 1: the first batch comes from version 0, every later one is one update old
            check(results, f"{name}_staleness_mean", staleness, staleness == [0.0] + [1.0] * (updates - 1), "0, then 1")
        else:
            limit = cfg["rollout"].get("max_staleness", 4)
            check(
                results,
                f"{name}_staleness_max",
                int(m["staleness_max"].max()),
                bool(m["staleness_max"].le(limit).all()),
                f"<= max_staleness {limit}",
            )
            results.append({"check": f"{name}_staleness_mean", "value": staleness, "ok": True, "threshold": "reported"})
        check(
            results,
            f"{name}_heldout_evaluated",
            int(m["eval_success"].notna().sum()),
            m["eval_success"].notna().any(),
            ">= 1",
        )
        results.append(
            {
                "check": f"{name}_s_per_update",
                "value": [round(float(m[c].mean()), 3) for c in ("rollout_s", "train_s")],
                "ok": True,
                "threshold": "reported (rollout_s, train_s)",
            }
        )

    # Resume: drop the newest checkpoint of the lagged run and continue from the one before it.
    resumed = work / "muon_lagged_resumed"
    shutil.copytree(work / "muon_lagged", resumed)
    ckpts = sorted((resumed / "checkpoints").glob("ckpt-*.pt"))
    check(results, "checkpoints_written", len(ckpts), len(ckpts) >= 2, ">= 2")
    ckpts[-1].unlink()
    run_cell(work / "muon_lagged.yaml", resumed, resume=True)
    m = pd.read_parquet(resumed / "metrics.parquet")
    check(results, "resumed_updates_logged", len(m), list(m["update"]) == list(range(updates)), updates)
    a, b = runs["muon_lagged"].drop(columns=TIMING), m.drop(columns=TIMING)
    same = a.shape == b.shape and bool(((a == b) | (a.isna() & b.isna())).all().all())
    if DEVICE == "cpu":  # bit-identical resumes are the trainer's promise on CPU (tests/integration/test_train.py)
        check(results, "resumed_logs_equal_uninterrupted", same, same, True)
    else:  # non-deterministic GPU kernels may change a sampled token, and everything after it
        results.append(
            {
                "check": "resumed_logs_equal_uninterrupted",
                "value": same,
                "ok": True,
                "threshold": "reported (required on CPU)",
            }
        )


PROBE_SHAPES = {
    "qwen3-4b": (
        "qwen3",
        dict(
            vocab_size=151936,
            **FAMILIES["qwen3"]["real"]["Qwen3-4B"],
            tie_word_embeddings=True,
            max_position_embeddings=65536,
        ),
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=24,
            num_attention_heads=14,
            num_key_value_heads=2,
            tie_word_embeddings=True,
            max_position_embeddings=65536,
        ),
    ),
}
"""Published shapes: Qwen3-4B stands in for configs/paper.yaml's 4B policy (Qwen3.5-4B's hybrid attention is not
modelled), Qwen2.5-0.5B is configs/companion-paper.yaml's own."""


def memory_probe(results: list, shape: str, token_counts=(2048, 4096, 8192, 16384, 32768, 65536)) -> None:
    """Peak GPU memory of one trainer micro-batch of a real-size model: fp32 master weights, bf16 autocast, the
    trainer's log-prob path (`token_logprobs`, fp32 log-softmax over the vocabulary), backward, and a Muon+AdamW step.
    Peak allocated and reserved bytes of this process alone (no vLLM beside it, no CUDA context counted): the
    budget `run.micro_batch_tokens` and vLLM's share must fit in together. Reported, not required."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.optim.hybrid import build_muon_adamw
    from trainer.update import ForwardSettings, token_logprobs

    model_type, dims = PROBE_SHAPES[shape]
    cfg = AutoConfig.for_model(model_type, **dims)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    opt = build_muon_adamw(model, matrix_lr=1e-6, lr=1e-6, adjust_lr_fn="match_rms_adamw")
    n_params = sum(p.numel() for p in model.parameters())
    peaks = {}
    for n in token_counts:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, cfg.vocab_size, (1, n), device=DEVICE)
        batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids))
        try:
            t0 = time.perf_counter()
            out = token_logprobs(
                model, batch, 1.0, with_entropy=True, forward=ForwardSettings(autocast_dtype=torch.bfloat16)
            )
            logp = out[0]
            logp.mean().backward()
            opt.step()
            torch.cuda.synchronize()
            peaks[n] = {
                "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
                "reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 1),
                "seconds": round(time.perf_counter() - t0, 2),
            }
        except torch.cuda.OutOfMemoryError:
            peaks[n] = "out of memory"
            break
        finally:
            logp = out = None  # the entropy too, before the next size
    results.append(
        {
            "check": f"memory_probe_{shape}",
            "ok": True,
            "threshold": "reported",
            "value": {
                "parameters": n_params,
                "gpu_total_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1),
                "per_micro_batch_tokens": peaks,
            },
        }
    )
    print("memory probe:", results[-1]["value"], flush=True)
    del model, opt
    torch.cuda.empty_cache()


PLAN_UNDER_PREDICTION = 1.25
"""Long-episode probe: the measured peak may exceed the planner's prediction by at most this factor (set before any
GPU measurement of this setting; over-prediction only wastes memory, under-prediction runs a cell out of it)."""


def long_episode_probe(
    results: list, shape: str = "qwen3-4b", token_counts=(8192, 16384, 32768), chunk: int = 2048
) -> None:
    """One update micro-batch as configs/paper.yaml runs it on one GPU: fp32 master weights, bf16 autocast, each
    decoder layer recomputed in the backward pass, the LM head over `chunk`-position chunks, flash attention
    required, a Muon+AdamW step; peak allocated memory beside `python -m trainer plan`'s prediction. Fails if a size
    the planner says fits runs out of memory, or the peak exceeds the prediction by more than PLAN_UNDER_PREDICTION.
    On CPU (`--device cpu`) a tiny shape at a few hundred tokens checks the script only (no memory numbers)."""
    from types import SimpleNamespace

    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.distributed import enable_activation_checkpointing
    from trainer.optim.hybrid import build_muon_adamw
    from trainer.plan import model_counts, plan_memory
    from trainer.update import ForwardSettings, check_flash_attention, token_logprobs

    model_type, dims = PROBE_SHAPES[shape]
    if DEVICE == "cpu":  # the script's logic only
        dims = dict(
            dims,
            vocab_size=512,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
        )
        token_counts, chunk = (256, 512), 128
    cfg = AutoConfig.for_model(model_type, **dims)
    counts = model_counts(cfg)
    with torch.device(DEVICE):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.train()
    enable_activation_checkpointing(model)
    opt = build_muon_adamw(model, matrix_lr=1e-6, lr=1e-6, adjust_lr_fn="match_rms_adamw")
    check_flash_attention(model, torch.device(DEVICE), torch.bfloat16)  # the paper configuration's requirement
    forward = ForwardSettings(autocast_dtype=torch.bfloat16, chunk_tokens=chunk)
    sizes, ok = {}, True
    for n in token_counts:
        plan = plan_memory(counts, n, 1, checkpointing=True, head_chunk_tokens=chunk)
        model.zero_grad(set_to_none=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        ids = torch.randint(0, cfg.vocab_size, (1, n), device=DEVICE)
        batch = SimpleNamespace(input_ids=ids, attention_mask=torch.ones_like(ids))
        row = {"predicted_gib": round(plan.total_gib, 1), "predicted_fits": plan.fits}
        try:
            t0 = time.perf_counter()
            out = token_logprobs(model, batch, 1.0, with_entropy=True, forward=forward)
            logp = out[0]
            logp.mean().backward()
            opt.step()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated() / 2**30
                row.update(
                    peak_gib=round(peak, 1),
                    ratio=round(peak / plan.total_gib, 2),
                    reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 1),
                )
                ok &= peak <= PLAN_UNDER_PREDICTION * plan.total_gib
            row["seconds"] = round(time.perf_counter() - t0, 2)
            ok &= bool(torch.isfinite(logp).all())
        except torch.cuda.OutOfMemoryError:
            row["peak_gib"] = "out of memory"
            ok &= not plan.fits
        finally:
            logp = out = None  # the entropy too, before the next size
        sizes[n] = row
    results.append(
        {
            "check": f"long_episode_update_{shape}",
            "ok": bool(ok),
            "threshold": f"no OOM where the plan fits; peak <= {PLAN_UNDER_PREDICTION} x predicted",
            "value": {"checkpointing": True, "head_chunk": chunk, "per_micro_batch_tokens": sizes},
        }
    )
    print("long-episode probe:", results[-1]["value"], flush=True)
    del model, opt
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def nccl_muon_parity(results: list) -> None:
    """Sharded Muon against torch.optim.Muon bit for bit over NCCL on every visible GPU (2 or more;
    tests/distributed/muon_parity.py, which CI runs on gloo)."""
    gpus = torch.cuda.device_count() if DEVICE == "cuda" else 2
    if gpus < 2:
        results.append(
            {
                "check": "nccl_muon_parity",
                "ok": True,
                "value": f"skipped: {gpus} GPU visible",
                "threshold": "needs 2 GPUs",
            }
        )
        return
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={gpus}",
            str(ROOT / "tests" / "distributed" / "muon_parity.py"),
            "--device",
            DEVICE,
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"),
    )
    ok = run.returncode == 0 and f"muon parity OK on {gpus} ranks" in run.stdout
    results.append(
        {
            "check": "nccl_muon_parity" if DEVICE == "cuda" else "muon_parity_gloo_dry_run",
            "ok": ok,
            "value": (run.stdout + run.stderr)[-1500:],
            "threshold": "bit-identical",
        }
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="also write the JSON result here")
    ap.add_argument("--updates", type=int, default=5, help="checkpoints every 2: at least 5 for two of them")
    ap.add_argument(
        "--memory-probe",
        nargs="*",
        choices=sorted(PROBE_SHAPES),
        default=None,
        metavar="SHAPE",
        help=f"also measure a real-size model's micro-batch memory: {', '.join(PROBE_SHAPES)} (default: all)",
    )
    ap.add_argument("--skip-trainer", action="store_true", help="only the Muon checks (and the memory probe)")
    ap.add_argument(
        "--long-episodes",
        action="store_true",
        help="issue 18's checks: the 4B shape's update at 8k/16k/32k tokens with activation "
        "checkpointing and a chunked head beside the planner, and sharded Muon over NCCL on the "
        "visible GPUs (2 or more)",
    )
    ap.add_argument("--keep", default=None, metavar="DIR", help="work here and keep the runs (default: a temp dir)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of the script")
    ap.add_argument(
        "--shape",
        default="Qwen3-0.6B",
        help="the cells' checkpoint: a released Qwen3 shape (Qwen3-0.6B, Qwen3-4B) or `small` (CPU dry runs)",
    )
    args = ap.parse_args()
    global DEVICE
    DEVICE = STUDY_CELL["run"]["device"] = args.device
    results: list = []
    status = "ERROR"
    try:
        if DEVICE == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
        name = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu (dry run)"
        results.append(
            {"check": "device", "value": name, "ok": True, "threshold": "reported", "torch": torch.__version__}
        )
        muon_checks(results)
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.keep or tmp)
            work.mkdir(parents=True, exist_ok=True)
            if not args.skip_trainer:
                trainer_checks(results, work, args.updates, args.shape)
        if args.long_episodes:
            long_episode_probe(results)
            nccl_muon_parity(results)
        if args.memory_probe is not None and DEVICE == "cuda":
            for shape in args.memory_probe or PROBE_SHAPES:
                memory_probe(results, shape)
        status = "PASS" if all(r["ok"] for r in results) else "FAIL"
    except Exception:
        traceback.print_exc()
    line = json.dumps({"status": status, "checks": results})
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return {"PASS": 0, "FAIL": 1}.get(status, 2)


if __name__ == "__main__":
    sys.exit(main())
