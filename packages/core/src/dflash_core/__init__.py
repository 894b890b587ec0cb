"""dflash_core: DFlash block-diffusion speculative decoding, lossless, on Hugging Face targets.

The library: drafter, KV-injection graph, lossless decoder, training. It never imports a CLI, a
benchmark, the demo builder or a serving engine (see docs/architecture.md for the module map).
"""

from dflash_core.decode.autoregressive import generate_autoregressive
from dflash_core.model.config import DFlashConfig, build_target_layer_ids
from dflash_core.decode.loop import DecodeStream, GenerationResult, generate, generate_stream
from dflash_core.model.drafter import Drafter, load_drafter
from dflash_core.model.backend import DrafterBackend, DraftState
from dflash_core.errors import CheckpointError, CompatibilityError, ConfigError, DFlashError, GenerationError
from dflash_core.loading import Pair, load_pair, load_target, load_tokenizer
from dflash_core.model.masks import block_attention_mask
from dflash_core.target.pairing import check_compatibility, ensure_mask_token
from dflash_core.decode.profiling import DecodeProfile
from dflash_core.target.adapter import TargetModel

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "CompatibilityError", "ConfigError", "DFlashConfig", "DFlashError", "DecodeProfile",
    "DecodeStream", "DraftState", "Drafter", "DrafterBackend", "GenerationError", "GenerationResult", "Pair",
    "TargetModel", "block_attention_mask", "build_target_layer_ids", "check_compatibility", "ensure_mask_token",
    "generate", "generate_autoregressive", "generate_stream", "load_drafter", "load_pair", "load_target",
    "load_tokenizer", "__version__",
]
