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
    capacity_gpu_s_per_s: {llm-us-east-1a-realtime: 2.4}
    replica_shape:               # the physical bound per replica (default: autoscale.gpus_per_replica GPUs)
      llm-us-east-1b-realtime: {gpus_per_replica: 8, prefill_tokens_per_s: 60000, decode_tokens_per_s: 4000}

Every problem is reported as one line naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from signals.autoscale import AutoscalePolicy
from signals.live import SignalPolicy
from signals.rollout import RolloutPolicy
from slo.capacity import ReplicaShape
from slo.config_file import read_yaml_mapping
from slo.spec import parse_duration_s

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


@dataclass(frozen=True)
class ApiConfig:
    stale_after_s: float = 120.0
    tokens: dict[str, Principal] = field(default_factory=dict)  # sha256 hex → principal; empty: no auth
    policy: SignalPolicy = field(default_factory=SignalPolicy)

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


def load_api_config(path: str | Path | None) -> ApiConfig:
    if path is None:
        return ApiConfig()
    where = str(path)
    raw = read_yaml_mapping(path, ApiConfigError)
    known = {"stale_after", "tokens", "autoscale", "rollout", "signals", "capacity_gpu_s_per_s", "replica_shape"}
    for key in raw:
        if key not in known:
            raise ApiConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    stale = parse_duration_s(raw.get("stale_after", "2m"), bare_unit="s")
    if stale is None or stale <= 0:
        raise ApiConfigError(f"{where}: stale_after must be a duration like 90s, 2m or 90 (seconds), got {raw.get('stale_after')!r}")
    tokens = _tokens(raw.get("tokens") or [], where)
    autoscale = _override(AutoscalePolicy(), raw.get("autoscale"), f"{where}: autoscale")
    rollout = _override(RolloutPolicy(), raw.get("rollout"), f"{where}: rollout")
    capacity = raw.get("capacity_gpu_s_per_s") or {}
    if not isinstance(capacity, dict) or any(not _positive(v) or not math.isfinite(v) for v in capacity.values()):
        raise ApiConfigError(f"{where}: capacity_gpu_s_per_s must map pool names to positive numbers")
    shapes = _replica_shapes(raw.get("replica_shape"), where)
    policy = _override(SignalPolicy(autoscale=autoscale, rollout=rollout, capacity_gpu_s_per_s=dict(capacity),
                                    replica_shape=shapes),
                       raw.get("signals"), f"{where}: signals",
                       skip=("autoscale", "rollout", "capacity_gpu_s_per_s", "replica_shape"))
    if autoscale.min_replicas > autoscale.max_replicas:
        raise ApiConfigError(f"{where}: autoscale.min_replicas is above max_replicas")
    if policy.history_minutes < max(policy.pool_window_minutes + 1, policy.rollout_window_minutes):
        raise ApiConfigError(f"{where}: signals.history_minutes must cover pool_window_minutes + 1 and rollout_window_minutes")
    return ApiConfig(stale_after_s=stale, tokens=tokens, policy=policy)


def _replica_shapes(raw, where: str) -> dict[str, ReplicaShape]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ApiConfigError(f"{where}: replica_shape must map pool names to {{gpus_per_replica, prefill_tokens_per_s, "
                             "decode_tokens_per_s}")
    out = {}
    for pool, shape in raw.items():
        if not isinstance(shape, dict) or not shape:
            raise ApiConfigError(f"{where}: replica_shape.{pool} must be a mapping")
        # Token throughputs are optional; GPUs per replica defaults to one.
        out[str(pool)] = _override(ReplicaShape(prefill_tokens_per_s=0.0, decode_tokens_per_s=0.0), shape,
                                   f"{where}: replica_shape.{pool}")
    return out


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _override(base, raw, where: str, skip: tuple[str, ...] = ()):
    if raw is None:
        return base
    if not isinstance(raw, dict):
        raise ApiConfigError(f"{where} must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(base) if f.name not in skip}
    changes = {}
    for key, value in raw.items():
        if key not in fields:
            raise ApiConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(fields))})")
        current = getattr(base, key)
        lo, hi, text = RANGES.get(key, (0.0, math.inf, "a number ≥ 0"))
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and lo <= value <= hi
        if ok and key in OPEN_AT_ZERO:
            ok = value > 0
        if not ok:
            raise ApiConfigError(f"{where}.{key} must be {text}, got {value!r}")
        if isinstance(current, int) and not isinstance(current, bool) and value != int(value):
            raise ApiConfigError(f"{where}.{key} must be a whole number, got {value!r}")
        changes[key] = type(current)(value)
    return dataclasses.replace(base, **changes)


