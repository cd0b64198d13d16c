"""The memory planner (`python -m trainer plan`) against the measured peaks of one update micro-batch on one H200
(benchmarks/gpu_check_trainer.py --memory-probe; docs/scale.md): fp32 master weights, bf16 autocast, no activation
checkpointing, no head chunking, Muon+AdamW. The bounds (15% for the 4B shape, 25% for the 0.5B shape) were set
after the comparison; the out-of-memory points must be predicted not to fit."""

import pytest
import torch
import yaml

from trainer.__main__ import main
from trainer.plan import model_counts, plan_memory

QWEN3_4B = dict(
    model_type="qwen3",
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    tie_word_embeddings=True,
)
QWEN25_05B = dict(
    model_type="qwen2",
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)
MEASURED = {
    "4B": {2048: 64, 4096: 80, 8192: 121, 16384: None},
    "0.5B": {2048: 13, 4096: 25, 8192: 45, 16384: 85, 32768: None},
}
"""GiB allocated at each micro-batch size; None: out of memory."""


def _counts(shape):
    from transformers import AutoConfig

    kwargs = dict(shape)
    return model_counts(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))


def test_the_parameter_counts_are_the_models():
    counts = _counts(QWEN3_4B)
    assert counts.params == 4_022_468_096  # Qwen3-4B's published 4.0B, embeddings tied
    assert counts.muon_params == 36 * (2560 * 4096 * 2 + 2560 * 1024 * 2 + 3 * 2560 * 9728)
    assert counts.layers == 36 and counts.vocab == 151936


@pytest.mark.parametrize("name, shape, bound", [("4B", QWEN3_4B, 0.15), ("0.5B", QWEN25_05B, 0.25)])
def test_the_plan_matches_the_h200_measurements(name, shape, bound):
    counts = _counts(shape)
    for tokens, gib in MEASURED[name].items():
        plan = plan_memory(counts, tokens, 1, checkpointing=False, head_chunk_tokens=None)
        if gib is None:
            assert not plan.fits, f"{name} at {tokens} ran out of memory on the H200; predicted {plan.total_gib:.0f}"
        else:
            assert abs(plan.total_gib / gib - 1) <= bound, f"{name} at {tokens}: {plan.total_gib:.1f} vs {gib} GiB"
            assert plan.fits


def test_sharding_checkpointing_and_a_chunked_head_make_32k_fit_on_8_gpus():
    counts = _counts(QWEN3_4B)
    sharded = plan_memory(counts, 32768, 8)
    assert sharded.fits and sharded.total_gib < 40  # prime-rl measured 36.1 GiB for Qwen3-4B at 64k on 8 H200s
    assert sharded.terms["state"] == pytest.approx(plan_memory(counts, 32768, 1, sharded=True).terms["state"] / 8)
    assert not plan_memory(counts, 32768, 8, checkpointing=False, head_chunk_tokens=None).fits
    assert plan_memory(counts, 65536, 8).total_gib > sharded.total_gib


def test_the_command_reads_a_cell(tmp_path, capsys):
    from transformers import AutoConfig

    kwargs = dict(QWEN3_4B)
    AutoConfig.for_model(kwargs.pop("model_type"), **kwargs).save_pretrained(tmp_path / "model")
    cell = tmp_path / "cell.yaml"
    cell.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(tmp_path / "model")},
                "env": {"name": "minirepo"},
                "rollout": {"max_episode_tokens": 32768},
            }
        )
    )
    h200 = ["--gpu-memory-gib", "139.8"]
    assert main(["plan", "--config", str(cell), "--gpus", "8", *h200]) == 0
    out = capsys.readouterr().out
    assert "4.02B parameters (3.63B on Muon), 32,768 tokens per micro-batch, 8 GPU(s), sharded" in out
    assert "139.8 GiB per GPU (--gpu-memory-gib)" in out and ": fits" in out
    assert main(["plan", "--config", str(cell), "--no-checkpointing", "--head-chunk", "0", *h200]) == 1
    assert "does NOT fit" in capsys.readouterr().out
    assert main(["plan", "--config", str(cell), "--gpus", "0", *h200]) == 2
    if not torch.cuda.is_available():  # a login node: the planner asks rather than assume a card
        assert main(["plan", "--config", str(cell), "--gpus", "8"]) == 2
        assert "no GPU is visible here; give one GPU's memory" in capsys.readouterr().err


