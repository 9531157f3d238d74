"""The Starlette application: the anchors' routes (shapes.py), ctxlock's own (/v1/...), and the edge around them.

Every route's work runs on the bounded pool (pool.py) with the request's own deadline; the event loop only reads
bodies and writes responses. `create_app(config)` builds it; `factory()` builds it from $CTXLOCK_SERVE_CONFIG (what
`uvicorn --factory ctxlock.server.app:factory` calls)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Match, Route

from ctxlock import caches
from ctxlock.budget._fit import BudgetPolicy, fit_context, fitted_request_json
from ctxlock.economics._session import cache_report as run_cache_report
from ctxlock.economics._session import read_session
from ctxlock.economics._usage import PriceTable
from ctxlock.errors import (
    ArtifactNotFoundError,
    CtxlockError,
    RecordNotFoundError,
    RequestEncodingError,
    RequestJSONError,
    RequestValidationError,
    RouteNotFoundError,
)
from ctxlock.outside._files import decode_utf8, read_input
from ctxlock.outside._json import loads_strict
from ctxlock.records import ExecutionRecord, RunOptions, diff
from ctxlock.records._replay import materialized, record_values, replay, run_and_record, save
from ctxlock.records._store import Store
from ctxlock.records._viewer import CSP, diff_page, record_page
from ctxlock.records._wire import fit_to_dict, run_to_dict
from ctxlock.request import Utf8Policy
from ctxlock.server import shapes, vllm_render
from ctxlock.server.config import ServeConfig, load_config
from ctxlock.server.edge import Edge, as_ctxlock_error, error_body
from ctxlock.server.metrics import Metrics, otel_lines
from ctxlock.server.models import Models, ServedModel
from ctxlock.server.openapi import openapi_document
from ctxlock.server.otel import otel_stream, otel_summary, span_builder
from ctxlock.server.pool import Pool
from ctxlock.tokenizer import Tokenizer

CONFIG_ENV = "CTXLOCK_SERVE_CONFIG"
_RECORD_ID = re.compile(r"[0-9a-f]{4,64}")


class Service:
    """What the routes share: the config, the loaded models, the pool, the metrics and the span stream."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        # First: a server configured to export spans without the `otel` extra is refused before a model loads.
        self.spans = otel_stream(config.otel)
        self.models = Models(config)
        lim = config.limits
        self.pool = Pool(lim.pool_size, lim.queue_depth, lim.render_deadline_seconds)
        self.metrics = Metrics()
        self.prices = None
        if config.prices is not None:
            self.prices = PriceTable.parse(read_input(Path(config.prices), label="server.prices"), config.prices)

    def store(self) -> Store:
        if self.config.store is None:
            raise RouteNotFoundError(
                "this server keeps no records", path="server.store", hint="set server.store in ctxlock.toml"
            )
        return Store(self.config.store)


def json_body(data: bytes) -> Any:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestEncodingError("the body is not valid UTF-8", path=f"byte {exc.start}") from None
    try:
        return loads_strict(text, "$", Utf8Policy.STRICT)
    except ValueError as exc:  # what json itself raises (an empty body, a truncated one) before ctxlock's checks
        msg, pos = getattr(exc, "msg", str(exc)), getattr(exc, "pos", None)
        raise RequestJSONError(
            f"not valid JSON: {msg}", path=f"$ (character {pos})" if pos is not None else "$"
        ) from None


def object_body(data: bytes) -> dict[str, Any]:
    body = json_body(data)
    if not isinstance(body, dict):
        raise RequestValidationError("the body is a JSON object", path="$")
    return body


def query_flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None:
        return False
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise RequestValidationError(f"?{name} is 1/true or 0/false", path=f"?{name}")


def page_param(request: Request) -> int | None:
    """The viewer's ?page=N (1-based), or None."""
    value = request.query_params.get("page")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or len(value) > 9 or int(value) < 1:
        raise RequestValidationError("?page is a page number from 1", path="?page")
    return int(value)


def record_id(value: str) -> str:
    # An id or an id prefix, never a path: the store is the only place a record is read from.
    if not _RECORD_ID.fullmatch(value):
        raise RequestValidationError("a record id is 4 to 64 lowercase hex digits", path="{id}")
    return value


def load_record(store: Store, rid: str) -> ExecutionRecord:
    try:
        body = store.get_record(record_id(rid))
    except ArtifactNotFoundError as exc:
        raise RecordNotFoundError(exc.message, path=f"record {rid}", hint="GET /v1/records lists the ids") from None
    return ExecutionRecord.from_bytes(body, source=f"record {rid}")


