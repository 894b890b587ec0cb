"""Entry point of the `sglang.srt.plugins` group, called (without arguments) in every SGLang process.

SGLang 0.5.23 serves DFlash natively, so nothing is replaced: the plugin registers one BEFORE hook
on `_handle_dflash` (SGLang's DFLASH argument check) that verifies the draft directory first —
manifest hashes of a dflash-convert output, a parseable DFlash config, the block size — so a
damaged or mismatched drafter fails at launch with one clear line instead of loading silently, and an
AROUND hook that lets targets without a DFLASH capture method but with EAGLE-3's (Qwen2) serve it (`targets`).
In a process of SGLang's CPU engine (`SGLANG_USE_CPU_ENGINE=1`) it also registers the patches of
`cpu.patches` that let the DFLASH worker run on a CPU; elsewhere they are never registered.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("dflash_sglang")
HOOK_TARGET = "sglang.srt.arg_groups.speculative_hook._handle_dflash"


def register() -> None:
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError:  # called outside SGLang (e.g. a test of the entry point): nothing to hook
        logger.info("dflash-sglang plugin loaded (sglang not importable: no hook registered)")
        return
    from . import targets
    from .cpu.patches import register_cpu_patches
    from .preflight import before_handle_dflash

    HookRegistry.register(HOOK_TARGET, before_handle_dflash, HookType.BEFORE)
    HookRegistry.register(targets.HOOK_TARGET, targets.around_aux_capture, HookType.AROUND)
    patched = register_cpu_patches()
    logger.info("dflash-sglang plugin loaded: draft directories are checked before DFLASH starts%s",
                f"; CPU patches: {', '.join(patched)}" if patched else "")
