"""Continuous batching for the episode-level loop: vLLM's engine stepped by a thread of its own, turns joining and
leaving the running batch as they come.

`ContinuousTurns(engine)` is the `TurnEngine` (trainer/rollout/episode_loop.py) of an in-process `VLLMEngine`:
each `generate` adds one request to vLLM's `LLMEngine` (`llm.llm_engine.add_request`, the offline engine's own
continuous-batching API, the one `LLM.generate` drives), and the stepper thread calls `step()` while any request is
unfinished, handing each finished output back to the coroutine that asked. A turn that arrives mid-batch joins at
the next step instead of waiting for the batch to end, which is what keeps the engine busy while other episodes'
tool calls run. Weight pushes run on the same thread, between steps; the version gate has already drained the
turns in flight, so no request sees two policies. `busy_s` (time inside `step()`) over wall time is the engine's
busy fraction, which the benchmarks report.

Requests are the lock-step loop's (`request_kwargs`: the same seeds, stop ids, log-prob mode), read back by the
same `read_output`. Whether a request's tokens are bit-identical to the lock-step loop's depends on vLLM's kernels
giving the same logits for another batch composition, which it does not promise: replicates, as in vllm_engine.py.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time

from trainer.rollout.vllm_engine import read_output, request_kwargs


class ContinuousTurns:
    """See the module docstring. `engine`: a `VLLMEngine` whose `llm` has vLLM's `llm_engine` (in-process)."""

    def __init__(self, engine):
        llm_engine = getattr(engine.llm, "llm_engine", None)
        for name in ("add_request", "step", "has_unfinished_requests"):
            if not hasattr(llm_engine, name):
                raise TypeError(
                    f"ContinuousTurns: {type(engine.llm).__name__} has no llm_engine.{name} (continuous batching needs "
                    "vLLM's in-process LLMEngine)"
                )
        self.engine, self.llm_engine = engine, llm_engine
        self._stop_ids = {int(t) for t in engine.fmt.stop_ids}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self._ids = itertools.count()
        self._closed = False
        self._error: BaseException | None = None
        self.busy_s = 0.0
        """Seconds spent inside vLLM's `step()`."""
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="vllm-stepper", daemon=True)
        self._thread.start()

    async def generate(self, prompt, *, sampling, max_tokens, seed, key=0):
        params = self.engine.sampling_params_cls(**request_kwargs(sampling, max_tokens, self._stop_ids, seed))
        output = await self._submit("generate", (list(prompt), params))
        return read_output(output, prompt, max_tokens, self._stop_ids)

    async def load_weights(self, state_dict, version):
        await self._submit("load", (state_dict, version))

    async def _submit(self, kind: str, payload) -> object:
        if self._error is not None:
            raise RuntimeError(f"the vLLM stepper thread failed: {self._error}") from self._error
        if self._closed:
            raise RuntimeError("ContinuousTurns is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._inbox.put((kind, payload, loop, future))
        return await future

    @staticmethod
    def _resolve(loop, future, result=None, error: BaseException | None = None) -> None:
        def settle():
            if future.done():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        loop.call_soon_threadsafe(settle)

    def _take_inbox(self, block: bool) -> None:
        """Add the requests that arrived (waiting for one when `block`); run a weight load when it comes."""
        while True:
            try:
                item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if item is None:
                self._closed = True
                return
            kind, payload, loop, future = item
            if kind == "generate":
                request_id = str(next(self._ids))
                prompt, params = payload
                self._waiting[request_id] = (loop, future)
                self.llm_engine.add_request(request_id, {"prompt_token_ids": prompt}, params)
            else:
                try:
                    state_dict, version = payload
                    self.engine.load_state_dict(state_dict, version)
                except Exception as err:
                    self._resolve(loop, future, error=err)
                else:
                    self._resolve(loop, future)

    def _run(self) -> None:
        try:
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
                        waiting = self._waiting.pop(str(output.request_id), None)
                        if waiting is not None:
                            self._resolve(*waiting, result=output)
        except BaseException as err:  # every waiting turn, and every one that still comes, learns why
            self._error = err
            failure = RuntimeError(f"the vLLM stepper thread failed: {type(err).__name__}: {err}")
            for loop, future in self._waiting.values():
                self._resolve(loop, future, error=failure)
            self._waiting.clear()
            while (item := self._inbox.get()) is not None:
                self._resolve(item[2], item[3], error=failure)

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join(timeout=60)
