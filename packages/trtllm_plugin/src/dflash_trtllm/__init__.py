"""DFlash for TensorRT-LLM: `DFlashDecodingConfig` options and TensorRT draft plans.

Importing this package never imports tensorrt_llm or tensorrt.
"""

__version__ = "0.1.0"
