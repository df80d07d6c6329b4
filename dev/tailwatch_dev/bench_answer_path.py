"""What an answer of the signal API costs on its way to a client: per view published (the
worker's encoding of every answer and of the pipe's message, the HTTP process's decoding of
it) and per request (CPU of the HTTP process's app, in process, without the socket and h11).

    python -m tailwatch_dev.bench_answer_path [--pools 1000] [--requests 3000] [--rounds 5]

A view of `--pools` pools (autoscale and shed answers each), 20 canary verdicts and 12 SLOs
of 4 slices, built from mappings shaped as the live view makes them (`example_snapshot`):
encoded whole, and as the signal stage's encoder does the next view when its answers held
(equal answers keep their bytes). CPU time (`time.process_time`), the median of `--rounds`
rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time

from tailwatch.signals.answers import Autoscale, Shed, Slo, Verdict
from tailwatch.signals.config import ApiConfig
from tailwatch.signals.live import Scoped, SignalSnapshot, answer
from tailwatch.signals.served import ViewEncoder, serve
from tailwatch.streams import http, http_server

AS_OF = "2026-12-01T00:05:00Z"
PATHS = ("/v1/autoscale/pool-7", "/v1/shed/pool-7", "/v1/slos", "/v1/rollout/m/v3", "/readyz")


def autoscale_mapping(pool: str) -> dict:
    return {"pool": pool, "desired_replicas": 7, "current_replicas": 6,
            "reasons": ["work 0.83 of capacity", "queue age p95 410 ms"],
            "signals": {"requests_per_s": 41.3, "work_gpu_s_per_s": 5.12, "tokens_per_s": 812.4,
                        "prompt_tokens_per_s": None, "audio_seconds_per_s": 0.0, "active_streams": 12,
                        "queue_age_p95_ms": 410.0, "first_output_p95_ms": 233.1, "first_output_slo_ms": 500.0,
                        "kv_cache_usage_max": 0.71, "gpu_util_mean_pct": 64.2, "sm_active_mean_pct": math.nan,
                        "replicas_by_state": {"warm": 6, "loading": 0}, "burn_rate": 1.3,
                        "capacity_gpu_s_per_s_per_replica": 0.9, "capacity_basis": "measured-above-physical",
                        "utilization_of_capacity": 0.83, "planning_target_utilization": 0.7, "window_minutes": 5,
                        "model": "asr-1", "zone": "z1", "workload": "asr"},
            "capacity_basis": "physical",
            "capacity": {"per_replica_gpu_s_per_s": 0.9, "lower_gpu_s_per_s": 0.5, "upper_gpu_s_per_s": 1.0,
                         "physical_gpu_s_per_s": 1.0, "broke_gpu_s_per_s": None, "basis": "physical",
                         "reason": "measured"},
            "as_of": AS_OF}


def shed_mapping(pool: str) -> dict:
    steps = [{"step": s, "action": f"do {s}", "load_removed_gpu_s_per_s": 0.4, "share_of_demand": 0.08,
              "still_over_gpu_s_per_s": 0.2, "enough": s == "shorten_context", "basis": "measured over 5 minutes"}
             for s in ("delay_batch", "shed_over_quota", "shorten_context")]
    groups = [{"tenant": f"t{i}", "traffic_class": "interactive", "priority": i, "requests": 120, "cost_gpu_s": 0.04,
               "admitted": 100, "rejected": 20} for i in range(4)]
    return {"pool": pool, "under_pressure": True, "pressure": ["work 1.1 of capacity"], "demand_gpu_s_per_s": 5.5,
            "capacity_gpu_s_per_s": 5.0, "steps": steps,
            "admission": {"interval_s": 10, "capacity_gpu_s": 50.0, "retry_after_s": 10, "groups": groups},
            "as_of": AS_OF}


def _side(version: str) -> dict:
    return {"version": version, "requests": 5000, "bad": 12, "timeouts": 1, "first_output_p99_ms": 410.0,
            "e2e_p99_ms": 2300.0, "gpu_cost": 1.23, "output_tokens": 800_000, "audio_seconds": 0.0,
            "error_ratio": 0.0024, "timeout_ratio": 0.0002, "cost_per_unit": 1.5e-06, "cost_unit": "output token"}


def verdict_mapping(model: str, version: str) -> dict:
    return {"verdict": "continue", "reasons": ["no harm seen yet"], "model": model, "version": version,
            "window_minutes": 30, "as_of": AS_OF, "canary": _side(version), "stable": _side("v0"),
            "metrics": {"errors": {"verdict": "continue", "reason": "within", "p_value": 0.4, "method": "msprt"},
                        "first_output": {"verdict": "pass", "reason": "ok", "p_value": 0.6, "auc": 0.5}},
            "decided_by": ["errors"]}


def slo_mapping(name: str) -> dict:
    slices = [{"labels": {"pool": f"p{i}", "tenant": ("acme", "globex")[i % 2]}, "sli": 0.9991,
               "error_budget_remaining": 0.4, "burn_rates": {"5m": 1.2, "1h": 0.9}, "minutes_to_exhaustion": None,
               "firing": [], "as_of": AS_OF} for i in range(4)]
    return {"name": name, "description": "first output under 500 ms", "objective": 0.999, "window": "30d",
            "slice_by": ["pool", "tenant"], "selector": {}, "slices": slices}


def example_snapshot(pools: int, now: float, versions: int = 20, slos: int = 12) -> SignalSnapshot:
    """A view of `pools` pools, `versions` canary verdicts of model `m` and `slos` SLOs, all fresh at `now`."""
    tenants = frozenset({"acme"})
    return SignalSnapshot(
        now, 100,
        {f"pool-{i}": Scoped(answer(autoscale_mapping(f"pool-{i}"), Autoscale), tenants, 100, now) for i in range(pools)},
        {("m", f"v{i}"): Scoped(answer(verdict_mapping("m", f"v{i}"), Verdict), tenants, 100, now, now)
         for i in range(versions)},
        {"m": frozenset(f"v{i}" for i in range(versions))},
        [answer(slo_mapping(f"slo-{i}"), Slo) for i in range(slos)], [],
        shed={f"pool-{i}": Scoped(answer(shed_mapping(f"pool-{i}"), Shed), tenants, 100, now) for i in range(pools)})


def _median_s(run, rounds: int) -> float:
    took = []
    for _ in range(rounds):
        began = time.process_time()
        run()
        took.append(time.process_time() - began)
    return statistics.median(took)


async def _request(app, path: str) -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": [(b"host", b"x")],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000)}
    await app(scope, receive, send)
    return sent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    now = time.time()
    snap, again = example_snapshot(args.pools, now), example_snapshot(args.pools, now)
    encode = _median_s(lambda: serve(snap), args.rounds)  # every answer new
    encoder = ViewEncoder()
    encoder.serve(snap)
    held = _median_s(lambda: encoder.serve(again), args.rounds)  # the next view, its answers unchanged
    view = serve(snap)
    message = http.encode_state(http.HttpState(view, (True, "caught up"), time.time()))
    pipe = _median_s(lambda: http.encode_state(http.HttpState(view, (True, "caught up"), time.time())), args.rounds)
    decode = _median_s(lambda: http.apply_state(http.HttpState(), http.decode_state(message)), args.rounds)
    print(f"a view of {args.pools:,} pools published: answers encoded {encode * 1e3:.2f} ms "
          f"({held * 1e3:.2f} ms where they held since the last view), message {pipe * 1e3:.2f} ms in the worker; "
          f"decoded {decode * 1e3:.2f} ms in the HTTP process; {len(message):,} bytes")
    served = http_server._Served(ApiConfig(), None)
    served.state = http.apply_state(http.HttpState(), http.decode_state(message))
    app = http_server.make_app(served)
    loop = asyncio.new_event_loop()
    for path in PATHS:
        first = loop.run_until_complete(_request(app, path))
        assert first[0]["status"] == 200, (path, first)

        async def requests(path=path) -> None:
            for _ in range(args.requests):
                await _request(app, path)

        per = _median_s(lambda: loop.run_until_complete(requests()), args.rounds) / args.requests
        print(f"GET {path}: {per * 1e6:.1f} µs CPU a request ({len(first[1]['body']):,} bytes)")
    loop.close()

if __name__ == "__main__":
    main()
