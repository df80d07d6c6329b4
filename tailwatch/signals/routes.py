"""The signal API's routes: typed Litestar handlers over `SignalApi`, and the OpenAPI 3.1
document Litestar generates from them (served at `/openapi.json`).

Each handler's path parameters, body and return annotation are what Litestar validates and
what the document says, so nothing is written twice. An answer of the view is the JSON the
worker encoded (signals/served.py), handed to the client as it is: the annotation
(`Response[Autoscale]`) names the type those bytes are the encoding of. Every error is an `ApiError` with a line
a person reads, whoever raised it (a handler, Litestar's validation, its router). The
connection guards (deadlines, caps, bodies refused before they are read) stay in
`streams/http_server.py`, in front of this app.
"""

from __future__ import annotations

import logging
import typing

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.exceptions import HTTPException, NotFoundException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.plugins import JsonRenderPlugin
from litestar.openapi.spec import Components, SecurityScheme
from litestar.params import JSONBody, Parameter
from litestar.response.base import ASGIResponse

from tailwatch import runbooks
from tailwatch.conventions import FLAGGER_EVENTS_TOTAL
from tailwatch.signals.answers import (AlertList, ApiError, Autoscale, FlaggerCheck, FlaggerEventCounted, FlaggerEventPayload,
                             FlaggerPayload, Inconclusive, Name, Readiness, Shed, Slo, SloList, Verdict)
from tailwatch.signals.api import MAX_BODY_BYTES, ApiFailure, SignalApi, VerdictJson, literal_choices

VERSION = "2.0.0"
log = logging.getLogger("tailwatch.api")
SECURED = [{"bearer": []}]
ERROR_TEXT = {
    400: "A path parameter or body is malformed.",
    401: "No bearer token, or an unknown one.",
    404: "Unknown, or outside this token's tenants (the same answer for both).",
    413: "Body over 64 KiB.",
    503: "No data yet, the data is older than the staleness bound, an input is behind, or a pool input holds "
         "nothing in its window (`reason` says which).",
}
PARAMETER_TEXT = "path parameters are 1 to 128 characters of letters, digits and . _ : @ + -"
_ENCODER = msgspec.json.Encoder()
# `Name`'s constraints as Litestar checks and documents a path parameter (it reads `Parameter`,
# not msgspec's `Meta`, there).
_NAME = typing.get_args(Name)[1]
PathName = typing.Annotated[str, Parameter(min_length=_NAME.min_length, max_length=_NAME.max_length,
                                           pattern=_NAME.pattern, description=_NAME.description)]


def header(scope: dict, name: bytes) -> str | None:
    """A request header from the ASGI scope, read without building Litestar's `Headers`
    (which took a fifth of a small answer's time)."""
    for key, value in scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def no_route(path: str) -> ApiError:
    return ApiError(f"no route {path[:100]}", hint="GET /openapi.json lists them")


def not_allowed(method: str) -> ApiError:
    return ApiError(f"{method} is not allowed here")


TOO_LARGE = ApiError(f"request body over {MAX_BODY_BYTES} bytes")


def _errors(*statuses: int, **also: tuple[type, str]) -> dict[int, ResponseSpec]:
    out = {s: ResponseSpec(data_container=ApiError, description=ERROR_TEXT[s], generate_examples=False) for s in statuses}
    out.update({int(s): ResponseSpec(data_container=kind, description=text, generate_examples=False) for s, (kind, text) in also.items()})
    return out


class JsonResponse(Response):
    """Every answer of this API (the app's `response_class`): the body encoded by msgspec and
    the head written as bytes, once. Litestar's general path (header containers, cookies,
    per-type encoders) was a fifth of an answer's instructions in process (253,000 → 199,000
    per rollout verdict, `perf stat`), for features no answer here uses."""

    def __init__(self, content: object, *, status_code: int | None = None, headers: dict | None = None,
                 media_type: str | None = None, **_unused) -> None:
        self.content, self.status_code, self.media_type = content, status_code, media_type
        self.headers = dict(headers) if headers else {}
        self.background, self.cookies, self.encoding, self.response_type_encoders = None, [], "utf-8", {}

    def to_asgi_response(self, app, request, *, headers: dict | None = None, status_code: int | None = None,
                         **_unused) -> ASGIResponse:
        body = self.content if isinstance(self.content, bytes) else _ENCODER.encode(self.content)
        head = [(b"content-type", (self.media_type or "application/json").encode("latin-1")),
                (b"content-length", str(len(body)).encode("latin-1"))]
        for name, value in ({**headers, **self.headers} if headers else self.headers).items():
            head.append((name.lower().encode("latin-1"), str(value).encode("latin-1")))
        return _Sent(body, self.status_code or status_code or 200, head)


class _Sent(ASGIResponse):
    """An ASGI response whose head is already bytes."""

    __slots__ = ("_head",)

    def __init__(self, body: bytes, status_code: int, head: list[tuple[bytes, bytes]]) -> None:
        # No super().__init__: the header container it builds is what this class saves.
        self.body, self.status_code, self._head, self.content_length = body, status_code, head, len(body)
        self.background, self.is_head_response, self._encoded_cookies, self.encoding = None, False, (), "utf-8"

    def encode_headers(self) -> list[tuple[bytes, bytes]]:
        return self._head


