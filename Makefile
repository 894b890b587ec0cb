# The two README commands: `make demo` (main job on the bundled demo models) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; a GPU machine can override TORCH.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PKGS   := packages/core/pyproject.toml tools/convert/pyproject.toml tools/bench/pyproject.toml \
          tools/demo/pyproject.toml packages/sglang_plugin/pyproject.toml packages/trtllm_plugin/pyproject.toml

SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

.PHONY: setup demo test models bench clean sglang-env check-sglang

setup: $(STAMP)

$(STAMP): $(PKGS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet \
		-e "packages/core[onnx]" -e tools/convert -e tools/bench -e tools/demo \
		-e packages/sglang_plugin -e packages/trtllm_plugin \
		"pytest>=8"
	touch $(STAMP)

# SGLang pins a CUDA torch build (about 11 GB, 4 minutes); it gets its own environment. On a
# machine where it cannot be installed the SGLang tests are skipped with the reason.
sglang-env: $(SGLANG_STAMP)

$(SGLANG_STAMP): packages/sglang_plugin/pyproject.toml packages/core/pyproject.toml
	$(PYTHON) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(SGLANG_VENV)/bin/python -m pip install --quiet "sglang==0.5.23"
	$(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -e packages/core -e packages/sglang_plugin
	touch $(SGLANG_STAMP)

check-sglang: setup sglang-env
	$(BIN)/python -m pytest -q tests/plugins/test_sglang_native.py

demo: setup
	$(BIN)/dflash demo

test: setup
	-@$(MAKE) --no-print-directory sglang-env || echo "sglang-env could not be built: SGLang tests will be skipped"
	$(BIN)/python -m pytest -q

models: setup
	$(BIN)/python -m dflash_demo.build

# Every figure in docs/benchmarks.md comes from these commands (about 3 hours on the 2-core CPU,
# most of it training the drafter variants; every training run resumes if interrupted).
bench: setup
	$(BIN)/dflash bench drafter --out docs/results
	$(BIN)/dflash bench e2e --out docs/results --dtypes bf16,fp32 --temperatures 0,1 --prompts 24
	$(BIN)/python -m dflash_bench.divergence --out docs/results --prompts 24
	$(BIN)/dflash-convert models/demo/drafter --to onnx --out runs/demo/onnx --force
	$(BIN)/dflash bench e2e --out docs/results --name backends --title "Drafter backends: torch eager vs ONNX Runtime" \
		--pair torch=models/demo/target:models/demo/drafter \
		--pair onnxruntime=models/demo/target:runs/demo/onnx:onnxruntime --dtypes bf16,fp32 --temperatures 0 --prompts 12
	$(BIN)/python -m dflash_demo.variants --out docs/results --epochs 0.5 --prompts 24 --temperatures 0
	$(BIN)/python -m dflash_demo.variants --out docs/results --epochs 2 --only L1-B16,L2-B16 --name variants_e2 \
		--prompts 24 --temperatures 0

clean:
	rm -rf $(VENV) $(SGLANG_VENV) runs
