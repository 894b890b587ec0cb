"""Run an engine's server launch as a child process: log it, wait for /health, forward Ctrl-C, report its death.

The child gets its own session (process group), so stopping it reaches every process the engine
spawns (SGLang's scheduler and detokenizer, vLLM's engine core and workers); SIGINT first (the
engine's own shutdown), SIGKILL if it lingers. Engine-agnostic: the launch names the engine.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from .launch import Launch, ServeError

STOP_GRACE_S = 20  # engines exit within a few seconds of SIGINT; then the whole group is killed
_ERROR_LINE = re.compile(r"(\w+(Error|Exception)\b|error:|Error:)")


class ServerDied(ServeError):
    """The engine's server exited on its own; the message carries its last error line."""


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def last_error_line(lines) -> str:
    """The last line that names an error (a traceback's final line, an argparse error), else the last line."""
    lines = [line.strip() for line in lines if line.strip()]
    for line in reversed(lines):
        if _ERROR_LINE.search(line):
            return line
    return lines[-1] if lines else "no output"


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Server:
    """A started launch; its output goes to `log` (and the last lines are kept for errors)."""

    def __init__(self, launch: Launch, log: Path) -> None:
        self.launch, self.log = launch, log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._tail: collections.deque[str] = collections.deque(maxlen=400)
        self.process = subprocess.Popen(launch.command, env={**os.environ, **launch.env}, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, bufsize=1,
                                        start_new_session=True, errors="replace")
        self._reader = threading.Thread(target=self._copy_output, daemon=True)
        self._reader.start()

    def _copy_output(self) -> None:
        with open(self.log, "a", encoding="utf-8") as out:
            for line in self.process.stdout:
                out.write(line)
                out.flush()
                self._tail.append(line)

    def died(self) -> ServerDied:
        self._reader.join(timeout=5)
        return ServerDied(f"{self.launch.engine} exited with status {self.process.returncode}: {last_error_line(self._tail)} "
                          f"(full log: {self.log})")

    def wait_ready(self, timeout: float) -> None:
        """Block until /health answers 200; raise ServerDied if the process exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self.died()
            if healthy(self.launch.url):
                return
            time.sleep(1.0)
        self.stop()
        raise ServeError(f"{self.launch.engine} did not answer {self.launch.url}/health within {timeout:.0f} s (log: {self.log}).")

    def stop(self) -> int:
        """SIGINT to the server's process group (as Ctrl-C would), then SIGKILL after a grace period."""
        if self.process.poll() is None:
            for sig, wait in ((signal.SIGINT, STOP_GRACE_S), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.process.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        try:  # children the engine spawned may outlive the leader for a moment
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.process.returncode if self.process.returncode is not None else -9


def serve_launch(launch: Launch, cache: Path, *, notes: Iterable[str] = (), print_command: bool = False,
                 log: Path | None = None, timeout: float = 900) -> int:
    """What `dflash serve` does with a checked launch: print its command line (`print_command`), or print each
    note to stderr and serve until Ctrl-C (the log under cache/logs unless `log` is given)."""
    if print_command:
        print(launch.shell())
        return 0
    for note in notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    log = log or Path(cache) / "logs" / f"server-{launch.port}-{time.strftime('%Y%m%d-%H%M%S')}.log"
    return serve_forever(launch, log, timeout=timeout)


def serve_forever(launch: Launch, log: Path, *, timeout: float = 900,
                  say: Callable[[str], None] = lambda s: print(s, flush=True)) -> int:
    """Start the server, print its URL once healthy, and keep it until Ctrl-C/SIGTERM (0) or its own death (raise)."""
    if not port_free(launch.port):
        raise ServeError(f"port {launch.port} is in use; expected a free port (choose one with --port).")
    previous = _catch_stop_signals()
    server = Server(launch, log)
    try:
        say(f"starting {launch.engine} ({launch.method}, device {launch.device}); log: {log}")
        server.wait_ready(timeout)
        say(f"serving on {launch.url}  (OpenAI API at {launch.url}/v1; Ctrl-C stops it)")
        server.process.wait()
        raise server.died()
    except KeyboardInterrupt:
        print(f"dflash serve: stopping {launch.engine}", file=sys.stderr, flush=True)
        server.stop()
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _catch_stop_signals() -> dict:
    """Ctrl-C and SIGTERM become KeyboardInterrupt here (even where a shell started us with SIGINT ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}


def _interrupt(signum, frame):
    raise KeyboardInterrupt
