"""The SGLang server as a child process: the engine-agnostic supervision of dflash_serving.supervise.

Kept as this module's names (`serve_forever`, `ServerDied`) for callers of dflash_sglang.
"""

from dflash_serving.supervise import STOP_GRACE_S, Server, ServerDied, healthy, last_error_line, port_free, serve_forever

__all__ = ["STOP_GRACE_S", "Server", "ServerDied", "healthy", "last_error_line", "port_free", "serve_forever"]
