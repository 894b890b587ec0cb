#!/usr/bin/env bash
# Everything this project asks of one short GPU lease, in one command: the benchmark of issue 10
# (tools/bench/gpu/run_bench.sh), then the drafter recipe of issue 9 (tools/demo/gpu/train_drafter.sh)
# in the time left, then one bundle of the results small enough to bring back.
#
#   tools/gpu/run_all.sh WORK_DIR [BUNDLE_DIR]        (budget: TOTAL_MIN, default 9 minutes)
#
# Assumes only torch (CUDA), transformers and safetensors (with their own dependencies); nothing is
# installed: the packages run from the source tree. Each phase runs under its own time limit and a
# failing phase does not stop the next, so one lease yields what it can:
# - the benchmark gets at most BENCH_MIN (default 4) minutes, on 12 prompts of 128 new tokens unless
#   PROMPTS / TOKENS say otherwise;
# - training gets what is left of TOTAL_MIN less a minute for the bundle as a hard limit, and 90 s less
#   as the training script's own BUDGET_MIN (its continuations start only if they end in time; a minute
#   of it is kept for the held-out tau).
# Writes WORK_DIR/{bench,train}/ (each script's own outputs), WORK_DIR/summary.txt (the machine, each
# phase's exit status and seconds, the headline figures) and WORK_DIR/results.tgz (the benchmark's files,
# the training's log, tau.json and published drafter); with BUNDLE_DIR, copies those two files there (a
# folder that is fetched back). DEVICE, PYTHON and the two scripts' own variables (PROMPTS, TOKENS,
# BATCHES, REPEATS; TRAIN_PROMPTS, ...) pass through (the test runs it on the CPU, tiny).
set -uo pipefail
WORK="${1:?usage: tools/gpu/run_all.sh WORK_DIR [BUNDLE_DIR]}"
BUNDLE="${2:-}"
TOTAL_MIN="${TOTAL_MIN:-9}" BENCH_MIN="${BENCH_MIN:-4}"
[[ "$TOTAL_MIN" =~ ^[1-9][0-9]*$ && "$BENCH_MIN" =~ ^[1-9][0-9]*$ ]] || {  # timeout 0 would mean no limit at all
  echo "run_all.sh: TOTAL_MIN=$TOTAL_MIN BENCH_MIN=$BENCH_MIN: expected whole minutes, at least 1" >&2; exit 2; }
export PROMPTS="${PROMPTS:-12}" TOKENS="${TOKENS:-128}"
export PYTHON="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1  # the models are local; a lease's machine may reach no network at all
export PYTHONUNBUFFERED=1  # a phase killed at its limit keeps everything it printed in its log
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
mkdir -p "$WORK" && WORK="$(cd "$WORK" && pwd)"
SUMMARY="$WORK/summary.txt"
START=$(date +%s)

seconds_since() { echo $(( $(date +%s) - $1 )); }

{
  echo "run_all: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: not found"
  "$PYTHON" -c "import sys, torch, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, \
'| transformers', transformers.__version__, '| cuda', torch.cuda.is_available())"
} > "$SUMMARY" 2>&1

phase_start=$(date +%s)
timeout --signal=INT --kill-after=20 "$(( BENCH_MIN * 60 ))" bash "$ROOT/tools/bench/gpu/run_bench.sh" "$WORK/bench"
bench_rc=$?
echo "bench: exit $bench_rc after $(seconds_since "$phase_start") s (limit $(( BENCH_MIN * 60 )) s)" >> "$SUMMARY"

# What is left for training, less a minute for the bundle. The training script's own budget is 90 s under
# that: its continuations are priced at the stage before them, so the hard limit keeps a margin for its tau.
left_s=$(( TOTAL_MIN * 60 - $(seconds_since "$START") - 60 ))
if (( left_s >= 180 )); then
  phase_start=$(date +%s)
  budget_min=$(awk "BEGIN { printf \"%.1f\", ($left_s - 90) / 60 }")
  BUDGET_MIN="$budget_min" timeout --signal=INT --kill-after=20 "$left_s" \
      bash "$ROOT/tools/demo/gpu/train_drafter.sh" "$WORK/train"
  train_rc=$?
  echo "train: exit $train_rc after $(seconds_since "$phase_start") s (budget $budget_min min, limit $left_s s)" >> "$SUMMARY"
else
  train_rc=3
  echo "train: skipped, $left_s s left (needs 180)" >> "$SUMMARY"
fi

"$PYTHON" - "$WORK" >> "$SUMMARY" 2>&1 <<'EOF'
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
for e2e in sorted((work / "bench").glob("e2e_*.json")):
    for row in json.loads(e2e.read_text())["data"]["results"]:
        if row.get("speedup") is not None:
            print(f"e2e {row['dtype']} batch {row['batch_size']} {row['method']}: {row['speedup']:.2f}x"
                  + (f" tau {row['tau']:.2f}" if row.get("tau") else ""))
tau = work / "train" / "tau.json"
if tau.is_file():
    summary = json.loads(tau.read_text())
    print("held-out tau:", json.dumps(summary["tau"]), "| budget:", json.dumps(summary["budget"]),
          "| seconds:", json.dumps(summary["seconds"]))
EOF
echo "total: $(seconds_since "$START") s" >> "$SUMMARY"

# Only what a reader needs: the benchmark's files and the training's log, tau and published drafter.
kept=(summary.txt)
for path in bench train/log.txt train/tau.json train/work/drafter; do [[ -e "$WORK/$path" ]] && kept+=("$path"); done
tar -czf "$WORK/results.tgz" -C "$WORK" --exclude=cache "${kept[@]}"
[[ -n "$BUNDLE" ]] && mkdir -p "$BUNDLE" && cp "$SUMMARY" "$WORK/results.tgz" "$BUNDLE/"
cat "$SUMMARY"
(( bench_rc == 0 && train_rc == 0 ))
