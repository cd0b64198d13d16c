"""The trainer's side of the rollout server (trainer/rollout/server.py, whose docstring holds the design): start it
(`launch_server`, `start_cell_server`), talk to it (`ServerClient`: generation and weight pushes over the control
channel and the weight group), and drive it as an engine (`ServerEngine`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import secrets
import subprocess
import sys
import threading
from datetime import timedelta
from multiprocessing.connection import Client
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from trainer.policy.load import DTYPES
from trainer.rollout.continuous import settle
from trainer.rollout.server import (
    AUTHKEY_ENV,
    BACKENDS,
    PROTOCOL,
    broadcast_from_trainer,
    weight_group,
)
from trainer.rollout.vllm_engine import VLLMEngine, read_output, request_kwargs

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
        address: tuple | None = None,
        authkey: bytes | None = None,
    ):
        self.conn, self.process, self.log_path = conn, process, log_path
        self.address, self.authkey = address, authkey
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
        return [from_plain(p) for p in plain]

    def open_turns(self):
        """A second connection to the server, its turns channel (`RolloutServer.serve_turns`)."""
        if self.address is None:
            raise RuntimeError("this rollout server client was made without the server's address")
        try:
            return Client(self.address, authkey=self.authkey)
        except (OSError, EOFError) as err:
            raise self._fail(f"{type(err).__name__} opening the turns channel", err) from err

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

    @property
    def weight_target(self) -> tuple[torch.device, torch.dtype]:
        """Where the pushed weights leave from and in what precision (the trainer gathers them there)."""
        return self.llm.wire, self.llm.weight_dtype

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        self.llm.push_weights(state_dict, version)
        self.policy_version = int(version)

    def turn_engine(self):
        """Streamed turns where the server steps its engine (continuous batching there), else batched calls."""
        if self.llm.info.get("turns"):
            return StreamingTurns(self)
        from trainer.rollout.episode_loop import BatchedTurns

        return BatchedTurns(self)

    def close(self) -> None:
        self.llm.close()


def server_device(local_world_size: int, replica: int = 0) -> str:
    """The CUDA_VISIBLE_DEVICES entry of server `replica`'s GPU: the GPUs after the local trainer ranks' (rank r
    uses visible device r), one per server, so a cell asks for its trainer processes plus one GPU per server."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = (
        [d for d in visible.split(",") if d.strip()]
        if visible is not None
        else [str(i) for i in range(torch.cuda.device_count())]
    )
    if len(devices) <= local_world_size + replica:
        raise RuntimeError(
            f"rollout.server with the vllm engine needs a GPU per server beside the {local_world_size} trainer "
            f"process(es) of this node ({replica + 1} for server {replica}), and {len(devices)} are visible "
            f"(CUDA_VISIBLE_DEVICES={visible!r}): ask the cell for more GPUs (resources.train.gpu)"
        )
    return devices[local_world_size + replica].strip()


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
    trust_remote_code: bool = False,
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
    if trust_remote_code:
        cmd.append("--trust-remote-code")
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
        authkey = bytes.fromhex(key)
        return ServerClient(
            Client(address, authkey=authkey), process, log_path, device=trainer_device, address=address, authkey=authkey
        )
    except BaseException:  # a server nobody will talk to must not keep its GPU
        process.kill()
        process.wait()
        raise


SERVER_DIR = "rollout-server"
"""Beside a cell's logs: the server's log (`server.log`) and, for a model without `model.path`, the starting
policy the server loads its architecture from (`base-policy/`; its weights are pushed before the first batch)."""


