"""Entry point of the `vllm.general_plugins` group, called (without arguments) in every vLLM process.

vLLM 0.32 serves DFlash natively, so nothing is replaced there; on its CPU build the plugin installs
the fixes of `cpu.patches` (the stand-ins of Triton kernels that vLLM registers when a worker starts).
Where vLLM runs Triton itself, nothing is installed. Checks of the drafter run before vLLM starts
(`dflash serve`, preflight.py), not here.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("dflash_vllm")


def register() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:  # called outside vLLM (a test of the entry point): nothing to fix
        logger.info("dflash-vllm plugin loaded (vllm not importable: nothing installed)")
        return
    from .cpu.patches import register_cpu_fixes

    fixed = register_cpu_fixes()
    # under vLLM's own logger, so that the line reaches its log
    logging.getLogger("vllm.dflash_vllm").info("dflash-vllm plugin loaded%s",
                                               f"; CPU fixes: {', '.join(fixed)}" if fixed else "")
