"""benchmarks/bench_vllm_cpu.py's HFEngine side (vLLM itself is not installed here: the yardstick's numbers are in
docs/benchmarks.md): the raw-decoding workload samples exactly batch x new-tokens tokens, the episode workload plays
the study's tasks."""

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_hf_worker_decodes_exactly_the_asked_tokens(tmp_path):
    from trainer.config import config_from_dict
    from trainer.environments.suite import make_suite
    from trainer.policy.load import new_tiny_policy, save_policy

    spec = importlib.util.spec_from_file_location("bench_vllm_cpu", ROOT / "benchmarks" / "bench_vllm_cpu.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_vllm_cpu"] = bench
    spec.loader.exec_module(bench)
    study = yaml.safe_load((ROOT / "config.yaml").read_text())
    model, fmt = new_tiny_policy(
        "minicpm-tiny", make_suite(config_from_dict({"env": study["cell"]["env"]}).env).sample_texts(), seed=0
    )
    save_policy(model, fmt, tmp_path / "policy")
    result = bench.worker("hf", str(tmp_path / "policy"), str(ROOT / "config.yaml"), rounds=1, batch=4, new_tokens=8)
    assert result["decode"]["tokens"] == 4 * 8
    assert result["episodes"]["tokens"] > 0 and result["episodes"]["tokens_per_s"] > 0
