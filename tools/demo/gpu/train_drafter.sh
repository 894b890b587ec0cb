#!/usr/bin/env bash
# The demo drafter's training recipe on one CUDA GPU, from a plain checkout of this repo.
#
#   tools/demo/gpu/train_drafter.sh OUT_DIR          (budget: 8 minutes on one GPU)
#
# Assumes only torch (CUDA), transformers and safetensors (with their own dependencies: numpy,
# tokenizers, tqdm, pyyaml); nothing is installed: the packages run from the source tree. Resumes a run
# already in OUT_DIR. Writes OUT_DIR/log.txt (everything printed), OUT_DIR/tau.json (held-out tau,
# fp32 and bf16, T=0 and T=1, and the time of every stage) and the drafter in OUT_DIR/work/drafter (the
# base run in OUT_DIR/work/drafter_run, its continuations beside it). DEVICE, TRAIN_PROMPTS,
# RESPONSE_TOKENS, EPOCHS, CONTINUE_STEPS, EVAL_PROMPTS, EVAL_TOKENS override the recipe's numbers (the
# test runs it on the CPU, tiny). BUDGET_MIN (default 8) is kept by construction: a continuation stage starts
# only if, at the pace of the one before, it ends a minute before the budget (the held-out tau's share);
# tau.json's "budget" says how many of the recipe's continuations ran.
set -euo pipefail
OUT="${1:?usage: tools/demo/gpu/train_drafter.sh OUT_DIR}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # absolute: the script runs from the repo root
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
export PYTHONPATH="$ROOT/packages/core/src:$ROOT/packages/cli/src:$ROOT/tools/demo/src${PYTHONPATH:+:$PYTHONPATH}"
export DFLASH_CACHE_DIR="$OUT/cache"
args=(--device "${DEVICE:-cuda}" --models "$ROOT/models/demo")
[[ -n "${TRAIN_PROMPTS:-}" ]] && args+=(--train-prompts "$TRAIN_PROMPTS")
[[ -n "${RESPONSE_TOKENS:-}" ]] && args+=(--response-tokens "$RESPONSE_TOKENS")
[[ -n "${EPOCHS:-}" ]] && args+=(--epochs "$EPOCHS")
[[ -n "${CONTINUE_STEPS:-}" ]] && args+=(--continue-steps "$CONTINUE_STEPS")
[[ -n "${EVAL_PROMPTS:-}" ]] && args+=(--eval-prompts "$EVAL_PROMPTS")
[[ -n "${EVAL_TOKENS:-}" ]] && args+=(--eval-tokens "$EVAL_TOKENS")
[[ -n "${BUDGET_MIN:-}" ]] && args+=(--budget-min "$BUDGET_MIN")
cd "$ROOT"
"$PYTHON" -m dflash_demo.gpu_train "$OUT" "${args[@]}" 2>&1 | tee -a "$OUT/log.txt"
