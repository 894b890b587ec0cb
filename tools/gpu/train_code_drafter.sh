#!/usr/bin/env bash
# The Qwen2.5-Coder-1.5B drafter's recipe (issue 58) on one CUDA GPU: the CPU recipe of `make code-drafter`, at
# GPU scale, from a plain checkout.
#
#   tools/gpu/train_code_drafter.sh OUT_DIR
#
# Needs the converted target (models/qwen-coder/target from `make code-model`, or TARGET=DIR) and assumes only
# torch (CUDA), transformers and safetensors (with their own dependencies); nothing is installed: the packages
# run from the source tree. Stages, each resumed if OUT_DIR already holds it:
#   prompts   code chats from the standard library's train modules (dflash_demo.code_prompts, seed 2)
#   data      the target's own greedy answers, batched (`dflash data`)
#   features  the target's features of every sample, stored once (`dflash features`: the layers of every
#             FEATURE_CANDIDATES spacing, so other feature layers can be tried on the same cache); FEATURES=0
#             skips it and trains from the live target instead (the same math)
#   train     `dflash train --features`: LAYERS draft layers (MLP width INTERMEDIATE, 4096: 54 MB in bf16)
#             fed by FEATURE_LAYERS target layers, block 16,
#             the loss over the read-out list, the padding entry [PAD151665] as mask (the tokenizer fills every
#             embedding row, so <|MASK|> has none to take)
#   tau       held-out tau (whole block verified; fp32 and bf16, T=0 and T=1) on models/qwen-coder/heldout.jsonl
# Writes OUT_DIR/log.txt (with each stage's seconds), OUT_DIR/tau.json and the drafter in OUT_DIR/drafter.
# DEVICE, TARGET, HELDOUT, MASK_TOKEN, PROMPTS, TOKENS, DATA_BATCH, FEATURES, FEATURE_CANDIDATES, LAYERS,
# FEATURE_LAYERS, INTERMEDIATE, ANCHORS, EPOCHS, EVAL_PROMPTS, EVAL_TOKENS override the defaults (the test runs it on the CPU, tiny).
set -euo pipefail
OUT="${1:?usage: tools/gpu/train_code_drafter.sh OUT_DIR}"
PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$ROOT/packages/core/src:$ROOT/packages/cli/src:$ROOT/tools/demo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1  # the models are local; a stage killed at a limit keeps its log
DEVICE="${DEVICE:-cuda}" TARGET="${TARGET:-$ROOT/models/qwen-coder/target}"
HELDOUT="${HELDOUT:-$ROOT/models/qwen-coder/heldout.jsonl}" MASK_TOKEN="${MASK_TOKEN:-[PAD151665]}"
PROMPTS="${PROMPTS:-6000}" TOKENS="${TOKENS:-256}" DATA_BATCH="${DATA_BATCH:-128}"
FEATURES="${FEATURES:-1}" FEATURE_CANDIDATES="${FEATURE_CANDIDATES:-1,3,5}"
LAYERS="${LAYERS:-1}" FEATURE_LAYERS="${FEATURE_LAYERS:-1}" INTERMEDIATE="${INTERMEDIATE:-4096}" ANCHORS="${ANCHORS:-48}" EPOCHS="${EPOCHS:-3}"
EVAL_PROMPTS="${EVAL_PROMPTS:-16}" EVAL_TOKENS="${EVAL_TOKENS:-128}"
[[ -f "$TARGET/config.json" ]] || { echo "no target at $TARGET: run \`make code-model\` (or set TARGET)" >&2; exit 2; }
[[ "$FEATURES" == 0 || "$FEATURES" == 1 ]] || { echo "FEATURES=$FEATURES: expected 0 or 1" >&2; exit 2; }
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # absolute: the script runs from the repo root
export DFLASH_CACHE_DIR="$OUT/cache"
DTYPE=bf16 && [[ "$DEVICE" == cpu ]] && DTYPE=fp32  # bf16 on a GPU; the CPU test runs fp32
cd "$ROOT"
{
  "$PYTHON" -c "import torch, sys; d = sys.argv[1]; assert d == 'cpu' or torch.cuda.is_available(), 'no CUDA device'; \
print('device:', torch.cuda.get_device_name(0) if d != 'cpu' else 'cpu', '| torch', torch.__version__)" "$DEVICE"
  SECONDS=0
  [[ -f "$OUT/prompts.jsonl" ]] || "$PYTHON" -m dflash_demo.code_prompts --count "$PROMPTS" --seed 2 \
      --out "$OUT/prompts.jsonl"
  echo "prompts: $SECONDS s"; SECONDS=0
  "$PYTHON" -m dflash_cli data --target "$TARGET" --prompts "$OUT/prompts.jsonl" --out "$OUT/data" \
      --max-new-tokens "$TOKENS" --batch-size "$DATA_BATCH" --device "$DEVICE" --dtype "$DTYPE"
  echo "data: $SECONDS s"; SECONDS=0
  from_features=()
  if [[ "$FEATURES" == 1 ]]; then
    "$PYTHON" -m dflash_cli features --target "$TARGET" --data "$OUT/data" --out "$OUT/features" \
        --feature-layers "$FEATURE_CANDIDATES" --device "$DEVICE" --dtype "$DTYPE" --batch-tokens 32768 --no-progress
    from_features=(--features "$OUT/features")
  fi
  echo "features: $SECONDS s"; SECONDS=0
  "$PYTHON" -m dflash_cli train --target "$TARGET" --data "$OUT/data" "${from_features[@]}" --out "$OUT/drafter" \
      --device "$DEVICE" --dtype "$DTYPE" --layers "$LAYERS" --feature-layers "$FEATURE_LAYERS" --intermediate-size "$INTERMEDIATE" --block-size 16 \
      --anchors "$ANCHORS" --batch-size 8 --epochs "$EPOCHS" --loss-vocab list --mask-token "$MASK_TOKEN" \
      --checkpoint-every 200 --no-progress
  echo "train: $SECONDS s"; SECONDS=0
  "$PYTHON" -m dflash_demo.heldout --target "$TARGET" --drafter "$OUT/drafter" --prompts "$HELDOUT" \
      --count "$EVAL_PROMPTS" --max-new-tokens "$EVAL_TOKENS" --device "$DEVICE" --out "$OUT/tau.json"
  echo "held-out tau: $SECONDS s"
} 2>&1 | tee -a "$OUT/log.txt"