def _json(status: int, body: object) -> Response:
    """An answer: `body` a typed answer, encoded here, or bytes the worker encoded (served as they are)."""
    headers = {"www-authenticate": 'Bearer realm="tailwatch"'} if status == 401 else None
    content = body if isinstance(body, bytes) else _ENCODER.encode(body)
    return JsonResponse(content=content, status_code=status, media_type="application/json", headers=headers)


def _verdict(answer: VerdictJson | Inconclusive) -> bytes | Inconclusive:
    return answer.json if isinstance(answer, VerdictJson) else answer


def make_app(api: SignalApi) -> Litestar:
    """The ASGI app of the signal API over `api` (its config, snapshot and clocks)."""

    def who(request: Request):
        return api.principal(header(request.scope, b"authorization"))

    @get("/v1/autoscale/{pool:str}", sync_to_thread=False, security=SECURED, responses=_errors(400, 401, 404, 503),
         summary="Desired replicas for a pool, with its signals and reasons")
    def autoscale(request: Request, pool: PathName) -> Response[Autoscale]:
        return _json(200, api.autoscale(who(request), pool))

    @get("/v1/shed/{pool:str}", sync_to_thread=False, security=SECURED, responses=_errors(400, 401, 404, 503),
         summary="For a pool under pressure: the degradation steps in order with the load each frees, and the "
                 "admission plan for the next interval at measured capacity")
    def shed(request: Request, pool: PathName) -> Response[Shed]:
        return _json(200, api.shed(who(request), pool))

    @get("/v1/rollout/{model:str}/{version:str}", sync_to_thread=False, security=SECURED,
         responses=_errors(400, 401, 404, 503), summary="Verdict on a canary version against the model's stable version")
    def rollout(request: Request, model: PathName, version: PathName) -> Response[Verdict]:
        return _json(200, api.rollout(who(request), model, version))

    @get("/v1/argo/{model:str}/{version:str}", sync_to_thread=False, security=SECURED, responses=_errors(400, 401),
         summary="Argo Rollouts web metric: the verdict, always 200 (stale or missing data is inconclusive)")
    def argo(request: Request, model: PathName, version: PathName) -> Response[Verdict | Inconclusive]:
        return _json(200, _verdict(api.argo(who(request), model, version)))

    @post("/v1/flagger/event", sync_to_thread=False, status_code=200, responses=_errors(400, 413),
          summary=f"Flagger `event` webhook: counted by phase and type in {FLAGGER_EVENTS_TOTAL}")
    def flagger_event(data: JSONBody[FlaggerEventPayload]) -> FlaggerEventCounted:
        return api.flagger_event(None, data)

    @post("/v1/flagger/{check:str}", sync_to_thread=False, status_code=200, security=SECURED,
          responses=_errors(400, 401, 404, 413, **{"412": (Verdict, "It does not pass (a gate: hold; rollout: a failed "
                                                            "check; rollback: do not roll back).")}),
          summary="Flagger webhook per hook type: pre-rollout and rollout (fail on rollback), confirm-rollout, "
                  "confirm-traffic-increase and confirm-promotion (gates), post-rollout (always passes), rollback "
                  "(2xx rolls back)")
    def flagger(request: Request, check: FlaggerCheck, data: JSONBody[FlaggerPayload]) -> Response[Verdict | Inconclusive]:
        status, answer = api.flagger(None, check, data, header(request.scope, b"authorization"))
        return _json(status, _verdict(answer))

    @get("/v1/slos", sync_to_thread=False, security=SECURED, responses=_errors(401, 503), summary="Every SLO with its slices")
    def slos(request: Request) -> Response[SloList]:
        return _json(200, api.slos(who(request)))

    @get("/v1/slos/{name:str}", sync_to_thread=False, security=SECURED, responses=_errors(400, 401, 404, 503),
         summary="One SLO: per slice budget remaining, burn rates, SLI")
    def slo(request: Request, name: PathName) -> Response[Slo]:
        return _json(200, api.slo(who(request), name))

    @get("/v1/alerts", sync_to_thread=False, security=SECURED, responses=_errors(401, 503), summary="Alerts firing now")
    def alerts(request: Request) -> Response[AlertList]:
        return _json(200, api.alerts(who(request)))

    @get("/readyz", sync_to_thread=False, summary="Caught up within the staleness bound",
         responses={503: ResponseSpec(data_container=Readiness, description="Not ready, with the reason.",
                                         generate_examples=False)})
    def ready() -> Response[Readiness]:
        status, answer = api.ready(None)
        return _json(status, answer)

    @get("/runbooks/{name:str}", sync_to_thread=False, summary="A runbook that pages and reports link to (Markdown)",
         responses=_errors(404))
    def runbook(name: PathName) -> Response:
        # No token: a person follows the link from a page or a report in a browser, which
        # sends none; the runbooks are the project's published docs.
        found = runbooks.text(name)
        if found is None:
            return _json(404, ApiError(f"no runbook {name[:100]}", hint="GET /runbooks/slo-burn.md, for one"))
        return Response(found.encode(), media_type="text/markdown; charset=utf-8")

    @get("/openapi.json", sync_to_thread=False, include_in_schema=False, media_type="application/json")
    def openapi(request: Request) -> bytes:
        if not document:
            document.append(_ENCODER.encode(request.app.openapi_schema.to_schema()))
        return document[0]

    document: list[bytes] = []  # built at the first request, once every route is known
    handlers = [autoscale, shed, rollout, argo, flagger_event, flagger, slos, slo, alerts, ready, runbook, openapi]
    return Litestar(
        handlers,
        debug=False,
        logging_config=None,
        response_class=JsonResponse,
        request_max_body_size=MAX_BODY_BYTES,
        exception_handlers={ApiFailure: _failure, ValidationException: _invalid, HTTPException: _http,
                            RecursionError: _too_deep, Exception: _internal},
        openapi_config=OpenAPIConfig(
            title="tailwatch signal API", version=VERSION,
            description="Autoscale and rollout signals, SLO and alert reads, from the worker's live state.",
            components=Components(security_schemes={"bearer": SecurityScheme(type="http", scheme="bearer")}),
            use_handler_docstrings=True, create_examples=False,
            # Litestar serves the document under this path too; /openapi.json is ours, cached.
            path="/openapi", render_plugins=[JsonRenderPlugin(path="/openapi.json")]),
    )