def test_the_command_predicts_the_cells_wall_time(tmp_path, capsys):
    """`--wall-time`: the simulator on the cell's own rollout settings and placement (2 update GPUs + 2 servers),
    the same numbers as `simulate` called with them, and the best split of the 4 GPUs, no fewer update GPUs than
    the memory plan needs (the 4B update at 32k does not fit on one H100: at least 2)."""
    from transformers import AutoConfig

    from trainer.rollout.simulate import SimInputs, best, placements, simulate

    kwargs = dict(QWEN3_4B)
    AutoConfig.for_model(kwargs.pop("model_type"), **kwargs).save_pretrained(tmp_path / "model")
    rollout = dict(
        engine="vllm",
        server=True,
        server_replicas=2,
        loop="episodes",
        max_in_flight=16,
        batch_size=8,
        max_episode_tokens=32768,
        max_turn_tokens=512,
        env_workers=8,
        max_staleness=2,
    )
    cell = tmp_path / "cell.yaml"
    cell.write_text(
        yaml.safe_dump(
            {
                "model": {"path": str(tmp_path / "model")},
                "env": {"name": "minirepo"},
                "rollout": rollout,
                "run": {"updates": 50},
            }
        )
    )
    shape = dict(prompt_tokens_median=300.0, turns_min=2, turns_max=6, action_tokens_median=50.0)
    (tmp_path / "sim.yaml").write_text(yaml.safe_dump(shape))
    args = ["plan", "--config", str(cell), "--gpus", "2", "--gpu-memory-gib", "79.1", "--wall-time"]
    assert main([*args, "--sim-inputs", str(tmp_path / "sim.yaml")]) == 0
    out = capsys.readouterr().out
    x = SimInputs(
        **shape,
        gpus=4,
        update_gpus=2,
        min_update_gpus=2,
        batch_size=8,
        max_staleness=2,
        max_in_flight=16,
        max_turn_tokens=512,
        max_episode_tokens=32768,
        env_workers=8,
        updates=50,
    )
    here = simulate(x, "episodes", 4)
    assert f"{here.seconds_per_update:.0f} s per update at 2 update GPU(s) + 2 rollout GPU(s)" in out
    assert f"{here.cell_hours:.1f} h and {here.gpu_hours:.0f} GPU-hours for 50 updates" in out
    top = best(placements(x, ["episodes"], 4), "episodes")
    assert top.update_gpus >= 2
    assert f"best split of the 4 GPUs: {top.update_gpus} update + {top.engine_gpus} rollout, " in out


def test_the_command_reads_a_checkpoint_with_its_own_code(tmp_path, capsys):
    """A MiniCPM release (its modelling code behind auto_map): counted with the study's trust_remote_code, without a
    prompt; the count is the loaded model's."""
    from builders import TEXTS

    from trainer.config import load_config
    from trainer.plan import cell_model_config
    from trainer.policy.load import load_policy
    from trainer.policy.standins import write_standin_checkpoint

    ckpt = write_standin_checkpoint("minicpm", tmp_path / "minicpm", TEXTS)
    cell = tmp_path / "cell.yaml"
    model = {"path": str(ckpt), "trust_remote_code": True}
    cell.write_text(yaml.safe_dump({"model": model, "env": {"name": "minirepo"}}))
    assert main(["plan", "--config", str(cell), "--gpu-memory-gib", "79.1"]) == 0
    assert ": fits" in capsys.readouterr().out
    loaded, _ = load_policy(ckpt, trust_remote_code=True)
    counted = model_counts(cell_model_config(load_config(cell)), trust_remote_code=True)
    assert counted.params == sum(p.numel() for p in loaded.parameters())


def test_the_weights_pushed_to_a_vllm_server_are_planned_on_the_first_gpu(tmp_path):
    """Rank 0 keeps the pushed weights on its GPU in the servers' precision through the update: one copy of P
    parameters (bf16 here), `lag` + 1 under lagged rollouts, none without a vLLM server."""
    from transformers import AutoConfig

    from trainer.config import config_from_dict
    from trainer.plan import pushed_weight_bytes

    kwargs = dict(QWEN3_4B)
    AutoConfig.for_model(kwargs.pop("model_type"), **kwargs).save_pretrained(tmp_path / "model")

    def cell(**rollout):
        rollout = {"engine": "vllm", "server": True, "mode": "async", **rollout}
        run = {"compute_dtype": "bfloat16"}
        return config_from_dict({"model": {"path": str(tmp_path / "model")}, "rollout": rollout, "run": run})

    assert pushed_weight_bytes(cell()) == 2
    assert pushed_weight_bytes(cell(mode="lagged", lag=1)) == 4
    assert pushed_weight_bytes(cell(server=False)) == 0
    assert pushed_weight_bytes(cell(engine="reference")) == 0
    kwargs = dict(QWEN3_4B)
    counts = model_counts(AutoConfig.for_model(kwargs.pop("model_type"), **kwargs))
    plain, pushed = plan_memory(counts, 32768, 8), plan_memory(counts, 32768, 8, pushed_bytes=2)
    assert "pushed weights" not in plain.terms
    assert pushed.terms["pushed weights"] == pytest.approx(2 * counts.params / 2**30)
    assert pushed.total_gib == pytest.approx(plain.total_gib + pushed.terms["pushed weights"])
