#!/usr/bin/env bash
# The end-to-end benchmark of `dflash bench e2e` on one CUDA GPU, from a plain checkout of this repo.
#
#   tools/bench/gpu/run_bench.sh OUT_DIR            (a few minutes on one GPU; budget: 8)
#
# Assumes only torch (CUDA), transformers and safetensors (with their own dependencies: numpy,
# tokenizers, tqdm, pyyaml); nothing is installed: the packages run from the source tree. Without
# matplotlib the plots are skipped; the JSON and Markdown are written. Writes into OUT_DIR:
# e2e_bf16.{json,md}, e2e_fp32.{json,md}, step_cost_{bf16,fp32}.{json,md} and log.txt (everything printed).
# One benchmark per dtype, bf16 first (what a GPU serves in): each writes its files when it ends, so a run
# stopped part-way keeps what finished, and one that fails (e.g. an fp32 output differing from the target
# alone's) does not stop the others; the exit status is non-zero if any failed.
# DEVICE, PROMPTS, TOKENS, BATCHES, REPEATS override the defaults (the test runs it on the CPU, tiny).
set -euo pipefail
OUT="${1:?usage: tools/bench/gpu/run_bench.sh OUT_DIR}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"  # absolute: the script runs from the repo root
DEVICE="${DEVICE:-cuda}" PROMPTS="${PROMPTS:-16}" TOKENS="${TOKENS:-192}" BATCHES="${BATCHES:-1,4,16}"
REPEATS="${REPEATS:-20}" PYTHON="${PYTHON:-python3}"
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
export PYTHONPATH="$ROOT/packages/core/src:$ROOT/packages/cli/src:$ROOT/tools/bench/src:$ROOT/tools/demo/src${PYTHONPATH:+:$PYTHONPATH}"
export DFLASH_CACHE_DIR="$OUT/cache"
cd "$ROOT"
failed=0
attempt() { "$@" || { echo "failed (exit $?): ${*:3}"; failed=1; }; }
{
  "$PYTHON" -c "import torch, sys; d = sys.argv[1]; assert d == 'cpu' or torch.cuda.is_available(), 'no CUDA device'; \
print('device:', torch.cuda.get_device_name(0) if d != 'cpu' else 'cpu', '| torch', torch.__version__)" "$DEVICE"
  for dtype in bf16 fp32; do
    attempt "$PYTHON" -m dflash_cli bench e2e --device "$DEVICE" --dtypes "$dtype" \
        --methods ar,dflash,dflash_drafter,dflash_full,prompt_lookup,assisted \
        --batch-sizes "$BATCHES" --prompts "$PROMPTS" --max-new-tokens "$TOKENS" --out "$OUT" --name "e2e_$dtype" --force
  done
  for dtype in bf16 fp32; do
    attempt "$PYTHON" -m dflash_bench.step_cost --device "$DEVICE" --dtype "$dtype" --repeats "$REPEATS" --out "$OUT" \
        --name "step_cost_$dtype"
  done
  exit "$failed"
} 2>&1 | tee "$OUT/log.txt"