def start_cell_server(cfg, fmt, model: torch.nn.Module, out_dir: str | Path):
    """Start the rollout servers of a cell (on rank 0) and return their engine: a `ServerEngine`, or a
    `ReplicatedServers` over `rollout.server_replicas` of them (started side by side)."""
    r = cfg.rollout
    out = Path(out_dir) / SERVER_DIR
    model_path = cfg.model.path
    if model_path is None:
        from trainer.policy.load import save_policy

        model_path = out / "base-policy"
        save_policy(model, fmt, model_path)
    if r.server_replicas == 1:
        return _start_one_server(cfg, fmt, model, model_path, out, 0)
    engines: list = [None] * r.server_replicas
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            engines[i] = _start_one_server(cfg, fmt, model, model_path, out, i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(r.server_replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for engine in engines:
            if engine is not None:
                engine.close()
        raise errors[0]
    return ReplicatedServers(engines)


def _start_one_server(cfg, fmt, model, model_path, out: Path, replica: int) -> ServerEngine:
    r, run = cfg.rollout, cfg.run
    common = dict(
        log_path=out / ("server.log" if replica == 0 else f"server-{replica}.log"),
        seed=run.seed + replica,
        threads=run.threads,
        trainer_device=str(next(model.parameters()).device),
    )
    if r.engine == "vllm":
        from trainer.rollout.vllm_engine import import_vllm, vllm_on_cpu

        import_vllm()  # missing or too old: say so here, not in the server's log
        gpu = None if vllm_on_cpu() else server_device(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), replica)
        client = launch_server(
            model_path,
            backend="vllm",
            dtype=run.compute_dtype,
            cuda_device=gpu,
            max_model_len=r.max_episode_tokens,
            enforce_eager=r.vllm_enforce_eager,
            trust_remote_code=cfg.model.trust_remote_code,
            gpu_memory_utilization=r.vllm_gpu_memory_utilization,
            **common,
        )
    else:
        gpu = None
        client = launch_server(model_path, backend="reference", dtype=cfg.model.dtype, device="cpu", **common)
    print(
        f"[trainer] rollout server pid {client.info['pid']} ({r.engine}, {client.info['device']}"
        f"{'' if gpu is None else f', GPU {gpu}'}; replica {replica} of {r.server_replicas}; weights by "
        f"{client.backend}); log {common['log_path']}",
        file=sys.stderr,
        flush=True,
    )
    return ServerEngine.connect(client, fmt)


class ReplicatedServers:
    """Several rollout servers as one engine for the episode loop (`rollout.server_replicas`): turns spread over
    them (`RoutedTurns`: each episode kept on one server, new episodes to the least busy), every new policy pushed
    to each in turn."""

    def __init__(self, engines: list[ServerEngine]):
        self.engines = engines
        self.fmt = engines[0].fmt
        self.policy_version = 0

    @property
    def weight_target(self) -> tuple[torch.device, torch.dtype]:
        return self.engines[0].weight_target  # the same wire and precision for every replica

    def turn_engine(self):
        from trainer.rollout.episode_loop import RoutedTurns

        return RoutedTurns([engine.turn_engine() for engine in self.engines])

    def load_state_dict(self, state_dict: dict, version: int) -> None:
        for engine in self.engines:
            engine.load_state_dict(state_dict, version)
        self.policy_version = int(version)

    def play(self, *args, **kwargs):
        raise RuntimeError("several rollout servers play through the episode loop (rollout.loop: episodes)")

    def close(self) -> None:
        for engine in self.engines:
            engine.close()


def from_plain(plain) -> SimpleNamespace:
    """A vLLM `RequestOutput` look-alike from what the server sent (`server.plain_output`)."""
    tokens, logps, cached = plain
    return SimpleNamespace(
        prompt_token_ids=None, num_cached_tokens=cached, outputs=[SimpleNamespace(token_ids=tokens, logprobs=logps)]
    )


class StreamingTurns:
    """The `TurnEngine` of a rollout server that steps its engine: each turn goes out on the turns channel as it
    comes and is answered when done, in any order (continuous batching in the server); weights go over the control
    channel, as for the lock-step loop. A server that dies fails every turn waiting, with its exit code and log."""

    def __init__(self, engine: ServerEngine):
        self.engine, self.client = engine, engine.llm
        self.conn = self.client.open_turns()
        self._stop_ids = {int(t) for t in engine.fmt.stop_ids}
        self._sending = threading.Lock()
        self._waiting: dict[int, tuple] = {}
        self._ids = itertools.count()
        self._failure: BaseException | None = None
        self._closing = False
        threading.Thread(target=self._read, name="turns-reader", daemon=True).start()

    async def generate(self, prompt, *, sampling, max_tokens, seed, key=0):
        if self._failure is not None:
            raise self._failure
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        request_id = next(self._ids)
        self._waiting[request_id] = (loop, future)
        with self._sending:
            try:
                self.conn.send(
                    ("submit", request_id, prompt, request_kwargs(sampling, max_tokens, self._stop_ids, seed))
                )
            except (OSError, EOFError) as err:
                self._waiting.pop(request_id, None)
                raise self.client._fail(f"{type(err).__name__} sending a turn", err) from err
        output = from_plain(await future)
        return read_output(output, prompt, max_tokens, self._stop_ids)

    def _read(self) -> None:
        while True:
            try:
                kind, request_id, value = self.conn.recv()
            except Exception as err:  # EOF, a reset, or the connection closed under the read by `close()`
                if self._closing:
                    return
                if self.client.process is not None:  # a server that died: give its exit code a moment to exist
                    try:
                        self.client.process.wait(timeout=5)
                    except subprocess.TimeoutExpired:
                        pass
                self._failure = self.client._fail(f"the turns channel closed: {type(err).__name__}", err)
                for loop, future in list(self._waiting.values()):
                    loop.call_soon_threadsafe(settle, future, None, self._failure)
                self._waiting.clear()
                return
            waiting = self._waiting.pop(request_id, None)
            if waiting is None:
                continue
            loop, future = waiting
            error = None if kind == "done" else RuntimeError(f"rollout server: {value}")
            loop.call_soon_threadsafe(settle, future, value, error)

    async def load_weights(self, state_dict, version):
        await asyncio.to_thread(self.engine.load_state_dict, state_dict, version)

    def close(self) -> None:
        self._closing = True
        try:
            self.conn.close()
        except OSError:
            pass
