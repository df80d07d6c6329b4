"""The OpenAPI 3.1 document of the signal API, served at `/openapi.json`, generated from the
typed routes of `signals/api.py`: paths and methods from each `ApiRoute`, parameters,
request bodies and answers from its handler's annotations, schemas from the msgspec Structs
of `signals/answers.py` (`msgspec.json.schema_components`, JSON Schema 2020-12 as OpenAPI
3.1 uses it). Nothing here is written per route, so nothing can fall out of step.
"""

from __future__ import annotations

import types
import typing

import msgspec

from signals.answers import ApiError

VERSION = "1.1.0"
REF = "#/components/schemas/{name}"
ERROR_TEXT = {
    400: "A path parameter or body is malformed.",
    401: "No bearer token, or an unknown one.",
    404: "Unknown, or outside this token's tenants (the same answer for both).",
    413: "Body over 64 KiB.",
    503: "No data yet, or the data is older than the staleness bound.",
}
PLAIN = {"/metrics": ("Prometheus exposition (text format 0.0.4)", "text/plain"),
         "/healthz": ("The process is alive, with event counts", "application/json")}


def _members(answer) -> list:
    """The Struct types an answer annotation allows (msgspec documents a union of Structs
    only when tagged; ours are told apart by `verdict`, so each is documented alone)."""
    if answer is None or answer is msgspec.Raw:
        return []
    return list(typing.get_args(answer)) if isinstance(answer, types.UnionType) else [answer]


def _types(route) -> list:
    return [ApiError, *_members(route.answer), *([route.payload] if route.payload is not None else [])]


def openapi_document(routes) -> dict:
    every_type = [t for r in routes for t in _types(r)]
    schemas, components = msgspec.json.schema_components(every_type, ref_template=REF)
    schema_of = {id(t): s for t, s in zip(every_type, schemas)}
    paths: dict[str, dict] = {}
    for r in routes:
        operation: dict = {"summary": r.summary, "operationId": r.handler.__name__}
        doc = (r.handler.__doc__ or "").strip()
        if doc:
            operation["description"] = " ".join(doc.split())
        if r.secured or r.wants_authorization:
            operation["security"] = [{"bearer": []}]
        params = []
        for name, hint in r.params:
            (param_schema,), _ = msgspec.json.schema_components([hint], ref_template=REF)
            params.append({"name": name, "in": "path", "required": True, "schema": param_schema})
        if params:
            operation["parameters"] = params
        if r.payload is not None:
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": schema_of[id(r.payload)]}}}
        members = [schema_of[id(t)] for t in _members(r.answer)]
        answer = {"application/json": ({"schema": members[0] if len(members) == 1 else {"oneOf": members}}
                                       if members else {})}
        responses = {"200": {"description": "The answer.", "content": answer}}
        for status, text in r.also.items():
            responses[str(status)] = {"description": text, "content": answer}
        for status in r.errors:
            responses[str(status)] = {"description": ERROR_TEXT[status],
                                      "content": {"application/json": {"schema": schema_of[id(ApiError)]}}}
        paths.setdefault(r.path, {})[r.method.lower()] = operation
        operation["responses"] = responses
    for path, (summary, ctype) in PLAIN.items():
        paths[path] = {"get": {"summary": summary, "responses": {"200": {"description": summary,
                                                                          "content": {ctype: {}}}}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tailwatch signal API", "version": VERSION,
                 "description": "Autoscale and rollout signals, SLO and alert reads, from the worker's live state."},
        "components": {"schemas": components, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }
