#!/bin/bash
# The contrasts README's findings quote, from the published studies (trainer.meta).
cd "$(dirname "$0")/../.."
M="${PYTHON:-python} -m trainer.meta"
for o in window_success heldout_auc; do
  echo "== pooled 3e-4 SPO, Muon-trained bases ($o)"; $M docs/results/edge docs/results/edge-rerun docs/results/edge-minicpm docs/results/edge-warmstarts docs/results/edge-adamw --first muon_m3e-4_r1e-4:spo_muon --second adamw_lr3e-4:spo_adam --outcome $o
  echo "== E2 1e-4 ($o)"; $M docs/results/conditions --first arm=muon --second arm=adamw_b0.999 --outcome $o
  echo "== E2-edge 3e-4 ($o)"; $M docs/results/conditions-edge --first arm=muon_m3e-4_r1e-4 --second arm=adamw_b0.999_lr3e-4 --outcome $o
done
for m in minicpm-tiny qwen-tiny; do
  echo "== default $m SPO"; $M docs/results/default --first model=$m,recipe=spo_muon --second model=$m,recipe=spo_adam
  echo "== stability $m 3e-4"; $M docs/results/stability --first model=$m,recipe=spo_muon,lr=3e-4 --second model=$m,recipe=spo_adam,lr=3e-4
done
for h in 1 2 3 4; do echo "== horizon $h"; $M docs/results/horizon --first model=qwen-h$h,recipe=spo_muon --second model=qwen-h$h,recipe=spo_adam; done
for r in grpo gigpo graphgpo; do echo "== E4 equal step $r"; $M docs/results/companion-equal --first arm=muon_m1e-4_r1e-4,recipe=$r --second arm=adamw_1e-4,recipe=$r; done
