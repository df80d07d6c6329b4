"""The inference readiness report for one model: one page, from the store
alone, that connects the model's quality to its operational constraints and ends in a verdict.

Sections: the model contract (versions, SKUs, pools seen); latency (cold starts, warm
p50/p95/p99 of first output and end to end, inter-token); memory (GPU memory peak, KV-cache,
preemptions, prompt lengths); quality by slice (turn success, errors, stream completion by
tenant, zone and version); operations (its SLOs and budgets, alerts, runbooks, dashboards,
rollback path, canary verdicts, saturated pools, cost per successful turn); and above all
what was measured, what was not, what blocks launch, and how to roll back or degrade.

Verdict: `blocked` when an SLO's budget is spent, a canary was rolled back at any minute of
the range or is paused now, no stable version exists to roll back to, or nothing was measured;
`ready with risks` when a canary paused and recovered, a pool saturated (users waited minutes
on end), a budget is more than half spent, a page fired, or cost is over its budget; otherwise
`ready`.
What the store could not tell (no cold start seen, no quality labels) is listed beside the
verdict, not folded into it.

Pure over bucket frames: the command reads the store and replays the rollout and autoscale
decisions (tailwatch/backtest.py), then hands their results here.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, field

import polars as pl

from tailwatch.alerts.alertmanager import AlertLinks
from tailwatch.reports import html, period
from tailwatch.reports.cost_report import BASIS as COST_BASIS  # one name for the cost basis in both reports
from tailwatch.signals.rollout import CanaryStory
from tailwatch.dashboards.uids import UID_CANARY, UID_GPU, UID_LATENCY, UID_SLO
from tailwatch.slo import histogram
from tailwatch.planning.prices import GpuPrices
from tailwatch.slo.sli import replay as replay_slos
from tailwatch.slo.spec import SloSpec
from tailwatch.slo.alert_windows import consecutive_runs, minute_text

FIRST_OUTPUT_NAME = {"llm": "time to first token", "asr": "first partial", "tts": "first audio byte",
                     "s2s": "first audio byte", "embed": "first output"}
SATURATED_RUN_MINUTES = 3


@dataclass(frozen=True)
class Finding:
    severity: str  # blocker, risk
    what: str


@dataclass(frozen=True)
class CanaryHistory:
    """What the rollout verdict said of one canary version over the range (from the backtest)."""

    version: str
    story: CanaryStory
    verdicts: tuple[tuple[int, str], ...] = ()  # (minute, verdict) for every minute replayed, oldest first


@dataclass
class ReadinessReport:
    model: str
    start: dt.datetime | None
    end: dt.datetime | None
    verdict: str
    findings: list[Finding]
    not_measured: list[str]
    contract: dict
    latency: list[dict]
    cold_starts: list[dict]
    memory: list[dict]
    quality: dict[str, list[dict]]
    slos: list[dict]
    canaries: list[dict]
    saturated_pools: list[dict]
    cost: list[dict]
    rollback_path: str
    charts: dict[str, str] = field(default_factory=dict)
    # The first minute with this model's traffic and the end of the last: what the figures cover.
    data_from: dt.datetime | None = None
    data_to: dt.datetime | None = None
    # Per canary version, the verdict of every minute replayed (for the verdict chart's bands).
    verdicts: dict[str, tuple[tuple[int, str], ...]] = field(default_factory=dict)

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("charts")
        out.pop("verdicts")
        out["start"] = self.start.isoformat() if self.start else None
        out["end"] = self.end.isoformat() if self.end else None
        out["data_from"] = self.data_from.isoformat() if self.data_from else None
        out["data_to"] = self.data_to.isoformat() if self.data_to else None
        return out


def _minute(ts: dt.datetime) -> int:
    return int(ts.replace(tzinfo=dt.timezone.utc).timestamp()) // 60


def _hist_q(rows: pl.DataFrame, column: str, qs: tuple[float, ...]) -> list[float | None]:
    if column not in rows.columns or rows.height == 0:
        return [None] * len(qs)
    merged = histogram.merge({h["bin"]: h["n"] for h in hs} for hs in rows[column].drop_nulls().to_list())
    return [round(v, 1) if (v := histogram.quantile_ms(merged, q)) is not None else None for q in qs]


def _share(numerator: str, denominator: pl.Expr) -> pl.Expr:
    """numerator ÷ denominator, null (not NaN, which JSON cannot carry) where nothing was counted."""
    return pl.when(denominator > 0).then(pl.col(numerator) / denominator)


def _ratio(num: float, den: float) -> float | None:
    return round(num / den, 6) if den else None


def build_readiness(model: str, requests: pl.DataFrame, gpu: pl.DataFrame, specs: list[SloSpec], prices: GpuPrices,
                    canaries: list[CanaryHistory], queue_age_slo_ms: float, start: dt.datetime | None = None,
                    end: dt.datetime | None = None, cost_budget_per_turn_usd: float | None = None,
                    scales: pl.DataFrame | None = None, model_cost: dict | None = None) -> ReadinessReport:
    """`scales`: per pool and minute, the factor that fits requests' GPU-seconds into the GPU
    time that existed (reports/cost_report.py `minute_scales`); `model_cost`: the model's cost by
    the cost report's rules (`model_costs`). With both, every cost here equals the cost report's."""
    findings: list[Finding] = []
    missing: list[str] = []
    if requests.height == 0:
        return ReadinessReport(model, start, end, "blocked", [Finding("blocker", f"nothing measured: the store has no "
                               f"traffic for model {model!r} in this range, so nothing about it can be judged")],
                               ["everything: no requests and no GPU samples for this model"], {}, [], [], [], {}, [],
                               [], [], [], "unknown: no version seen")
    req = requests.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
    workload = req["workload"].mode().sort()[0]
    first_name = FIRST_OUTPUT_NAME.get(workload, "first output")

    # ---- contract ----------------------------------------------------------------------
    versions = req.group_by("model_version", "deployment").agg(
        pl.col("requests").sum(), pl.col("window_start").min().alias("first_seen"),
        pl.col("window_start").max().alias("last_seen")).sort("model_version", "deployment")
    skus = sorted(s for s in gpu["gpu_sku"].unique().to_list() if s) if gpu.height else []
    contract = {
        "workload": workload, "versions": [{**r, "first_seen": str(r["first_seen"]), "last_seen": str(r["last_seen"])}
                                           for r in versions.to_dicts()],
        "gpu_skus": skus, "pools": sorted(p for p in req["pool"].unique().to_list() if p),
        "zones": sorted(z for z in req["zone"].unique().to_list() if z),
        "tenants": int(req["tenant"].n_unique()), "requests": int(req["requests"].sum()),
        "minutes": int(req["_m"].n_unique()),
    }
    if not skus:
        missing.append("GPU SKU and memory: no GPU samples name this model (its pools' collectors send no model label)")

    # ---- latency -------------------------------------------------------------------------
    latency = []
    for (version,), rows in sorted(req.partition_by("model_version", as_dict=True).items()):
        fo = _hist_q(rows, "first_output_ms_hist", (0.5, 0.95, 0.99))
        e2e = _hist_q(rows, "e2e_ms_hist", (0.5, 0.95, 0.99))
        itl = _hist_q(rows, "inter_token_ms_hist", (0.5, 0.95))
        latency.append({"version": version, "requests": int(rows["requests"].sum()), f"{first_name} p50 ms": fo[0],
                        f"{first_name} p95 ms": fo[1], f"{first_name} p99 ms": fo[2], "e2e p50 ms": e2e[0],
                        "e2e p95 ms": e2e[1], "e2e p99 ms": e2e[2], "inter-token p50 ms": itl[0],
                        "inter-token p95 ms": itl[1]})
    if workload == "llm" and all(r["inter-token p50 ms"] is None for r in latency):
        missing.append("inter-token latency: no answer carried inter_token_ms")
    cold = []
    if gpu.height:
        g = gpu.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
        loading = g.filter(pl.col("replica_state").is_in(["loading", "cold"]))
        for (pool,), rows in sorted(loading.partition_by("pool", as_dict=True).items()):
            longest = max((b - a + 1 for (_n, _i), part in rows.partition_by("node", "gpu_index", as_dict=True).items()
                           for a, b in consecutive_runs(part["_m"].to_list())), default=0)
            cold.append({"pool": pool, "gpu_minutes_loading": rows.height, "longest_to_warm_minutes": longest})
    if not cold:
        missing.append("cold start: no replica was seen loading or cold in this range, so time to warm is unknown")

    # ---- memory --------------------------------------------------------------------------
    memory = []
    if gpu.height:
        per_pool = gpu.group_by("pool").agg(
            (pl.col("mem_used_bytes_max") / pl.col("mem_total_bytes")).max().alias("gpu_memory_peak_ratio"),
            pl.col("mem_used_bytes_max").max().alias("gpu_memory_peak_bytes"),
            pl.col("kv_cache_usage_max").max().alias("kv_cache_usage_max"),
            pl.col("kv_cache_usage_max").quantile(0.95, interpolation="higher").alias("kv_cache_usage_p95"),
            pl.col("preemptions").fill_null(0).sum().alias("preemptions")).sort("pool")
        prompts = req.group_by("pool").agg((pl.col("prompt_tokens").fill_null(0).sum() / pl.col("requests").sum())
                                           .alias("prompt_tokens_per_request"))
        memory = per_pool.join(prompts, on="pool", how="left").to_dicts()
        if per_pool["kv_cache_usage_max"].null_count() == per_pool.height and workload == "llm":
            missing.append("KV-cache use: the runtime reports no kv_cache_usage")
    if workload == "llm":
        missing.append("context lengths: buckets keep prompt tokens per minute and slice, not per request; "
                       "only the mean is shown")

    # ---- quality by slice ------------------------------------------------------------------
    def by(label: str) -> list[dict]:
        return req.group_by(label).agg(
            pl.col("turns").sum(), pl.col("successful_turns").sum(), pl.col("requests").sum(),
            (pl.col("errors") + pl.col("timeouts")).sum().alias("failed"),
            pl.col("streams").fill_null(0).sum(), pl.col("streams_completed").fill_null(0).sum(),
            pl.col("streams_cancelled").fill_null(0).sum(),
        ).with_columns(
            _share("successful_turns", pl.col("turns")).alias("turn_success_ratio"),
            _share("failed", pl.col("requests")).alias("error_ratio"),
            _share("streams_completed", pl.col("streams") - pl.col("streams_cancelled")).alias("stream_completion"),
        ).sort(label).to_dicts()

    quality = {label: by(label) for label in ("model_version", "tenant", "zone")}
    if not req["streams"].fill_null(0).sum():
        missing.append("stream endings: no attempt said how its stream ended (finish_reason), so stream completion "
                       "is unknown")
    missing.append("quality labels: the store counts a turn successful by the runtime's task_success where it is sent "
                   "and by status ok otherwise, and cannot tell which")
    # Sampled evaluations (eval.v1): WER per language and version, the slices a rollout gate compares.
    evaluated = req.filter(pl.col("reference_words").fill_null(0) > 0) if "reference_words" in req.columns else req.clear()
    if evaluated.height:
        quality["language and model_version (sampled evaluations)"] = evaluated.group_by("language", "model_version").agg(
            pl.col("evals").sum(), pl.col("word_errors").sum(), pl.col("reference_words").sum(),
        ).with_columns(_share("word_errors", pl.col("reference_words")).alias("wer")).sort(
            "language", "model_version").to_dicts()
    else:
        missing.append("evaluation scores: no eval.v1 evaluation with word counts for this model, so WER by language "
                       "is unknown")
    if not req.filter(pl.col("traffic_class") == "eval").height:
        missing.append("evaluation traffic: no `eval` traffic class for this model, so quality under a fixed test set "
                       "was not measured")

    # ---- SLOs ----------------------------------------------------------------------------
    slos = []
    state = replay_slos(specs, requests)
    for (name, _labels), st in sorted(state.evaluator.states.items()):
        s = st.status()
        slos.append({"slo": name, "slice": ",".join(f"{k}={v}" for k, v in s.labels.items()) or "all",
                     "sli": s.sli, "error_budget_remaining": s.error_budget_remaining, "firing": s.firing,
                     "runbook": st.spec.runbook})
    for name in sorted({r["slo"] for r in slos}):
        rows = [r for r in slos if r["slo"] == name]
        worst = min(rows, key=lambda r: r["error_budget_remaining"])
        spent = [r for r in rows if r["error_budget_remaining"] < 0]
        if spent:
            findings.append(Finding("blocker", f"SLO {name}: error budget spent in {len(spent)} of {len(rows)} slices "
                                               f"(worst {worst['slice']}: {worst['error_budget_remaining']:.0%} left)"))
        elif worst["error_budget_remaining"] < 0.5:
            findings.append(Finding("risk", f"SLO {name}: {worst['error_budget_remaining']:.0%} of the error budget "
                                            f"left in {worst['slice']}"))
    pages = [c for c in state.changes if c.state == "firing" and c.severity == "page"]
    if not specs:
        missing.append("SLOs: none given (--slos none), so no budget was judged")
    elif not slos:
        missing.append("SLOs: no SLO selects this model's traffic")

    # ---- canaries and the rollback path ---------------------------------------------------
    canary_rows = []
    for c in canaries:
        st = c.story
        canary_rows.append({
            "version": c.version, "worst verdict": st.worst,
            "from": minute_text(st.worst_from) if st.halted else None,
            "to": minute_text(st.worst_to) if st.halted else None, "minutes": st.worst_minutes if st.halted else 0,
            "decided by": ", ".join(st.worst_decided_by) or None, "why": st.worst_reason if st.halted else st.latest_reason,
            "verdict now": st.latest, "since": minute_text(st.latest_since)})
        # The worst verdict in the range decides: a canary rolled back for an hour and
        # healthy since is not launch-ready on this evidence, whatever it says now.
        if st.worst == "rollback" or st.latest in ("rollback", "pause"):
            findings.append(Finding("blocker", f"canary {c.version}: {st.sentence(minute_text)}"))
        elif st.halted:
            findings.append(Finding("risk", f"canary {c.version}: {st.sentence(minute_text)}"))
    stable = [v["model_version"] for v in contract["versions"] if v["deployment"] == "stable" and v["model_version"]]
    if stable:
        rollback_path = (f"shift traffic back to the stable version {', '.join(stable)} (rollout controller: the "
                         f"verdict API answers rollback); degrade with GET /v1/shed/{{pool}}")
    else:
        rollback_path = "none: no stable version of this model served traffic, so there is nothing to roll back to"
        findings.append(Finding("blocker", "no stable version served traffic: no rollback path"))

    # ---- saturated pools -----------------------------------------------------------------
    # Saturated: the oldest queued request (p95 over the pool's GPUs, as the autoscaler reads
    # it) over the queue-age SLO for minutes on end. Latency alone is not saturation: a slow
    # canary breaks first output with idle GPUs.
    saturated = []
    if gpu.height:
        waits = (gpu.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
                 .group_by("pool", "_m").agg(pl.col("oldest_queue_age_ms_max").quantile(0.95, interpolation="higher")
                                             .alias("q")).filter(pl.col("q") > queue_age_slo_ms))
        for (pool,), rows in sorted(waits.partition_by("pool", as_dict=True).items()):
            runs = [(a, b) for a, b in consecutive_runs(rows["_m"].to_list()) if b - a + 1 >= SATURATED_RUN_MINUTES]
            if runs:
                saturated.append({"pool": pool, "minutes_saturated": sum(b - a + 1 for a, b in runs),
                                  "worst_queue_age_ms": round(float(rows["q"].max()), 1),
                                  "when": ", ".join(f"{minute_text(a)}–{minute_text(b + 1)[11:]}" for a, b in runs)})
                findings.append(Finding("risk", f"pool {pool} saturated: queue age p95 over {queue_age_slo_ms:,.0f} ms "
                                                f"for {saturated[-1]['minutes_saturated']} minutes ({saturated[-1]['when']}),"
                                                f" worst {saturated[-1]['worst_queue_age_ms']:,.0f} ms"))
    else:
        missing.append("saturation: no GPU samples for this model's pools, so queue age is unknown")

    # ---- cost ----------------------------------------------------------------------------
    # By the cost report's rules: requests' GPU-seconds scaled to the GPU time that existed
    # (time-shared GPUs report more), priced by their pool's SKU. Attributed is what the
    # model's requests used; fully loaded adds its pools' idle time (the cost report's headline).
    sku_of_pool = dict(gpu.sort("window_start").group_by("pool").agg(pl.col("gpu_sku").drop_nulls().last())
                       .iter_rows()) if gpu.height else {}
    priced = req.with_columns(pl.col("pool").replace_strict(
        {p: prices.usd_per_gpu_second(s) for p, s in sku_of_pool.items()}, default=prices.usd_per_gpu_second(None),
        return_dtype=pl.Float64).alias("_usd"))
    if scales is not None and scales.height:
        priced = priced.join(scales.select(pl.col("minute").alias("window_start"), "pool", "attribution_scale"),
                             on=["window_start", "pool"], how="left")
    else:
        priced = priced.with_columns(pl.lit(1.0).alias("attribution_scale"))
    # One basis leads, as in the cost report and the budget judge: fully loaded. The attributed
    # rows follow, each naming its basis, since only they split by version.
    per_version = priced.group_by("model_version").agg(
        (pl.col("gpu_seconds").fill_null(0) * pl.col("attribution_scale").fill_null(1.0) * pl.col("_usd")).sum()
        .alias("cost USD"),
        pl.col("successful_turns").sum().alias("successful turns")).sort("model_version")
    cost_rows = []
    if model_cost:
        cost_rows.append({"version": "all", "basis": f"{COST_BASIS} (as in the cost report; the budget's basis)",
                          "cost USD": model_cost["fully_loaded_cost_usd"],
                          "successful turns": model_cost["successful_turns"],
                          "cost per successful turn USD": model_cost["cost_per_successful_turn_usd"]})
    cost_rows += [{"version": r["model_version"], "basis": "attributed (its requests' own GPU time, no idle time)",
                   "cost USD": r["cost USD"], "successful turns": r["successful turns"],
                   "cost per successful turn USD": r["cost USD"] / r["successful turns"] if r["successful turns"] else None}
                  for r in per_version.to_dicts()]
    if not sku_of_pool:
        missing.append("GPU prices: no SKU seen for this model's pools; the default price was used")
    if cost_budget_per_turn_usd is not None:
        judged = model_cost["cost_per_successful_turn_usd"] if model_cost else None
        if judged is not None and judged > cost_budget_per_turn_usd:
            findings.append(Finding("risk", f"{model} costs ${judged:.5f} per successful turn fully loaded (idle GPU "
                                            f"time of its pools included), over the ${cost_budget_per_turn_usd:.5f} budget"))
    else:
        missing.append("cost budget: none given (--cost-budget-per-turn), so cost was shown, not judged")
    for c in pages:
        if c.labels and not any(f.what.startswith(f"SLO {c.slo}") for f in findings):
            findings.append(Finding("risk", f"SLO {c.slo} paged at {minute_text(c.at_minute)} "
                                            f"({','.join(f'{k}={v}' for k, v in c.labels.items())})"))
    blocked = any(f.severity == "blocker" for f in findings)
    # What the store could not tell is listed, not judged: some of it no store of buckets can know.
    verdict = "blocked" if blocked else ("ready with risks" if findings else "ready")
    return ReadinessReport(model, start, end, verdict, findings, missing, contract, latency, cold, memory, quality,
                           slos, canary_rows, saturated, cost_rows, rollback_path,
                           data_from=req["window_start"].min(), data_to=req["window_start"].max() + dt.timedelta(minutes=1),
                           verdicts={c.version: c.verdicts for c in canaries if c.verdicts})


def dashboards_for(model: str, links: AlertLinks) -> list[tuple[str, str]]:
    """Absolute links (`--grafana-url`): the page is a file opened anywhere, not a Grafana page."""
    return [(title, links.dashboard(uid, {"model": model})) for title, uid in
            (("SLO detail", UID_SLO), ("Latency", UID_LATENCY), ("Model version and canary", UID_CANARY),
             ("GPUs", UID_GPU))]


# ---- the page ---------------------------------------------------------------------------
HALTED = ("pause", "rollback")


def judged_quantile(requests: pl.DataFrame, column: str, q: float, window_minutes: int) -> tuple[list[int], dict[str, list]]:
    """Per version and minute, the `q` quantile of `column` over the trailing `window_minutes`
    minutes up to and including that minute: the window the rollout verdict compares (its
    newest `rollout_window_minutes`), so a canary that recovered at one minute still reads
    slow until its slow minutes leave the window, as the verdict does."""
    req = requests.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
    minutes = list(range(int(req["_m"].min()), int(req["_m"].max()) + 1))
    out: dict[str, list] = {}
    for (version,), rows in sorted(req.partition_by("model_version", as_dict=True).items()):
        by_m = {m: part for (m,), part in rows.partition_by("_m", as_dict=True).items()}
        series = []
        for m in minutes:
            parts = [by_m[k] for k in range(m - window_minutes + 1, m + 1) if k in by_m]
            series.append(_hist_q(pl.concat(parts), column, (q,))[0] if parts else None)
        out[version or "(none)"] = series
    return minutes, out


def verdict_bands(verdicts: tuple[tuple[int, str], ...]) -> list[tuple[int, int, str]]:
    """Runs of halted minutes: (first minute, first minute after, verdict), oldest first."""
    bands: list[tuple[int, int, str]] = []
    for minute, verdict in verdicts:
        if verdict not in HALTED:
            continue
        if bands and bands[-1][2] == verdict and bands[-1][1] == minute:
            bands[-1] = (bands[-1][0], minute + 1, verdict)
        else:
            bands.append((minute, minute + 1, verdict))
    return bands


def _time(minute: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(minute * 60, tz=dt.timezone.utc).replace(tzinfo=None)


def _charts(report: ReadinessReport, requests: pl.DataFrame, window_minutes: int) -> dict[str, str]:
    from tailwatch.reports import charts

    if requests.height == 0:
        return {}
    req = requests.with_columns((pl.col("window_start").dt.epoch("s") // 60).alias("_m"))
    minutes, judged = judged_quantile(requests, "first_output_ms_hist", 0.95, window_minutes)
    times = [_time(m) for m in minutes]
    err = {}
    for (version,), rows in sorted(req.partition_by("model_version", as_dict=True).items()):
        by_m = {m: part for (m,), part in rows.partition_by("_m", as_dict=True).items()}
        err[version or "(none)"] = [(_ratio(float((by_m[m]["errors"] + by_m[m]["timeouts"]).sum()),
                                            float(by_m[m]["requests"].sum())) if m in by_m else None) for m in minutes]
    bands = [(_time(a), _time(b), f"{version}: {verdict}") for version, steps in sorted(report.verdicts.items())
             for a, b, verdict in verdict_bands(steps)]
    name = FIRST_OUTPUT_NAME.get(report.contract.get("workload", ""), "first output")
    return {
        "latency": charts.series_over_time(
            f"{name.capitalize()} p95 by version over the trailing {window_minutes} min the rollout verdict judges",
            "ms", times, judged, bands=bands),
        "errors": charts.series_over_time("Error ratio by version (errors and timeouts)", "share of attempts",
                                          times, err, percent=True),
    }


def _fmt(key: str, v) -> str:
    """A value as a reader wants it: bytes in GiB, ratios in percent, dollars with enough decimals."""
    if v is None:
        return "–"
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "bytes" in key:
            return f"{v / 2**30:,.1f} GiB"
        if key.endswith("ratio") or key.startswith("kv_cache_usage") or key in ("stream_completion", "budget_left", "error_budget_remaining"):
            return f"{100 * v:,.2f}%"
        if "usd" in key.lower():
            return f"${v:,.5f}" if abs(v) < 1 else f"${v:,.2f}"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1 else f"{v:,.1f}"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, list):
        return ", ".join(map(str, v)) or "–"
    return str(v)


# Columns that would read alike from their keys alone (a peak in % and in GiB), named apart with their unit.
HEADERS = {"gpu_memory_peak_ratio": "GPU memory peak (% of the GPU's)", "gpu_memory_peak_bytes": "GPU memory peak (GiB)",
           "kv_cache_usage_max": "KV cache use, max (%)", "kv_cache_usage_p95": "KV cache use, p95 (%)"}


def _header(key: str) -> str:
    """`error_budget_remaining` → `Error budget remaining`: words, units said by the values."""
    if key in HEADERS:
        return HEADERS[key]
    words = key.replace("_bytes", "").replace("_ratio", "").replace("_usd", " USD").replace("_", " ")
    for short, long in (("gpu", "GPU"), ("kv", "KV"), (" ms", " (ms)"), ("p95", "p95"), ("slo", "SLO")):
        words = words.replace(short, long)
    return words[:1].upper() + words[1:]


def render_html(report: ReadinessReport, links: AlertLinks | None = None, window_minutes: int = 30) -> str:
    links = links or AlertLinks()

    def headers(rows: list[dict]) -> list[tuple[str, bool]]:
        return [(_header(k), i == 0) for i, k in enumerate(rows[0])]

    def cells(rows: list[dict]) -> list[list[str]]:
        return [[_fmt(k, r[k]) for k in rows[0]] for r in rows]

    covered = (f"data for {report.model} from {period.minute_range_text(report.data_from, report.data_to)} "
               f"({period.span_text(report.data_to - report.data_from)})") if report.data_from and report.data_to \
        else "no data for this model"
    requested = f"requested {report.start or 'the first bucket'} to {report.end or 'the last'}"
    return html.render(
        "readiness.html", r=report, covered=covered, requested=requested, window_minutes=window_minutes, box={"ready": "ok", "ready with risks": "scaled", "blocked": "callout"}[report.verdict],
        rows_headers=headers, rows_cells=cells, dashboards=dashboards_for(report.model, links),
        runbooks=[(title, links.runbook(path)) for title, path in RUNBOOKS])


RUNBOOKS = (("An SLO burns its budget", "runbooks/slo-burn.md"), ("A queue grows", "runbooks/detector-queue-age.md"),
            ("GPUs busy, users waiting", "runbooks/detector-busy-but-slow.md"),
            ("A version behaves unlike itself", "runbooks/detector-anomaly.md"))


def write_readiness(report: ReadinessReport, requests: pl.DataFrame, out_dir, links: AlertLinks | None = None,
                    window_minutes: int = 30) -> list:
    """`window_minutes`: the rollout verdict's window (`rollout_window_minutes`), which the latency chart shows."""
    import json
    from pathlib import Path

    out = Path(out_dir)
    report.charts = _charts(report, requests, window_minutes)
    page = render_html(report, links, window_minutes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "readiness.html").write_text(page, encoding="utf-8")
    (out / "readiness.json").write_text(json.dumps(report.to_json(), indent=2, default=str), encoding="utf-8")
    return [out / "readiness.html", out / "readiness.json"]