def route(svc: Service, fn: Callable[[Service, Request, bytes], Callable[[], Any]]) -> Callable:
    """A route: read the body on the loop, then run the work `fn` returns on the pool; a dict answers as JSON."""

    async def endpoint(request: Request) -> Response:
        try:
            data = await request.body()
        except ClientDisconnect:  # the edge logs it as one line; there is no one left to answer
            return Response(status_code=400)
        work = fn(svc, request, data)
        try:
            result = await svc.pool.run(work)
        except Exception as exc:  # every failure answers as typed JSON here, not in Starlette's error page
            code, body, headers = error_body(as_ctxlock_error(exc), request.url.path)
            return JSONResponse(body, status_code=code, headers={k.decode(): v.decode() for k, v in headers})
        if isinstance(result, Response):
            return result
        tokens = result.pop("_tokens", None) if isinstance(result, dict) else None
        if tokens is not None:
            svc.metrics.tokens(*tokens)
        headers = result.pop("_headers", None) if isinstance(result, dict) else None
        if isinstance(result, dict) and "_body" in result:  # an answer that is not an object (a list)
            result = result["_body"]
        return JSONResponse(result, headers=headers)

    return endpoint


def _served(svc: Service, body: dict[str, Any] | None, request: Request) -> ServedModel:
    if len(request.query_params.getlist("model")) > 1:
        raise RequestValidationError("?model is given more than once", path="?model", hint="name one served model")
    name = request.query_params.get("model")
    if name is None and body is not None:
        name = body.get("model")
    return svc.models.get(name)


def _peer_served(svc: Service, body: dict[str, Any], request: Request) -> tuple[ServedModel, dict[str, str]]:
    """A peer route's model: `_served`, with server.fallback_model answering an unknown body `model`; the headers
    say when it did (`X-Ctxlock-Model-Fallback: <the served name>`)."""
    if request.query_params.get("model") is not None:
        return _served(svc, body, request), {}
    sm, fell_back = svc.models.resolve(body.get("model"))
    return sm, ({"X-Ctxlock-Model-Fallback": sm.name} if fell_back else {})


