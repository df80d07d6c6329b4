"""The OpenAPI 3.1 document of the signal API, served at `/openapi.json`.

Kept true by `tests/test_signal_api.py`: every route the router serves is here with its
method, and the answers of a live server carry every property marked required.
"""

from __future__ import annotations

VERSION = "1.0.0"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _name_param(name: str, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:@+-]{1,128}$"}}


ERRORS = {
    "400": _json(_ref("Error"), "A path parameter or body is malformed."),
    "401": _json(_ref("Error"), "No bearer token, or an unknown one."),
    "404": _json(_ref("Error"), "Unknown, or outside this token's tenants (the same answer for both)."),
    "503": _json(_ref("Error"), "No data yet, or the data is older than the staleness bound."),
}

SCHEMAS = {
    "Error": {
        "type": "object", "required": ["error"],
        "properties": {"error": {"type": "string"}, "reason": {"type": "string", "enum": ["stale", "starting", "no_data"]},
                       "as_of": {"type": "string", "format": "date-time"}, "hint": {"type": "string"}},
    },
    "Autoscale": {
        "type": "object",
        "required": ["pool", "desired_replicas", "current_replicas", "reasons", "signals", "capacity_basis", "as_of"],
        "properties": {
            "pool": {"type": "string"},
            "desired_replicas": {"type": "integer", "minimum": 0,
                                 "description": "Point KEDA's metrics-api valueLocation here (targetValue 1)."},
            "current_replicas": {"type": "integer", "description": "Warm plus loading replicas in the newest minute."},
            "reasons": {"type": "array", "items": {"type": "string"}},
            "signals": {"type": "object", "description": "requests_per_s, work_gpu_s_per_s, tokens_per_s, "
                        "audio_seconds_per_s, active_streams, queue_age_p95_ms, first_output_p95_ms, "
                        "first_output_slo_ms, kv_cache_usage_max, gpu_util_mean_pct, sm_active_mean_pct, replicas_by_state, burn_rate, "
                        "capacity_gpu_s_per_s_per_replica, capacity_basis, utilization_of_capacity, "
                        "planning_target_utilization, prompt_tokens_per_s, window_minutes"},
            "capacity_basis": {"type": "string",
                               "enum": ["physical", "breach", "measured-above-physical", "configured", "policy-default"],
                               "description": "Which bound decided the per-replica capacity."},
            "capacity": {"type": "object", "description": "per_replica_gpu_s_per_s, lower_gpu_s_per_s, "
                         "upper_gpu_s_per_s, physical_gpu_s_per_s, broke_gpu_s_per_s, basis, reason"},
            "as_of": {"type": "string", "format": "date-time", "description": "Event time of the newest data."},
        },
    },
    "Inconclusive": {
        "type": "object", "required": ["verdict", "reason", "error", "model", "version"],
        "description": "Argo and Flagger routes: no verdict for want of data, never an error a controller counts",
        "properties": {"verdict": {"type": "string", "enum": ["inconclusive"]},
                       "reason": {"type": "string", "enum": ["stale", "starting", "no_data"]},
                       "error": {"type": "string"}, "model": {"type": "string"}, "version": {"type": "string"}},
    },
    "Side": {"type": "object", "required": ["version", "requests", "error_ratio", "cost_per_unit", "cost_unit"]},
    "Verdict": {
        "type": "object", "required": ["verdict", "reasons", "model", "version", "window_minutes", "as_of"],
        "properties": {
            "verdict": {"type": "string", "enum": ["promote", "continue", "pause", "rollback"]},
            "reasons": {"type": "array", "items": {"type": "string"}},
            "model": {"type": "string"}, "version": {"type": "string"},
            "canary": _ref("Side"), "stable": _ref("Side"),
            "window_minutes": {"type": "integer"}, "as_of": {"type": "string", "format": "date-time"},
            "metrics": {"type": "object", "description": "Per metric (errors, burn_rate, first_output, e2e, cost): "
                        "verdict (pass, continue, pause, rollback), reason, p_value, method and its numbers.",
                        "additionalProperties": {"type": "object", "required": ["verdict", "reason", "p_value"]}},
            "decided_by": {"type": "array", "items": {"type": "string"}},
            "confidence": {"type": ["number", "null"], "description": "1 − the p-value a pause or rollback acted on."},
        },
    },
    "Slo": {
        "type": "object", "required": ["name", "objective", "window", "slices"],
        "properties": {
            "name": {"type": "string"}, "description": {"type": "string"}, "objective": {"type": "number"},
            "window": {"type": "string"}, "slice_by": {"type": "array", "items": {"type": "string"}},
            "slices": {"type": "array", "items": {
                "type": "object",
                "required": ["labels", "sli", "error_budget_remaining", "burn_rates", "minutes_to_exhaustion", "firing"],
                "properties": {"labels": {"type": "object"}, "sli": {"type": ["number", "null"]},
                               "error_budget_remaining": {"type": "number"},
                               "burn_rates": {"type": "object", "additionalProperties": {"type": "number"}},
                               "minutes_to_exhaustion": {"type": ["number", "null"]},
                               "firing": {"type": "array", "items": {"type": "string"}}}}},
        },
    },
    "Alert": {
        "type": "object", "required": ["alertname", "severity", "slo", "labels", "since"],
        "properties": {"alertname": {"type": "string"}, "severity": {"type": "string"}, "slo": {"type": "string"},
                       "window": {"type": "string"}, "labels": {"type": "object"},
                       "since": {"type": "string", "format": "date-time"}, "runbook": {"type": "string"}},
    },
    "FlaggerPayload": {
        "type": "object", "required": ["metadata"],
        "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "phase": {"type": "string"},
                       "metadata": {"type": "object", "required": ["model", "version"],
                                    "properties": {"model": {"type": "string"}, "version": {"type": "string"},
                                                   "token": {"type": "string", "description":
                                                             "Flagger sends no headers: the bearer token may come here"}}}},
    },
}