def _failure(_request: Request, failure: ApiFailure) -> Response:
    return _json(failure.status, failure.answer)


def _invalid(request: Request, exc: ValidationException) -> Response:
    """Litestar's validation errors in our words: an unknown name from a fixed set (a Flagger
    hook type) is not found; anything else in the path is malformed; a body says what it
    should have been."""
    for problem in exc.extra or []:
        if not isinstance(problem, dict) or problem.get("source") != "path":
            continue
        key = problem.get("key")
        handler = request.scope.get("route_handler")
        hint = handler.parsed_fn_signature.parameters.get(key).annotation if handler and key else None
        choices = literal_choices(hint) if hint is not None else ()
        value = str(request.path_params.get(key, ""))[:128]
        if choices:
            return _json(404, ApiError(f"no {key} {value!r} (known: {', '.join(choices)})"))
        return _json(400, ApiError(PARAMETER_TEXT))
    body = next((p for p in exc.extra or [] if isinstance(p, dict) and p.get("source") == "body"), None)
    if body is None:
        return _json(400, ApiError(str(exc.detail)[:200]))
    where = "" if body.get("key") in (None, "data") else f" at `{body['key']}`"
    return _json(400, ApiError(f"the body does not fit{where}: {str(body.get('message'))[:200]}"))


def _http(request: Request, exc: HTTPException) -> Response:
    if isinstance(exc, NotFoundException):
        return _json(404, no_route(request.url.path))
    if exc.status_code == 405:
        return _json(405, not_allowed(request.method))
    if exc.status_code == 413:
        return _json(413, TOO_LARGE)
    if exc.status_code == 400:  # a body that is not JSON at all
        return _json(400, ApiError(f"the body is not JSON ({str(exc.detail)[:120]})"))
    return _json(exc.status_code, ApiError(str(exc.detail)[:200]))


def _too_deep(_request: Request, _exc: RecursionError) -> Response:
    return _json(400, ApiError("the body nests deeper than the decoder follows"))


def _internal(request: Request, exc: Exception) -> Response:
    """A bug answers JSON with a log line, and the next request is served."""
    log.error("%s %s failed", request.method, request.url.path[:200], exc_info=exc)
    return _json(500, ApiError(f"internal error ({type(exc).__name__}: {str(exc)[:200]})"))


def route_table(app: Litestar) -> list[tuple[str, str]]:
    """(method, path template) of every route the app answers."""
    return sorted((method, route.path_format) for route in app.routes for method in route.methods
                  if method not in ("HEAD", "OPTIONS"))


def takes_body(app: Litestar, method: str, path: str) -> typing.Literal["yes", "no route", "wrong method", "no body"]:
    """Whether a request may carry a body here, before a byte of it is read."""
    try:
        _app, handler, *_ = app.asgi_router.handle_routing(path, method)  # type: ignore[arg-type]
    except NotFoundException:
        return "no route"
    except HTTPException:  # 405
        return "wrong method"
    return "yes" if "data" in handler.parsed_fn_signature.parameters else "no body"


def needs_token(app: Litestar, method: str, path: str) -> bool:
    """Whether the route a request goes to asks for a bearer token (the OpenAPI `security`)."""
    try:
        _app, handler, *_ = app.asgi_router.handle_routing(path, method)  # type: ignore[arg-type]
    except HTTPException:  # no route (404) or not this method (405): the routes answer
        return False
    return bool(handler.security)
