"""GPU-seconds attributed to each slice-minute of `sli_minute`, as one SQL query that the cost
report and the hourly roll-up both read (`attributed_sql`): the rules of
`planning/work_estimate.py` (which the live fleet metrics apply to closing minutes) over the
store, where each hour is complete.

Per pool and minute, the basis is:
- `reported`: some request carried `gpu_seconds`: each slice gets its requests' own figure,
  scaled down to the GPU time the pool had (the `_scales` view the caller registers, from
  `planning.cost.attribution_scales`);
- otherwise a work estimate shares the pool's busy GPU-seconds (each GPU's minute × its mean
  utilisation, all 60 s when utilisation is unknown) among the slices:
  - `tokens`: prompt tokens × w + output tokens, where w (what a prompt token costs in output
    tokens) is fitted per pool and hour from the pool's own minutes: the least-squares fit
    of busy GPU-seconds on prompt and output tokens, without intercept; with fewer than
    `MIN_FIT_MINUTES` minutes, tokens that move together, or a fit that is not positive,
    `DEFAULT_PROMPT_WEIGHT`;
  - `audio`: audio seconds (speech pools);
  - `wall_time`: requests × their median end-to-end latency (the last resort);
- `no_gpu_telemetry`: the pool sent no GPU rows that minute; nothing is attributed (the
  report's fleet cost has no GPU time there either).

The hour is the fit's unit, fitted over the whole hour whatever part of it a query asks for,
so that a minute's estimate does not depend on the range a report asks for, and an hour
rolled up (streams/rollup.py rolls whole hours) keeps the estimate a report would make.
"""

from __future__ import annotations

from tailwatch.planning.work_estimate import DEFAULT_PROMPT_WEIGHT, MIN_FIT_MINUTES


def attributed_sql(scales_view: str, columns: str = "s.*") -> str:
    """A SELECT over `sli_minute s` in [$start, $end) giving `columns` plus
    `gpu_seconds_attributed`, `attribution_basis` and `prompt_token_weight` (the fitted w, or
    null off the tokens basis). Named parameters: `start`, `end`. The caller registers
    `scales_view` (minute, scaled_pool, attribution_scale)."""
    return f"""
WITH _hours AS (  -- the whole hours the range touches: the fit's unit
    SELECT date_trunc('hour', $start::TIMESTAMP) AS lo,
           date_trunc('hour', $end::TIMESTAMP - INTERVAL 1 MICROSECOND) + INTERVAL 1 HOUR AS hi),
_busy AS (
    SELECT window_start, coalesce(pool, '') AS pool, count(*) * 60.0 AS present_s,
           sum(CASE WHEN util_pct_mean IS NULL THEN 60.0 ELSE greatest(least(util_pct_mean, 100), 0) * 0.6 END)
               AS busy_s
    FROM gpu_minute, _hours WHERE window_start >= lo AND window_start < hi GROUP BY ALL),
_pm AS (
    SELECT window_start, coalesce(pool, '') AS pool, coalesce(sum(gpu_seconds), 0) AS reported_s,
           coalesce(sum(prompt_tokens), 0)::DOUBLE AS prompt, coalesce(sum(output_tokens), 0)::DOUBLE AS output,
           coalesce(sum(audio_seconds), 0) AS audio
    FROM sli_minute, _hours WHERE window_start >= lo AND window_start < hi GROUP BY ALL),
_fit AS (
    SELECT pool, date_trunc('hour', window_start) AS hour, count(*) AS n,
           sum(prompt * prompt) AS a, sum(prompt * output) AS b, sum(output * output) AS c,
           sum(prompt * busy_s) AS d, sum(output * busy_s) AS e
    FROM _pm JOIN _busy USING (window_start, pool) WHERE reported_s = 0 AND prompt + output > 0 GROUP BY ALL),
_weights AS (
    -- planning.work_estimate.prompt_weight: the normal equations of busy = wp·prompt + wo·output, w = wp / wo
    SELECT pool, hour, CASE WHEN n >= {MIN_FIT_MINUTES} AND a * c - b * b > 1e-6 * a * c
                                AND c * d - b * e > 0 AND a * e - b * d > 0
                           THEN (c * d - b * e) / (a * e - b * d) ELSE {DEFAULT_PROMPT_WEIGHT} END AS prompt_weight
    FROM _fit),
_basis AS (
    SELECT _pm.window_start, _pm.pool, _busy.busy_s,
           CASE WHEN _pm.reported_s > 0 THEN 'reported' WHEN _busy.busy_s IS NULL THEN 'no_gpu_telemetry'
                WHEN _pm.prompt + _pm.output > 0 THEN 'tokens' WHEN _pm.audio > 0 THEN 'audio'
                ELSE 'wall_time' END AS basis,
           coalesce(_weights.prompt_weight, {DEFAULT_PROMPT_WEIGHT}) AS prompt_weight
    FROM _pm LEFT JOIN _busy USING (window_start, pool)
    LEFT JOIN _weights ON _weights.pool = _pm.pool AND _weights.hour = date_trunc('hour', _pm.window_start)
    WHERE _pm.window_start >= $start AND _pm.window_start < $end),
_rows AS (
    SELECT {columns}, _basis.basis AS attribution_basis, _basis.busy_s AS _busy_s, _scales.attribution_scale AS _scale,
           CASE _basis.basis WHEN 'tokens' THEN _basis.prompt_weight END AS prompt_token_weight,
           CASE _basis.basis
                WHEN 'tokens' THEN _basis.prompt_weight * coalesce(s.prompt_tokens, 0) + coalesce(s.output_tokens, 0)
                WHEN 'audio' THEN coalesce(s.audio_seconds, 0)
                WHEN 'wall_time' THEN s.requests * coalesce(s.e2e_ms_p50, 1.0)
                ELSE 0 END AS _work,
           s.window_start AS _minute, coalesce(s.pool, '') AS _pool, s.gpu_seconds AS _reported
    FROM sli_minute s JOIN _basis ON _basis.window_start = s.window_start AND _basis.pool = coalesce(s.pool, '')
    LEFT JOIN {scales_view} _scales ON _scales.minute = s.window_start AND _scales.scaled_pool = coalesce(s.pool, '')
    WHERE s.window_start >= $start AND s.window_start < $end)
SELECT * EXCLUDE (_busy_s, _scale, _work, _minute, _pool, _reported),
       CASE attribution_basis
            WHEN 'reported' THEN coalesce(_reported, 0) * coalesce(_scale, 1.0)
            WHEN 'no_gpu_telemetry' THEN 0.0
            ELSE coalesce(_busy_s * _work / nullif(sum(_work) OVER (PARTITION BY _minute, _pool), 0), 0.0)
       END::DOUBLE AS gpu_seconds_attributed
FROM _rows"""
