"""A checkpoint of a paper family as released (random weights), loaded as configs/paper.yaml loads it (Qwen3:
`qwen3-stable` over Qwen's own template, thinking off; MiniCPM: its own code) and saved as a policy (what a finished
cell keeps): vLLM on the CPU serves that directory and plays the Hugging Face engine's greedy episodes, before and
after a weight push under the family's parameter names. For MiniCPM this holds the stand-in's code to vLLM's own
MiniCPM class (its three scalings). Run by tests/integration/test_vllm_real.py in a process of its own:

    .venv-vllm/bin/python tests/vllm_family_check.py {qwen3,minicpm} WORK_DIR
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "integration")]

import torch  # noqa: E402
from test_vllm_real import GREEDY, TASKS, TEXTS, TallyEnv, assert_same_episodes  # noqa: E402

from trainer.policy.load import load_policy, save_policy  # noqa: E402
from trainer.policy.standins import write_standin_checkpoint  # noqa: E402
from trainer.rollout.hf_engine import HFEngine  # noqa: E402
from trainer.rollout.vllm_engine import VLLMEngine  # noqa: E402


def play(engine, version: int):
    return engine.play([TallyEnv() for _ in TASKS], TASKS, sampling=GREEDY, policy_version=version)


def main(family: str, work: Path) -> None:
    if family == "qwen3":
        own = (ROOT / "tests" / "data" / "templates" / "qwen3.jinja").read_text()
        ckpt = write_standin_checkpoint(family, work / "ckpt", TEXTS, chat_template=own, seed=3)
        options = dict(chat_template="qwen3-stable", template_options={"enable_thinking": False})
    else:
        ckpt = write_standin_checkpoint(family, work / "ckpt", TEXTS, seed=3)
        options = dict(trust_remote_code=True)
    model, fmt = load_policy(ckpt, **options)
    save_policy(model, fmt, work / "policy")
    model.eval()
    engine = VLLMEngine(
        str(work / "policy"),
        fmt,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        max_model_len=512,
        trust_remote_code=family == "minicpm",
    )
    got = play(engine, 0)
    assert_same_episodes(got, play(HFEngine(model, fmt), 0))
    if family == "qwen3":  # thinking off: the empty reasoning block ends every prompt
        think = fmt.tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False)
        assert all(e.tokens[: e.turns[0].start][-len(think) :] == think for e in got)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(1)) * 0.05)
    engine.load_state_dict(moved.state_dict(), version=1)
    assert_same_episodes(play(engine, 1), play(HFEngine(moved, fmt), 1))
    print(f"{family}: served as played")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
