"""Entry point of the `vllm.general_plugins` group, called (without arguments) in every vLLM process.

vLLM 0.32 serves DFlash natively; the plugin makes its drafter draft the whole block it was trained on
whatever draft length a step schedules (`drafting`, every platform), and on vLLM's CPU build installs the
fixes of `cpu.patches` (the stand-ins of Triton kernels that vLLM registers when a worker starts; where vLLM
runs Triton itself, none). Checks of the drafter run before vLLM starts (`dflash serve`, preflight.py), not
here.
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
    from .drafting import register_whole_block

    fixed = register_whole_block() + register_cpu_fixes()
    # under vLLM's own logger, so that the line reaches its log
    logging.getLogger("vllm.dflash_vllm").info("dflash-vllm plugin loaded%s",
                                               f"; fixes: {', '.join(fixed)}" if fixed else "")