# Ranges of policy values that the math needs (a division, a ceiling, a window): checked
# when the file is loaded, so a bad value is a one-line error and not a worker that dies
# on its first data.
RANGES = {
    "target_utilization": (0.0, 1.0, "in (0, 1]"),
    "objective": (0.0, 0.999999, "in (0, 1)"),
    "zones": (1, 1000, "a whole number from 1 to 1000"),
    "pool_window_minutes": (1, 1440, "from 1 to 1440"),
    "rollout_window_minutes": (1, 1440, "from 1 to 1440"),
    "history_minutes": (1, 1440, "from 1 to 1440"),
    "sustained_minutes": (1, 1440, "from 1 to 1440"),
    "capacity_history_days": (1, 365, "from 1 to 365"),
    "max_replicas": (1, 10**7, "from 1 to 10,000,000"),
    "min_replicas": (0, 10**7, "from 0 to 10,000,000"),
    "gpus_per_replica": (0.0, 4096, "a number in (0, 4096]"),
    "error_alpha": (0.0, 0.5, "in (0, 0.5]"),
    "latency_alpha": (0.0, 0.5, "in (0, 0.5]"),
    "cost_alpha": (0.0, 0.5, "in (0, 0.5]"),
    "rollback_error_factor": (1.0, 1e6, "a number ≥ 1"),
    "burn_short_minutes": (1, 1440, "from 1 to 1440"),
    "cost_min_minutes": (2, 1440, "from 2 to 1440"),
}
OPEN_AT_ZERO = {"target_utilization", "objective", "default_capacity_gpu_s_per_s", "queue_age_slo_ms", "gpus_per_replica",
                "error_alpha", "latency_alpha", "cost_alpha"}


_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _tokens(raw, where: str) -> dict[str, Principal]:
    if not isinstance(raw, list):
        raise ApiConfigError(f"{where}: tokens must be a list")
    out: dict[str, Principal] = {}
    for i, t in enumerate(raw):
        at = f"{where}: tokens[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise ApiConfigError(f"{at} needs a name")
        if ("sha256" in t) == ("env" in t):
            raise ApiConfigError(f"{at} ({t['name']}) needs exactly one of sha256 or env")
        if "sha256" in t:
            digest = str(t["sha256"]).lower()
            if not _HEX64.match(digest):
                raise ApiConfigError(f"{at} ({t['name']}): sha256 must be 64 hex digits")
        else:
            # A secret mounted from a file often ends in a newline; the header never does.
            secret = (os.environ.get(str(t["env"])) or "").strip()
            if not secret:
                raise ApiConfigError(f"{at} ({t['name']}): environment variable {t['env']} is not set")
            digest = hashlib.sha256(secret.encode()).hexdigest()
        scope = t.get("tenants", ALL_TENANTS)
        if scope == ALL_TENANTS:
            tenants = None
        elif isinstance(scope, list) and scope and all(isinstance(x, str) and x for x in scope):
            tenants = frozenset(scope)
        else:
            raise ApiConfigError(f"{at} ({t['name']}): tenants must be \"*\" or a non-empty list of tenant names")
        if digest in out:
            raise ApiConfigError(f"{at} ({t['name']}): the same token as {out[digest].name}")
        out[digest] = Principal(t["name"], tenants)
    return out
