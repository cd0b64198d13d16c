"""vLLM's `LLM` interface over a Hugging Face causal LM, one request at a time: the rollout server's CPU backend.

`ReferenceLLM` answers the calls `VLLMEngine` makes (`generate` with token-id prompts and per-request sampling
parameters, `apply_model`, `reset_prefix_cache`) the way vLLM defines them, on any device torch has: each request
is decoded alone with a plain KV cache, greedy or sampled with a generator seeded by the request's seed, its
log-probs as vLLM's "processed_logprobs" (log-softmax after temperature and top-p) or "raw_logprobs" (before
them). It exists so that the rollout server (`trainer/rollout/server.py`) and the vLLM engine's bookkeeping run
and are tested where vLLM cannot (CPU), with exactly vLLM's outputs' shape. It batches nothing and caches nothing
across requests: a reference, not a fast engine.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from types import SimpleNamespace

import torch


@dataclass
class ReferenceSamplingParams:
    """`vllm.SamplingParams` with exactly the fields `request_kwargs` sets, none defaulted (a missing one is a
    TypeError, as a misspelt one would be in vLLM)."""

    temperature: float
    top_p: float
    max_tokens: int
    stop_token_ids: list
    ignore_eos: bool
    logprobs: int
    seed: int | None
    detokenize: bool


@dataclass
class Logprob:
    """vLLM's per-token log-prob record (`vllm.logprobs.Logprob`)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


def request_output(prompt: list[int], tokens: list[int], logps: list[float], cached: int | None = None):
    """A `vllm.RequestOutput` look-alike: .prompt_token_ids, .outputs[0].token_ids / .logprobs, .num_cached_tokens."""
    per_token = [{t: Logprob(lp)} for t, lp in zip(tokens, logps)]
    completion = SimpleNamespace(token_ids=tuple(tokens), logprobs=per_token, finish_reason="stop")
    return SimpleNamespace(prompt_token_ids=list(prompt), outputs=[completion], num_cached_tokens=cached)


class _Weights:
    """What the worker's `get_model()` gives: the model, with vLLM's `load_weights(iterable of (name, tensor))`
    (Hugging Face names, copied in place, cast to each parameter's dtype; returns the names it loaded)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def named_parameters(self):
        return self.model.named_parameters()

    def load_weights(self, weights) -> set[str]:
        state = self.model.state_dict()
        loaded = set()
        for name, tensor in weights:
            if name not in state:
                raise KeyError(f"load_weights: the model has no parameter {name!r}")
            state[name].copy_(tensor)
            loaded.add(name)
        return loaded


class ReferenceEngine:
    """vLLM's `LLM.llm_engine` stepping API over a `ReferenceLLM` (what `Stepper` drives): each `step()` decodes the
    oldest pending request whole and returns it finished, with its `request_id`."""

    def __init__(self, llm: ReferenceLLM):
        self.llm, self.pending = llm, []

    def add_request(self, request_id: str, prompt: dict, params) -> None:
        self.pending.append((request_id, prompt, params))

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self) -> list:
        request_id, prompt, params = self.pending.pop(0)
        (output,) = self.llm.generate([prompt], [params])
        output.request_id, output.finished = request_id, True
        return [output]


class ReferenceLLM:
    """See the module docstring. `model` is any Hugging Face causal LM; it is put in eval mode."""

    def __init__(self, model: torch.nn.Module, logprobs_mode: str = "processed_logprobs"):
        self.model, self.mode = model.eval(), logprobs_mode
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.llm_engine = ReferenceEngine(self)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def _decode(self, prompt: list[int], sp) -> tuple[list[int], list[float]]:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        generator = torch.Generator().manual_seed(sp.seed) if sp.seed is not None else None
        feed, tokens, logps = list(prompt), [], []
        while len(tokens) < sp.max_tokens:
            ids = torch.tensor([feed], device=self.device)
            logits = self.model(input_ids=ids, use_cache=True, **{self._cache_kw: cache}).logits[0, -1].float().cpu()
            if sp.temperature == 0:
                token = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                scaled = torch.log_softmax(logits / sp.temperature, -1)
                if sp.top_p < 1:  # vLLM's nucleus: drop the low tail whose mass is at most 1 - top_p
                    sorted_lp, order = scaled.sort()
                    drop = sorted_lp.exp().cumsum(-1) <= 1 - sp.top_p
                    drop[-1] = False
                    scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -math.inf)
                    scaled = torch.log_softmax(scaled, -1)
                token = int(torch.multinomial(scaled.exp(), 1, generator=generator))
                logp = scaled if self.mode == "processed_logprobs" else torch.log_softmax(logits, -1)
            tokens.append(token)
            logps.append(float(logp[token]))
            if token in sp.stop_token_ids:
                break
            feed = [token]
        return tokens, logps

    def generate(self, prompts, sampling_params=None, *, use_tqdm: bool = True) -> list:
        """One output per `{"prompt_token_ids": [...]}` prompt, in order (vLLM's `LLM.generate`)."""
        if len(prompts) != len(sampling_params):
            raise ValueError(f"generate: {len(prompts)} prompts but {len(sampling_params)} sampling params")
        return [
            request_output(p["prompt_token_ids"], *self._decode(p["prompt_token_ids"], sp))
            for p, sp in zip(prompts, sampling_params)
        ]

    def collective_rpc(self, method, args: tuple = (), kwargs: dict | None = None) -> list:
        """`method(worker, *args, **kwargs)` on the one worker, its result in a list (vLLM's `LLM.collective_rpc`
        with a callable). The worker has vLLM's `get_model()`, and no `vllm_config`: nothing to reprocess."""
        worker = SimpleNamespace(get_model=lambda: _Weights(self.model), vllm_config=None)
        return [method(worker, *args, **(kwargs or {}))]

    def reset_prefix_cache(self) -> bool:
        return True  # nothing is cached across requests


def reference_engine(model: torch.nn.Module, fmt, logprobs_mode: str = "processed_logprobs"):
    """A `VLLMEngine` playing with a `ReferenceLLM` over `model` in this process (`rollout.engine: reference`)."""
    from trainer.rollout.vllm_engine import VLLMEngine

    return VLLMEngine.from_llm(
        ReferenceLLM(model, logprobs_mode),
        fmt,
        sampling_params_cls=ReferenceSamplingParams,
        logprobs_mode=logprobs_mode,
    )
