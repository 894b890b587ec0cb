"""dflash_core: DFlash block-diffusion speculative decoding, lossless, on Hugging Face targets."""

from .compat import check_compatibility, ensure_mask_token
from .config import DFlashConfig, build_target_layer_ids
from .decoding import DecodeStream, GenerationResult, generate, generate_stream
from .drafter import Drafter, load_drafter
from .errors import CheckpointError, CompatibilityError, ConfigError, DFlashError, GenerationError
from .masks import block_attention_mask
from .target import TargetModel

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "CompatibilityError", "ConfigError", "DFlashConfig", "DFlashError", "DecodeStream",
    "Drafter", "GenerationError", "GenerationResult", "TargetModel", "block_attention_mask",
    "build_target_layer_ids", "check_compatibility", "ensure_mask_token", "generate", "generate_stream",
    "load_drafter", "__version__",
]
