"""A tenant starving the others, per pool: one tenant's share of the pool's GPU time (its
batch slots, held for as long as its requests run) rises well over its own baseline while
the other tenants' queue age rises with it. A noisy neighbour on a pool that still has room
is no incident (nobody waits), and a queue that grows for everyone while the mix holds is
overload, for `queue_age`; the pair is the signature of a pool without tenant-aware quotas.

Shares and waits are ratios of the window's sums over the baseline's (the `baseline_minutes`
before the window), never averages of per-minute ratios; the others' queue age is their
requests-weighted mean of the buckets' queue p95s. The detection names the pool and the
tenant; its evidence carries both shares and both waits.
"""

from __future__ import annotations

from tailwatch.config import ConfigStruct, Count, Factor, Fraction, Minutes, NonNegative
from tailwatch.detectors.core import DetectionEvent, Finding, History, Minute, Tracker

TENANT_STARVING = "tenant_starving"
BY = ("pool", "model", "zone", "tenant")  # model and zone name the pool's slice for dashboards and scoring
READ = ("gpu_seconds", "requests", "queue_ms_p95")  # what a tenant's minute is read from


class TenantStarvingConfig(ConfigStruct):
    enabled: bool = True
    window_minutes: Minutes = 3
    share_min: Fraction = 0.35  # the tenant's share of the pool's GPU time over the window at or above this ...
    share_rise_factor: Factor = 1.5  # ... and at or above this multiple of its baseline share ...
    queue_rise_factor: Factor = 2.0  # ... while the other tenants' queue p95 is at or above this multiple of theirs ...
    queue_ms_min: NonNegative = 250.0  # ... and at or above this
    min_requests: Count = 100  # the other tenants' requests in the window
    baseline_minutes: Minutes = 60
    min_baseline_minutes: Minutes = 15
    clear_minutes: Minutes = 3


# Per tenant and minute: GPU-seconds, requests, and the weighted sum and weight of its queue p95.
Reading = tuple[float, int, float, int]


def _totals(minutes: list[dict[str, Reading]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for tenants in minutes:
        for tenant, (gpu_s, requests, weighted, weight) in tenants.items():
            acc = out.get(tenant)
            if acc is None:
                out[tenant] = [gpu_s, requests, weighted, weight]
            else:
                acc[0] += gpu_s
                acc[1] += requests
                acc[2] += weighted
                acc[3] += weight
    return out


def _queue_p95(rows: list[list[float]]) -> float | None:
    weight = sum(r[3] for r in rows)
    return sum(r[2] for r in rows) / weight if weight else None


class TenantStarvingDetector:
    name = TENANT_STARVING

    def __init__(self, cfg: TenantStarvingConfig):
        self.cfg = cfg
        self.history = History(cfg.window_minutes + cfg.baseline_minutes)
        self.tracker = Tracker(TENANT_STARVING, cfg.clear_minutes)

    def label_sets(self) -> tuple[tuple[str, ...], ...]:
        return (BY,)

    def observe(self, m: Minute) -> list[DetectionEvent]:
        cfg = self.cfg
        per_pool: dict[str, dict[str, Reading]] = {}
        last: dict[str, dict[str, str]] = {}  # per pool, its last slice's labels
        for _key, slice_labels, gpu_seconds, requests, queue_ms_p95 in m.readings(BY, READ):
            pool = slice_labels["pool"]
            if not pool:
                continue
            reported = requests if queue_ms_p95 is not None else 0
            tenants = per_pool.get(pool)
            if tenants is None:
                tenants = per_pool[pool] = {}
            tenants[slice_labels["tenant"]] = (
                float(gpu_seconds), int(requests), (queue_ms_p95 or 0.0) * reported, reported)
            last[pool] = slice_labels
        for pool, tenants in per_pool.items():
            labels = last[pool]
            self.history.add((("pool", pool),), {"pool": pool, "model": labels["model"], "zone": labels["zone"]},
                             m.minute, tenants)
        self.history.trim(m.minute)
        findings = []
        for key in sorted(self.history.values):
            window = self.history.window(key, m.minute, cfg.window_minutes)
            if not window:
                continue
            # The window's own conditions first: the baseline (an hour of tenants) is summed
            # only for a pool where one tenant holds most of the GPU time while others wait.
            candidate = self.candidate(window)
            if candidate is None:
                continue
            base = self.history.before(key, m.minute, cfg.window_minutes, cfg.baseline_minutes)
            if len(base) < cfg.min_baseline_minutes:
                continue
            evidence = self.judge(candidate, base)
            if evidence is not None:
                tenant = str(evidence.pop("tenant"))
                findings.append(Finding({**self.history.labels[key], "tenant": tenant},
                                        {**evidence, "window_minutes": cfg.window_minutes}))
        return self.tracker.update(m.minute, findings)

    def candidate(self, window: list[dict[str, Reading]]) -> tuple[str, float, float, dict[str, list[float]]] | None:
        """The window's side of the test: its largest tenant by GPU time, that tenant's share
        and the others' queue p95, when the share, the others' requests and their wait are
        each at or above their floors; else None."""
        cfg = self.cfg
        now = _totals(window)
        pool_gpu_s = sum(v[0] for v in now.values())
        if pool_gpu_s <= 0:
            return None
        tenant = max(now, key=lambda t: (now[t][0], t))
        share = now[tenant][0] / pool_gpu_s
        others_now = [v for t, v in now.items() if t != tenant]
        wait = _queue_p95(others_now)
        if share < cfg.share_min or sum(v[1] for v in others_now) < cfg.min_requests \
                or wait is None or wait < cfg.queue_ms_min:
            return None
        return tenant, share, wait, now

    def judge(self, candidate: tuple[str, float, float, dict[str, list[float]]],
              base: list[dict[str, Reading]]) -> dict | None:
        """A candidate from `candidate` against the baseline minutes: its evidence, or None."""
        cfg = self.cfg
        tenant, share, wait, now = candidate
        before = _totals(base)
        base_gpu_s = sum(v[0] for v in before.values())
        if base_gpu_s <= 0:
            return None
        share_base = before.get(tenant, [0.0] * 4)[0] / base_gpu_s
        others_now = [v for t, v in now.items() if t != tenant]
        others_base = [v for t, v in before.items() if t != tenant]
        wait_base = _queue_p95(others_base)
        if not wait_base:
            return None
        if share >= cfg.share_rise_factor * share_base and wait >= cfg.queue_rise_factor * wait_base:
            own = _queue_p95([now[tenant]])
            return {"tenant": tenant, "gpu_time_share": round(share, 4), "gpu_time_share_baseline": round(share_base, 4),
                    "others_queue_ms_p95": round(wait, 1), "others_queue_ms_p95_baseline": round(wait_base, 1),
                    "tenant_queue_ms_p95": round(own, 1) if own is not None else "none",
                    "others_requests": int(sum(v[1] for v in others_now))}
        return None
