"""Continuous batching for the episode-level loop: vLLM's engine stepped by a thread of its own, turns joining and
leaving the running batch as they come.

`Stepper(llm_engine)` drives vLLM's in-process `LLMEngine` (`add_request`, `step`, `has_unfinished_requests`: the
offline engine's own continuous-batching API, the one `LLM.generate` drives): `submit` adds one request at any time,
the stepper thread calls `step()` while any request is unfinished, and each finished output goes to its request's
callback. A request that arrives mid-batch joins at the next step instead of waiting for the batch to end, which is
what keeps the engine busy while other episodes' tool calls run. `call(fn)` runs `fn` on the stepper thread between
steps (a weight load: the episode loop's version gate has already drained the turns in flight, so no request sees
two policies). `busy_s` (time inside `step()`) over wall time is the engine's busy fraction.

Two users: `ContinuousTurns(engine)`, the `TurnEngine` (trainer/rollout/episode_loop.py) of an in-process
`VLLMEngine`, and the rollout server, which steps its engine the same way for the turns a trainer streams to it
(trainer/rollout/server.py). Requests are the lock-step loop's (`request_kwargs`: the same seeds, stop ids, log-prob
mode), read back by the same `read_output`. Whether a request's tokens are bit-identical to the lock-step loop's
depends on vLLM's kernels giving the same logits in another batch composition, which it does not promise:
replicates, as in vllm_engine.py.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
from collections.abc import Callable

import torch

from trainer.rollout.vllm_engine import read_output, request_kwargs

STEPPED = ("add_request", "step", "has_unfinished_requests")
"""What an engine needs for continuous batching (vLLM's in-process `LLMEngine`)."""


def steppable(llm) -> bool:
    """Whether `llm` (a vLLM `LLM`, or a stand-in) exposes an engine `Stepper` can drive."""
    engine = getattr(llm, "llm_engine", None)
    return all(hasattr(engine, name) for name in STEPPED)


class Stepper:
    """See the module docstring. Callbacks run on the stepper thread: `done(output, None)` or `done(None, error)`."""

    def __init__(self, llm_engine):
        missing = [name for name in STEPPED if not hasattr(llm_engine, name)]
        if missing:
            raise TypeError(f"Stepper: {type(llm_engine).__name__} has no {missing[0]} (needs vLLM's LLMEngine)")
        self.llm_engine = llm_engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: dict[str, Callable] = {}
        self._ids = itertools.count()
        self._closed = False
        self.error: BaseException | None = None
        self.busy_s = 0.0
        """Seconds spent inside vLLM's `step()`."""
        self.steps = 0
        self._threads = torch.get_num_threads()
        """The creating thread's intra-op threads: a new thread starts at OpenMP's default instead, and vLLM's CPU
        attention refuses a step whose thread count differs from the one its worker was set up with."""
        self._thread = threading.Thread(target=self._run, name="vllm-stepper", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params, done: Callable) -> None:
        if self.error is not None:
            done(None, RuntimeError(f"the vLLM stepper thread failed: {self.error}"))
            return
        self._inbox.put(("generate", (list(prompt), params), done))

    def call(self, fn: Callable, timeout_s: float | None = None):
        """`fn()` on the stepper thread, between steps; its result (or its error, raised here)."""
        box: dict = {}
        ran = threading.Event()

        def done(result, error):
            box["result"], box["error"] = result, error
            ran.set()

        self._inbox.put(("call", fn, done))
        if not ran.wait(timeout_s):
            raise TimeoutError(f"the vLLM stepper did not run the call within {timeout_s} s")
        if box["error"] is not None:
            raise box["error"]
        return box["result"]

    def _take_inbox(self, block: bool) -> None:
        """Add the requests that arrived (waiting for one when `block`); run the calls that came."""
        while True:
            try:
                item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if item is None:
                self._closed = True
                return
            kind, payload, done = item
            if kind == "generate":
                request_id = str(next(self._ids))
                prompt, params = payload
                self._waiting[request_id] = done
                self.llm_engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
                continue
            try:
                result = payload()
            except Exception as err:
                done(None, err)
            else:
                done(result, None)

    def _run(self) -> None:
        try:
            torch._C.set_num_threads(self._threads)  # vLLM's CPU worker makes torch.set_num_threads a no-op
            while not self._closed:
                self._take_inbox(block=not self.llm_engine.has_unfinished_requests())
                if not self.llm_engine.has_unfinished_requests():
                    continue
                start = time.perf_counter()
                outputs = self.llm_engine.step()
                self.busy_s += time.perf_counter() - start
                self.steps += 1
                for output in outputs:
                    if getattr(output, "finished", True):
                        done = self._waiting.pop(str(output.request_id), None)
                        if done is not None:
                            done(output, None)
        except BaseException as err:  # every waiting request, and every one that still comes, learns why
            self.error = err
            failure = RuntimeError(f"the vLLM stepper thread failed: {type(err).__name__}: {err}")
            for done in self._waiting.values():
                done(None, failure)
            self._waiting.clear()
            while (item := self._inbox.get()) is not None:
                item[2](None, failure)

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=60)


class ContinuousTurns:
    """The `TurnEngine` of an in-process `VLLMEngine` whose `llm` can be stepped (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self.stepper = Stepper(getattr(engine.llm, "llm_engine", None))
        self._stop_ids = {int(t) for t in engine.fmt.stop_ids}

    @property
    def busy_s(self) -> float:
        return self.stepper.busy_s

    @property
    def steps(self) -> int:
        return self.stepper.steps

    async def generate(self, prompt, *, sampling, max_tokens, seed, key=0):
        params = self.engine.sampling_params_cls(**request_kwargs(sampling, max_tokens, self._stop_ids, seed))
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.stepper.submit(
            prompt, params, lambda output, error: loop.call_soon_threadsafe(settle, future, output, error)
        )
        output = await future
        return read_output(output, prompt, max_tokens, self._stop_ids)

    async def load_weights(self, state_dict, version):
        await asyncio.to_thread(self.stepper.call, lambda: self.engine.load_state_dict(state_dict, version))

    def close(self) -> None:
        self.stepper.close()


def settle(future: asyncio.Future, result, error: BaseException | None) -> None:
    """Resolve `future` (on its loop) with `result`, or `error`, unless it is already done (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
