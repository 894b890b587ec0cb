"""Entry point of the `sglang.srt.plugins` group, called once in every SGLang server process."""

from __future__ import annotations

import logging

logger = logging.getLogger("dflash_sglang")


def register() -> None:
    """Nothing to patch: SGLang 0.5.23 serves DFlash natively (`--speculative-algorithm DFLASH`).

    The plugin only records that the dflash-sglang adapter is present, so `sglang` logs show it.
    """
    logger.info("dflash-sglang plugin loaded: drafters converted by dflash-convert load with --speculative-algorithm DFLASH")
