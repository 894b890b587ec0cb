# The two README commands: `make demo` (main job on the bundled demo models) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; a GPU machine can override TORCH.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PKGS   := packages/core/pyproject.toml tools/convert/pyproject.toml \
          packages/sglang_plugin/pyproject.toml packages/trtllm_plugin/pyproject.toml

.PHONY: setup demo test models bench clean

setup: $(STAMP)

$(STAMP): $(PKGS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet \
		-e "packages/core[onnx,bench]" -e tools/convert -e packages/sglang_plugin -e packages/trtllm_plugin \
		"pytest>=8"
	touch $(STAMP)

demo: setup
	$(BIN)/dflash demo

test: setup
	$(BIN)/python -m pytest -q

models: setup
	$(BIN)/python -m dflash_core.demo.build

bench: setup
	$(BIN)/dflash bench --out docs/results

clean:
	rm -rf $(VENV) runs