def openapi_document() -> dict:
    secured = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "tailwatch signal API", "version": VERSION,
                 "description": "Autoscale and rollout signals, SLO and alert reads, from the worker's live state."},
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": {
            "/v1/autoscale/{pool}": {"get": {
                "summary": "Desired replicas for a pool, with its signals and reasons", "security": secured,
                "parameters": [_name_param("pool", "the pool field of the events")],
                "responses": {"200": _json(_ref("Autoscale"), "The decision."), **ERRORS}}},
            "/v1/rollout/{model}/{version}": {"get": {
                "summary": "Verdict on a canary version against the model's stable version", "security": secured,
                "parameters": [_name_param("model", "model"), _name_param("version", "model_version")],
                "responses": {"200": _json(_ref("Verdict"), "promote, continue, pause or rollback."), **ERRORS}}},
            "/v1/argo/{model}/{version}": {"get": {
                "summary": "Argo Rollouts web metric: the verdict, always 200 (stale or missing data is inconclusive)",
                "security": secured,
                "parameters": [_name_param("model", "model"), _name_param("version", "model_version")],
                "responses": {"200": _json({"oneOf": [_ref("Verdict"), _ref("Inconclusive")]},
                                           "promote, continue, pause, rollback or inconclusive."),
                              **ERRORS}}},
            "/v1/flagger/{check}": {"post": {
                "summary": "Flagger webhook per hook type: rollout (fails on rollback), traffic-increase and promotion "
                           "(gates), rollback (2xx rolls back)", "security": secured,
                "parameters": [{"name": "check", "in": "path", "required": True,
                                "schema": {"type": "string",
                                           "enum": ["rollout", "traffic-increase", "promotion", "rollback"]}}],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("FlaggerPayload")}}},
                "responses": {"200": _json({"oneOf": [_ref("Verdict"), _ref("Inconclusive")]},
                                           "The verdict passes this hook."),
                              "412": _json({"oneOf": [_ref("Verdict"), _ref("Inconclusive")]}, "It does not (for a gate: hold; for rollout: a failed "
                                                            "check; for rollback: do not roll back)."),
                              "413": _json(_ref("Error"), "Body over 64 KiB."), **ERRORS}}},
            "/v1/slos": {"get": {
                "summary": "Every SLO with its slices", "security": secured,
                "responses": {"200": _json({"type": "object", "required": ["slos"],
                                            "properties": {"slos": {"type": "array", "items": _ref("Slo")}}}, "SLOs."),
                              **ERRORS}}},
            "/v1/slos/{name}": {"get": {
                "summary": "One SLO: per slice budget remaining, burn rates, SLI", "security": secured,
                "parameters": [_name_param("name", "SLO name")],
                "responses": {"200": _json(_ref("Slo"), "The SLO."), **ERRORS}}},
            "/v1/alerts": {"get": {
                "summary": "Alerts firing now", "security": secured,
                "responses": {"200": _json({"type": "object", "required": ["alerts"],
                                            "properties": {"alerts": {"type": "array", "items": _ref("Alert")}}},
                                           "Firing alerts."), **ERRORS}}},
            "/healthz": {"get": {"summary": "The process is alive",
                                 "responses": {"200": {"description": "Alive, with event counts."}}}},
            "/readyz": {"get": {"summary": "Caught up within the staleness bound",
                                "responses": {"200": {"description": "Ready."}, "503": {"description": "Not ready, with the reason."}}}},
            "/metrics": {"get": {"summary": "Prometheus exposition",
                                 "responses": {"200": {"description": "Metrics."}}}},
            "/openapi.json": {"get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI 3.1."}}}},
        },
    }
