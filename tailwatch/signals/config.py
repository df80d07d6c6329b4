"""The signal API's config file: bearer tokens and their tenant scopes, the staleness
bound, and overrides of the autoscale and rollout policies.

    stale_after: 2m              # older data → 503, so KEDA's fallback applies
    tokens:
      - name: keda               # appears in logs, never the token
        sha256: 9f86d08…         # hex SHA-256 of the token (preferred: the file holds no secret)
        tenants: "*"             # every tenant
      - name: acme-dashboards
        env: ACME_TOKEN          # or: read the token from this environment variable
        tenants: [acme]
    autoscale: {target_utilization: 0.7, zones: 3, queue_age_slo_ms: 1000, scale_in_stabilization_minutes: 10}
    rollout: {min_requests: 100, promote_min_requests: 2000, error_alpha: 0.001, pause_cost_factor: 1.25}
    signals: {pool_window_minutes: 5, rollout_window_minutes: 30}
    shed:                        # GET /v1/shed/{pool} (signals/shed.py has every default)
      ladder: [delay_batch, shed_over_quota, shorten_context, route_to_smaller_model, reject_low_priority]
      tenant_priority: {acme: 2} # added to the traffic class's priority (realtime 3, batch 1, ...)
      quota_share: {globex: 0.3} # a tenant's share of a pool's capacity
      context_budget_tokens: 8000
    capacity_gpu_s_per_s: {llm-us-east-1a-realtime: 2.4}
    replica_shape:               # the physical bound per replica (default: autoscale.gpus_per_replica GPUs)
      llm-us-east-1b-realtime: {gpus_per_replica: 8, prefill_tokens_per_s: 60000, decode_tokens_per_s: 4000}

Every problem is reported as one line naming its place (`api.yaml: autoscale.zones: expected
`int` >= 1`): the file is read into the msgspec Structs below and the policies' own
Structs, whose `Meta` constraints hold the ranges the math needs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from tailwatch.signals.autoscale import AutoscalePolicy
from tailwatch.signals.live import CapacityGpuSPerS, SignalPolicy, SignalWindows
from tailwatch.signals.rollout import RolloutPolicy
from tailwatch.signals.shed import ShedPolicy
from tailwatch.planning.capacity import ReplicaShape
from tailwatch.config import ConfigStruct, load_struct
from tailwatch.config import parse_duration_s

ALL_TENANTS = "*"


class ApiConfigError(Exception):
    """The API config file is wrong: one line naming the problem."""


@dataclass(frozen=True)
class Principal:
    name: str
    tenants: frozenset[str] | None  # None: every tenant

    def sees(self, tenants: frozenset[str]) -> bool:
        """A scoped token sees an answer only if every tenant in it is in scope: an
        answer mixing in another tenant's traffic would show that tenant's data."""
        return self.tenants is None or (bool(tenants) and tenants <= self.tenants)

    def sees_labels(self, labels: dict[str, str]) -> bool:
        return self.tenants is None or labels.get("tenant") in self.tenants


DEFAULT_MAX_CONNECTIONS = 2000
MaxConnections = Annotated[int, Meta(ge=16, le=1_000_000)]


@dataclass(frozen=True)
class ApiConfig:
    stale_after_s: float = 120.0
    tokens: dict[str, Principal] = field(default_factory=dict)  # sha256 hex → principal; empty: no auth
    policy: SignalPolicy = field(default_factory=SignalPolicy)
    # Connections open at once on the HTTP port (at most the file-descriptor limit allows);
    # one more evicts the oldest that has not finished a request (streams/http_server.py).
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    @property
    def auth_required(self) -> bool:
        return bool(self.tokens)

    def authenticate(self, authorization: str | None) -> Principal | None:
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():  # the scheme is case-insensitive (RFC 9110)
            return None
        digest = hashlib.sha256(token.strip().encode()).hexdigest()
        found = None
        for known, principal in self.tokens.items():  # every token compared: the time says nothing
            if hmac.compare_digest(known, digest):
                found = principal
        return found


class TokenEntry(ConfigStruct):
    name: Annotated[str, Meta(min_length=1)]  # appears in logs, never the token
    sha256: Annotated[str, Meta(pattern="^[0-9a-fA-F]{64}$", description="hex SHA-256 of the token")] | None = None
    env: Annotated[str, Meta(min_length=1)] | None = None  # or: the environment variable holding the token
    tenants: Literal["*"] | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(min_length=1)] = ALL_TENANTS

    def __post_init__(self):
        if (self.sha256 is None) == (self.env is None):
            raise ValueError(f"token {self.name!r} needs exactly one of sha256 or env")


class ApiFile(ConfigStruct):
    """The API config file, as written (see the module doc)."""

    stale_after: str | float = "2m"
    max_connections: MaxConnections = DEFAULT_MAX_CONNECTIONS
    tokens: list[TokenEntry] = []
    autoscale: AutoscalePolicy = AutoscalePolicy()
    rollout: RolloutPolicy = RolloutPolicy()
    shed: ShedPolicy = ShedPolicy()
    signals: SignalWindows = SignalWindows()
    capacity_gpu_s_per_s: dict[str, CapacityGpuSPerS] = {}
    replica_shape: dict[str, ReplicaShape] = {}


def load_api_config(path: str | Path | None) -> ApiConfig:
    if path is None:
        return ApiConfig()
    where = str(path)
    f = load_struct(path, ApiFile, ApiConfigError)
    stale = parse_duration_s(f.stale_after, bare_unit="s")
    if stale is None or stale <= 0:
        raise ApiConfigError(f"{where}: stale_after must be a duration like 90s, 2m or 90 (seconds), got {f.stale_after!r}")
    policy = SignalPolicy(**msgspec.structs.asdict(f.signals), autoscale=f.autoscale, rollout=f.rollout, shed=f.shed,
                          capacity_gpu_s_per_s=f.capacity_gpu_s_per_s, replica_shape=f.replica_shape)
    return ApiConfig(stale_after_s=stale, tokens=_tokens(f.tokens, where), policy=policy,
                     max_connections=f.max_connections)


def _tokens(entries: list[TokenEntry], where: str) -> dict[str, Principal]:
    out: dict[str, Principal] = {}
    for i, t in enumerate(entries):
        at = f"{where}: tokens[{i}] ({t.name})"
        if t.sha256 is not None:
            digest = t.sha256.lower()
        else:
            # A secret mounted from a file often ends in a newline; the header never does.
            secret = (os.environ.get(t.env) or "").strip()
            if not secret:
                raise ApiConfigError(f"{at}: environment variable {t.env} is not set or empty")
            digest = hashlib.sha256(secret.encode()).hexdigest()
        if digest in out:
            raise ApiConfigError(f"{at}: the same token as {out[digest].name}")
        out[digest] = Principal(t.name, None if t.tenants == ALL_TENANTS else frozenset(t.tenants))
    return out