def tokenize(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        body = object_body(data)
        sm, headers = _peer_served(svc, body, request)
        if "content" in body:
            out = shapes.llama_tokenize(sm, body)
        else:
            out = shapes.vllm_tokenize(sm, body, allow_named=svc.config.allow_named_templates)
        return {**out, "_tokens": (sm.name, len(out["tokens"])), "_headers": headers}

    return work


def detokenize(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        body = object_body(data)
        sm, headers = _peer_served(svc, body, request)
        named = body.get("model") is not None and not headers
        return {**shapes.detokenize(sm, body, named=named), "_headers": headers}

    return work


def simple(fn: Callable[..., dict[str, Any]], *, named: bool = False) -> Callable:
    def handler(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
        def work() -> Any:
            body = object_body(data)
            sm, headers = _peer_served(svc, body, request)
            if named:
                return {**fn(sm, body, allow_named=svc.config.allow_named_templates), "_headers": headers}
            return {**fn(sm, body), "_headers": headers}

        return work

    return handler


def chat_render(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/chat/completions/render (vLLM's): a GenerateRequest with the request's exact token ids."""

    def work() -> Any:
        body = object_body(data)
        sm, headers = _peer_served(svc, body, request)
        out = vllm_render.chat_render(sm, body, allow_named=svc.config.allow_named_templates)
        return {**out, "_tokens": (sm.name, len(out["token_ids"])), "_headers": headers}

    return work


def completion_render(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/completions/render (vLLM's): a GenerateRequest per prompt."""

    def work() -> Any:
        body = object_body(data)
        sm, headers = _peer_served(svc, body, request)
        out = vllm_render.completion_render(sm, body)
        return {"_body": out, "_tokens": (sm.name, sum(len(g["token_ids"]) for g in out)), "_headers": headers}

    return work


def tokenizer_info(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    """GET /tokenizer_info (?model=): vLLM's route, for the default model or the named one."""

    def work() -> Any:
        return shapes.tokenizer_info(_served(svc, None, request))

    return work


def render(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/render: the body is the request file `ctxlock render` reads; the answer is its --json output."""

    def work() -> Any:
        sm = _served(svc, None, request)
        no_gp, cont = query_flag(request, "no_generation_prompt"), query_flag(request, "continue_final_message")
        options = sm.options(add_generation_prompt=not (no_gp or cont), continue_final_message=cont)
        if query_flag(request, "record"):
            store = svc.store()
            result, rec, error = run_and_record(sm.model, data, RunOptions(**options.to_record()), template=sm.template)
            used = sm.template or (result.rendered.template if result is not None else None)
            if used is None and sm.model.templates is not None:
                used = sm.model.templates.select(None)
            with store:
                rid = save(store, sm.model, rec, used)
            if svc.spans is not None:
                svc.spans.submit(
                    span_builder(sm, rid, rec, used, svc.config.otel)
                )  # never waits: a full queue drops it
            if error is not None:
                raise error
            out = {**run_to_dict(sm.model, result), "record_id": rid}
        else:
            out = run_to_dict(sm.model, sm.model.run(data, options))
        return {**out, "_tokens": (sm.name, out["num_tokens"])}

    return work


def count(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/count: `ctxlock count --json` (?marginal=1, ?no_generation_prompt=1)."""

    def work() -> Any:
        sm = _served(svc, None, request)
        kw = sm.option_kwargs()
        if query_flag(request, "no_generation_prompt"):
            kw["add_generation_prompt"] = False
        counts = sm.model.count(data, marginal=query_flag(request, "marginal"), **kw)
        return {**counts.to_dict(), "_tokens": (sm.name, counts.total)}

    return work


def fit(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/fit: `ctxlock fit --json` under the model's configured budget policy."""

    def work() -> Any:
        sm = _served(svc, None, request)
        if sm.budget is None:
            raise RouteNotFoundError(
                f"model {sm.name!r} has no budget policy", path=f"models.{sm.name}.budget", hint="configure one"
            )
        policy = dict(sm.budget)
        if query_flag(request, "no_generation_prompt"):
            policy["generation_prefix"] = "none"
        options = sm.options(add_generation_prompt=None)
        req = options.parse(data)
        fitted = fit_context(req, sm.model, BudgetPolicy.from_dict(policy), **options.to_kwargs(parse=False))
        sent = fitted_request_json(json.loads(data), req, fitted)
        return fit_to_dict(fitted, sent, None)

    return work


def cache_report(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/cache-report?provider=P: the body is the JSONL session `ctxlock cache-report` reads; the answer is
    its --json output (?ttl, ?min_prefix, ?fix, ?price_model with the configured price table)."""

    def work() -> Any:
        sm = _served(svc, None, request)
        q = request.query_params
        try:
            ttl, minimum = float(q.get("ttl", "300")), int(q.get("min_prefix", "1024"))
        except ValueError:
            raise RequestValidationError("?ttl is seconds and ?min_prefix an integer", path="?ttl") from None
        if not (0 <= ttl < 1e9 and 0 <= minimum < 1 << 31):
            raise RequestValidationError("?ttl and ?min_prefix are non-negative", path="?ttl")
        price_model = q.get("price_model")
        session = read_session(decode_utf8(data, label="body", error=RequestEncodingError), "body")
        run = run_cache_report(
            sm.model,
            session,
            q.get("provider", ""),
            options=sm.option_kwargs(),
            table=svc.prices if price_model is not None else None,
            price_model=price_model,
            ttl=ttl,
            minimum=minimum,
            fix=query_flag(request, "fix"),
        )
        return run.to_dict()

    return work


def records_list(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        try:
            limit = int(request.query_params.get("limit", "50"))
        except ValueError:
            raise RequestValidationError("?limit is an integer", path="?limit") from None
        if not 1 <= limit <= 1000:
            raise RequestValidationError("?limit is 1..1000", path="?limit")
        with svc.store() as store:
            return JSONResponse(store.list_records(limit=limit, model=request.query_params.get("model")))

    return work


def record_show(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        with svc.store() as store:
            return load_record(store, request.path_params["id"]).data

    return work


def record_replay(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        with svc.store() as store:
            result, _ = replay(load_record(store, request.path_params["id"]), store)
            return result.to_dict()

    return work


_PARSE_FIELDS = {"model", "output", "tools", "request", "tool_format", "reasoning", "finish_reason", "starts", "shape"}


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise RequestValidationError(f"{key} is a string", path=f"$.{key}")
    return value


def parse_route(svc: Service, request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/parse: `ctxlock parse`'s JSON for a completion of the served model (docs/parse.md)."""

    def work() -> Any:
        body = object_body(data)
        shapes.refuse_unknown(body, _PARSE_FIELDS, "/v1/parse")
        sm = _served(svc, body, request)
        output = body.get("output")
        if not isinstance(output, str) and not (
            isinstance(output, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in output)
        ):
            raise RequestValidationError("output is the completion's text or a list of its token ids", path="$.output")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RequestValidationError("tools is a list of tools", path="$.tools")
        answered = body.get("request")
        if answered is not None and not isinstance(answered, dict):
            raise RequestValidationError("request is the chat request this completion answers", path="$.request")
        shape = _optional_str(body, "shape") or "openai"
        if shape not in ("openai", "anthropic"):
            raise RequestValidationError("shape is openai or anthropic", path="$.shape")
        notes = [] if "finish_reason" in body else ["no finish_reason: the response is taken to have ended normally"]
        parsed = sm.model.parse_output(
            output,
            request=None if answered is None else json.dumps(answered).encode(),
            tools=tools,
            tool_format=_optional_str(body, "tool_format"),
            reasoning=_optional_str(body, "reasoning"),
            finish_reason=_optional_str(body, "finish_reason") if "finish_reason" in body else "stop",
            starts=_optional_str(body, "starts"),
        )
        out = parsed.to_dict(shape)
        out["notes"] += notes
        return out

    return work


def records_diff(svc: Service, _request: Request, data: bytes) -> Callable[[], Any]:
    """POST /v1/diff `{"a": ID, "b": ID}`: `ctxlock diff A B --json`."""

    def work() -> Any:
        body = object_body(data)
        shapes.refuse_unknown(body, {"a", "b"}, "/v1/diff")
        with svc.store() as store:
            ra, rb = (load_record(store, str(body.get(k, ""))) for k in ("a", "b"))
            with record_values(ra, rb):
                return diff(ra, rb).to_dict()

    return work


def models(svc: Service, _request: Request, _data: bytes) -> Callable[[], Any]:
    def work() -> Any:
        rows = []
        for sm in svc.models.by_name.values():
            tok = sm.model.tokenizer
            rows.append(
                {
                    "id": sm.name,
                    "object": "model",
                    "model": sm.model.id,
                    "default": sm.name == svc.models.default,
                    "tokenizer": {"id": tok.id, "sha256": tok.sha256},
                    "max_model_len": sm.max_model_len,
                    "named_templates": sorted(sm.named),
                    "budget": sm.budget is not None,
                }
            )
        return {"object": "list", "data": rows}

    return work


@contextlib.contextmanager
def record_tokenizer(svc: Service, rec: ExecutionRecord, store: Store) -> Iterator[Tokenizer]:
    """The tokenizer a record was made with: a served model's own when its artifact digest (and vocabulary size) is
    the record's, else rebuilt from the record's stored artifacts (about a second for a large vocabulary)."""
    want = (rec.data.get("tokenizer") or {}).get("sha256")
    for sm in svc.models.by_name.values():
        tok = sm.model.tokenizer
        if want is not None and tok.sha256 == want and tok.vocab_size == rec.data["tokenizer"].get("vocab_size"):
            yield tok
            return
    with materialized(rec, store) as (model, _template):
        yield model.tokenizer


def record_view(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    """GET /records/{id}/view[?page=N]: the record as one self-contained HTML page, its tokens from its own tokenizer,
    `limits.view_page_tokens` token chips a page."""
    lim = svc.config.limits

    def work() -> Any:
        rid = request.path_params["id"]
        with svc.store() as store:
            rec = load_record(store, rid)
            with record_values(rec), record_tokenizer(svc, rec, store) as tokenizer:
                page = record_page(
                    rid, rec.data, tokenizer, page=page_param(request) or 1, page_tokens=lim.view_page_tokens
                )
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP})

    return work


def diff_view(svc: Service, request: Request, _data: bytes) -> Callable[[], Any]:
    """GET /diff/{a}/{b}/view[?page=N]: two records side by side, the first divergence (the diff module's)
    highlighted; by default the page of `limits.view_page_tokens` tokens that holds it."""
    lim = svc.config.limits

    def work() -> Any:
        ids = request.path_params["a"], request.path_params["b"]
        with svc.store() as store:
            ra, rb = (load_record(store, rid) for rid in ids)
            with record_values(ra, rb):
                result = diff(ra, rb).to_dict()
                sha_a, sha_b = ((r.data.get("tokenizer") or {}).get("sha256") for r in (ra, rb))
                same = sha_a is not None and sha_a == sha_b
                with record_tokenizer(svc, ra, store) as ta, contextlib.ExitStack() as stack:
                    tb = ta if same else stack.enter_context(record_tokenizer(svc, rb, store))
                    sides = [(ids[0], ra.data, ta), (ids[1], rb.data, tb)]
                    page = diff_page(sides, result, page=page_param(request), page_tokens=lim.view_page_tokens)
        return HTMLResponse(page, headers={"Content-Security-Policy": CSP})

    return work


async def healthz(_request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def metrics_route(svc: Service) -> Callable:
    async def endpoint(_request: Request) -> Response:
        text = svc.metrics.render(caches.cache_info(), in_flight=svc.pool.admitted)
        if svc.spans is not None:
            text += "\n".join(otel_lines(svc.spans.stats())) + "\n"
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return endpoint


def openapi_route() -> Callable:
    document = openapi_document()

    async def endpoint(_request: Request) -> Response:
        return JSONResponse(document)

    return endpoint


async def http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    err = RouteNotFoundError(
        "no such route" if exc.status_code == 404 else f"HTTP {exc.status_code}: {exc.detail}",
        path=_request.url.path,
        hint="see docs/serving.md for the routes",
        status=exc.status_code,
    )
    code, body, headers = error_body(err, _request.url.path)
    return JSONResponse(body, status_code=code, headers={k.decode(): v.decode() for k, v in headers})


async def ctxlock_error(_request: Request, exc: Exception) -> Response:
    code, body, headers = error_body(as_ctxlock_error(exc), _request.url.path)
    return JSONResponse(body, status_code=code, headers={k.decode(): v.decode() for k, v in headers})


def routes(svc: Service) -> list[Route]:
    def post(path: str, fn: Callable) -> Route:
        return Route(path, route(svc, fn), methods=["POST"])

    def get(path: str, fn: Callable) -> Route:
        return Route(path, route(svc, fn), methods=["GET"])

    return [
        post("/tokenize", tokenize),
        post("/detokenize", detokenize),
        post("/apply-template", simple(shapes.apply_template, named=True)),
        get("/tokenizer_info", tokenizer_info),
        post("/v1/chat/completions/render", chat_render),
        post("/v1/completions/render", completion_render),
        post("/v1/messages/count_tokens", simple(shapes.anthropic_count)),
        post("/v1/responses/input_tokens", simple(shapes.openai_input_tokens)),
        post("/v1/render", render),
        post("/v1/count", count),
        post("/v1/fit", fit),
        post("/v1/cache-report", cache_report),
        get("/v1/records", records_list),
        get("/v1/records/{id}", record_show),
        post("/v1/records/{id}/replay", record_replay),
        post("/v1/diff", records_diff),
        post("/v1/parse", parse_route),
        get("/v1/models", models),
        get("/records/{id}/view", record_view),
        get("/diff/{a}/{b}/view", diff_view),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics_route(svc), methods=["GET"]),
        Route("/openapi.json", openapi_route(), methods=["GET"]),
    ]


def lifespan(svc: Service) -> Callable:
    @contextlib.asynccontextmanager
    async def span(_app: Starlette) -> AsyncIterator[None]:
        yield
        # uvicorn has drained the in-flight requests (their records are committed before they answer).
        svc.pool.shutdown()
        if svc.spans is not None and svc.config.otel is not None:  # their spans are sent (flushed) before the exit
            stats = svc.spans.close(timeout=svc.config.otel.timeout_seconds + 5.0)
            print(f"ctxlock serve: {otel_summary(stats)}", file=sys.stderr)

    return span


def create_app(config: ServeConfig) -> Edge:
    """The ASGI application for `config`: the models are loaded (and warmed up) here, before the first request."""
    svc = Service(config)
    app = Starlette(
        routes=routes(svc),
        exception_handlers={HTTPException: http_error, CtxlockError: ctxlock_error, Exception: ctxlock_error},
        lifespan=lifespan(svc),
    )

    def route_of(scope: Any) -> str:
        for r in app.routes:
            if isinstance(r, Route) and r.matches(scope)[0] != Match.NONE:
                return r.path
        return "(unmatched)"

    lim = config.limits
    edge = Edge(
        app,
        tokens=config.tokens,
        max_body=lim.max_body_bytes,
        metrics=svc.metrics,
        route_of=route_of,
        rate=lim.requests_per_second,
        burst=lim.burst,
    )
    edge.service = svc  # type: ignore[attr-defined]
    return edge


def factory() -> Edge:
    """`uvicorn --factory ctxlock.server.app:factory`: the app for the config named by $CTXLOCK_SERVE_CONFIG."""
    return create_app(load_config(os.environ.get(CONFIG_ENV) or None))
