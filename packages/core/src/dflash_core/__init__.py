"""dflash_core: DFlash block-diffusion speculative decoding, lossless, on Hugging Face targets.

The library: drafter, KV-injection graph, lossless decoder, training. It never imports a CLI, a
benchmark, the demo builder or a serving engine (see docs/architecture.md for the module map).
"""

from .autoregressive import generate_autoregressive
from .config import DFlashConfig, build_target_layer_ids
from .decoding import DecodeStream, GenerationResult, generate, generate_stream
from .drafter import Drafter, load_drafter
from .drafter_backend import DrafterBackend, DraftState
from .errors import CheckpointError, CompatibilityError, ConfigError, DFlashError, GenerationError
from .loading import Pair, load_pair, load_target, load_tokenizer
from .masks import block_attention_mask
from .pairing import check_compatibility, ensure_mask_token
from .profiling import DecodeProfile
from .target import TargetModel

__version__ = "0.1.0"

__all__ = [
    "CheckpointError", "CompatibilityError", "ConfigError", "DFlashConfig", "DFlashError", "DecodeProfile",
    "DecodeStream", "DraftState", "Drafter", "DrafterBackend", "GenerationError", "GenerationResult", "Pair",
    "TargetModel", "block_attention_mask", "build_target_layer_ids", "check_compatibility", "ensure_mask_token",
    "generate", "generate_autoregressive", "generate_stream", "load_drafter", "load_pair", "load_target",
    "load_tokenizer", "__version__",
]
