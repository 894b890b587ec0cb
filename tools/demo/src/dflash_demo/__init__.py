"""The embedded default: a small Qwen3 target and its DFlash drafter, trained on the stdlib's source."""
