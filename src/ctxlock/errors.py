"""Every exception ctxlock raises, under one root.

    CtxlockError
    ├── RequestError                 bytes -> Request
    │   ├── RequestEncodingError     invalid UTF-8 (names the byte offset)
    │   ├── RequestJSONError         malformed JSON, duplicate keys (names the JSON path)
    │   └── RequestValidationError   schema: unknown role, orphan tool result, bad arguments, ...
    ├── OptionError                  a keyword argument the API does not take (also a TypeError)
    ├── TemplateError                Request -> Rendered
    │   ├── TemplateNotFoundError    no template, or an unknown template name
    │   ├── TemplateSyntaxError      the template does not compile (names the line)
    │   ├── TemplateRaisedError      the template called raise_exception(...)
    │   ├── TemplateRuntimeError     the template failed while rendering
    │   ├── TemplateLimitError       the render went over its time or output budget
    │   ├── TemplateSecurityError    the sandbox refused an operation
    │   ├── TemplateDeterminismError the render would print a memory address (a function, a generator)
    │   ├── ContentFormatError       content parts a string-content template cannot take (an image)
    │   └── DocumentError            a document block the template cannot take (no `documents`, or a PDF)
    ├── ArtifactError                loading a model's files
    │   ├── ArtifactNotFoundError    a file or model that is not there
    │   ├── PathTraversalError       a config points outside its model directory
    │   └── ArtifactFormatError      a file that is there but malformed
    ├── TokenizerError               text -> ids
    │   └── ControlTokenError        special-token policy `raise` met a control token in a request string
    ├── TensorError                  ids -> ModelInput (batching, padding)
    │   └── TensorKeyError           a key a ModelInput does not have (also a KeyError)
    ├── BudgetError                  a context-budget policy that cannot be applied
    │   ├── BudgetExceeded           required segments over the budget; no room left for output
    │   └── CapacityUnknownError     a window is needed and neither the model's files nor a flag give one
    ├── ToolCallError                streamed tool calls (toolcalls): malformed, unknown tool, cut off, invalid
    │   ├── ToolCallTruncatedError   the response hit the output token limit
    │   ├── ToolCallValidationError  arguments that do not match the tool's JSON Schema
    │   └── ProviderStreamError      the provider reported an error inside a started stream (after HTTP 200)
    ├── UsageError                   a provider's usage object that is malformed or breaks its own invariants
    ├── PriceError                   a price table that is malformed, or has no price for what was used
    ├── ServeError                   `ctxlock serve`: its config and the HTTP edge
    │   ├── ServeConfigError         a ctxlock.toml that cannot be used as written
    │   ├── AuthError                no bearer token, or not a configured one (401)
    │   ├── BodyTooLargeError        a request body over the configured byte limit (413)
    │   ├── OverloadedError          the work queue is full (503, Retry-After)
    │   ├── DeadlineError            the request ran past the render deadline (503)
    │   ├── RouteNotFoundError       no such route, method or configured model name (404/405)
    │   └── InternalServeError       an unexpected failure, logged; typed and JSON, never a traceback
    ├── LiveServerError              `ctxlock probe`: a live server that cannot be asked, or whose answer is unusable
    │   ├── ServerUnreachableError   no connection, a timeout, a TLS failure
    │   ├── ServerAnswerError        not JSON, over the size cap, not the route's shape, a redirect elsewhere
    │   └── ServerRefusedError       a 4xx or 5xx answer, with the server's own message (401, 403: pass --token)
    ├── TrajectoryError              a token-in/token-out trajectory that cannot be built: an id outside the
    │                                vocabulary, steps out of order, a malformed trajectory line (names the JSON path)
    ├── TelemetryError               `ctxlock export --otel`/`import --otel`: a trace file that cannot be read as a
    │                                session, an OTLP endpoint that refused the spans, the `otel` extra missing
    ├── MediaError                   image bytes -> pixels -> placeholders (ctxlock.multimodal)
    │   ├── MediaSourceError         a URL ctxlock may not fetch, a bad data: URL or base64, missing supplied bytes
    │   ├── MediaTypeError           an unsupported media type, or one the bytes disagree with
    │   ├── ImageDecodeError         corrupt or truncated image bytes; an animated image under policy `error`
    │   ├── ImageSizeError           a pixel cap (decompression bomb), zero size, an aspect ratio over the limit
    │   │   └── ImageMemoryError     a decode over the decode-memory limit, refused from the header
    │   └── ImagePlacementError      an image the template has no placeholder for (text-only model, too many images)
    └── RecordError                  execution records, the store, replay
        ├── RecordFormatError        a record file that is corrupt, truncated or of an unknown format
        │   └── BundleError          a record bundle that is truncated, tampered or not what it declares
        ├── RecordNotFoundError      no record with that id (or prefix) in the store
        └── FixtureCheckError        replay's book-fixture check gave other ids: nothing was compared

Every error carries `path`: where the input went wrong (a JSON path, a byte offset, a template line, a file),
and `hint`: what to do about it. `to_dict()` is the wire form the CLI prints with `--json`.
"""

from __future__ import annotations


class CtxlockError(Exception):
    """Root of every ctxlock error."""

    kind = "error"

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.path = path
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        text = self.message
        if self.path:
            text = f"{self.path}: {text}"
        if self.hint:
            text = f"{text} ({self.hint})"
        return text

    def to_dict(self) -> dict[str, str | None]:
        return {"type": type(self).__name__, "message": self.message, "path": self.path, "hint": self.hint}


class RequestError(CtxlockError):
    """The request bytes could not become a valid canonical Request."""


class RequestEncodingError(RequestError):
    """The request is not valid UTF-8 under the `strict` policy."""


class RequestJSONError(RequestError):
    """The request is not valid JSON, or has a duplicate key."""


class RequestValidationError(RequestError):
    """The request is JSON, but not a valid chat request in its dialect."""


class OptionError(CtxlockError, TypeError):
    """A keyword argument that `Model.render/run/encode/encode_batch` do not take (`truncation=`, `max_length=`,
    a typo). `path` names the option, `hint` says what to use instead. It is a TypeError too, as Python's own
    error for an unexpected keyword argument is."""


class TemplateError(CtxlockError):
    """The chat template could not be loaded or rendered."""


class TemplateNotFoundError(TemplateError):
    pass


class TemplateSyntaxError(TemplateError):
    pass


class TemplateRaisedError(TemplateError):
    """The template itself rejected the conversation with raise_exception(); `message` is its own text."""


class TemplateRuntimeError(TemplateError):
    pass


class TemplateLimitError(TemplateError):
    pass


class TemplateSecurityError(TemplateError):
    pass


class TemplateDeterminismError(TemplateError):
    """The template would render a text that differs from run to run for the same inputs (it printed a memory
    address: a function, a method, a generator or an object without a value of its own)."""


class ContentFormatError(TemplateError):
    """The template reads message content as a string (its content format is "string") and a message holds a
    content part that is not text (an image): it cannot be joined into the string, and is never dropped silently.
    `path` names the part."""


class DocumentError(TemplateError):
    """A request's document block (Anthropic `document`) that the render cannot take: the template does not read
    `documents`, or the document is a PDF, whose text ctxlock does not extract. `path` names the block."""


class ArtifactError(CtxlockError):
    """A model artifact (tokenizer file, config, template file) is missing or malformed."""


class ArtifactNotFoundError(ArtifactError):
    pass


class PathTraversalError(ArtifactError):
    pass


class ArtifactFormatError(ArtifactError):
    pass


class TokenizerError(CtxlockError):
    pass


class ControlTokenError(TokenizerError):
    """A request string holds a control-token string and the special-token policy is `raise`."""


class TensorError(CtxlockError):
    pass


class MaskError(TensorError):
    """An assistant-token mask that cannot be made: a row with no trained token (never a silent zero mask), or a
    combination of options the mask rule does not take (`ctxlock.training`)."""


class TensorKeyError(TensorError, KeyError):
    """A key a ModelInput (or TorchInput) does not have: a KeyError too, as the mapping protocol requires."""

    def __str__(self) -> str:  # KeyError's own __str__ would print the repr of its argument
        return CtxlockError.__str__(self)


class RecordError(CtxlockError):
    pass


class RecordFormatError(RecordError):
    pass


class RecordNotFoundError(RecordError):
    pass


class BundleError(RecordFormatError):
    """A bundle (`records export --bundle`) that cannot be imported as it is: `path` names the entry."""


class FixtureCheckError(RecordError):
    """The book fixture (src/ctxlock/models/book, docs/records.md) did not give its ids here, so no replay on this
    machine can be trusted."""


class MediaError(CtxlockError):
    """Image input that cannot become pixels and placeholder tokens exactly. `path` is the JSON path of the part."""


class MediaSourceError(MediaError):
    """An image source ctxlock cannot read without I/O: an http(s) URL whose bytes the caller did not supply, a
    malformed `data:` URL, invalid base64."""


class MediaTypeError(MediaError):
    """An unsupported media type, or a declared media type the bytes' own signature disagrees with."""


class ImageDecodeError(MediaError):
    """Image bytes that Pillow cannot read (corrupt, truncated), or an animated image under the `error` policy."""


class ImageSizeError(MediaError):
    """An image whose header size breaks a limit: over the pixel cap (refused before decoding), zero-sized, or an
    aspect ratio over the family's limit."""


class ImageMemoryError(ImageSizeError):
    """An image whose decode would take more memory than the decode-memory limit (estimated from its header, before
    decoding; $CTXLOCK_MAX_DECODE_BYTES, default 256 MiB; docs/images.md)."""


class ImagePlacementError(MediaError):
    """Images and the template's placeholders do not pair up one to one: an image given to a template (or model)
    without image support, more images than placeholders, or a placeholder without its image."""


class InputError(CtxlockError):
    """A file or stream named as input (a request, --template, --file, --policy, --schema, stdin, --out) that
    cannot be used as given. `path` names the option and the file; nothing was read past the size cap."""


class BudgetError(CtxlockError):
    """A context-budget policy that cannot be applied as given."""


class CapacityUnknownError(BudgetError):
    """A budget or clamp needs the model's context window, and neither the model's files nor a flag give one."""


class BudgetExceeded(BudgetError):
    """The required segments alone do not fit, or no room is left for output. Nothing was silently dropped."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        hint: str | None = None,
        sizes: dict[str, int] | None = None,
        total: int | None = None,
        budget: int | None = None,
    ) -> None:
        self.sizes = dict(sizes or {})
        self.total = total
        self.budget = budget
        super().__init__(message, path=path, hint=hint)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "sizes": self.sizes, "total": self.total, "budget": self.budget}


class DecodeError(CtxlockError):
    """Token ids could not become text as given (output side: decoder, stop strings)."""


class IncompleteDecodeError(DecodeError):
    """The stream ended inside a multi-byte character: bytes were left that are not yet valid UTF-8."""


class HarmonyParseError(DecodeError):
    """Completion ids that are not a Harmony message stream (openai-harmony's parser refuses them too)."""


class ReasoningError(DecodeError):
    """A reasoning format that cannot apply here: an unknown format, or a tag that is not one token of the
    vocabulary (so it cannot be found in ids)."""


class ToolCallError(CtxlockError):
    """A streamed tool call that cannot be released: malformed, unknown tool, truncated or invalid arguments.

    It names the call (`index`, `call_id`, `tool_name`) so a server can answer it, lists every schema violation
    for invalid arguments, and the call indexes still pending when a stream was cut (`pending`)."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        hint: str | None = None,
        index: int | None = None,
        call_id: str | None = None,
        tool_name: str | None = None,
        violations: tuple[dict[str, str], ...] = (),
        pending: tuple[int, ...] = (),
    ) -> None:
        self.index = index
        self.call_id = call_id
        self.tool_name = tool_name
        self.violations = tuple(violations)
        self.pending = tuple(pending)
        super().__init__(message, path=path, hint=hint)

    def to_dict(self) -> dict:
        out: dict = dict(super().to_dict())
        if self.violations:
            out["violations"] = list(self.violations)
        if self.pending:
            out["pending"] = list(self.pending)
        return out


class ToolCallTruncatedError(ToolCallError):
    """The response hit the output token limit, so the tool call arguments may be truncated."""


class ToolCallValidationError(ToolCallError):
    """A complete tool call whose arguments do not validate against the tool's JSON Schema."""


class ProviderStreamError(ToolCallError):
    """The provider reported an error inside a stream that had already started (HTTP 200 was sent): an OpenAI
    chunk `{"error": {...}}` (or vLLM's `{"object": "error", ...}`), Anthropic's `event: error`.

    The stream is over. `provider_type`, `provider_message` and `provider_code` are the provider's own words;
    `pending` lists the calls that were not released (open, or complete but held until a normal end), `released`
    the calls an assembler in `release="early"` mode had already handed out before the error, and `result` the
    stream's `Result` up to the error (text, released calls, errors), for the record."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        hint: str | None = None,
        provider_type: str | None = None,
        provider_message: str | None = None,
        provider_code: str | int | None = None,
        pending: tuple[int, ...] = (),
        released: tuple[int, ...] = (),
        result: object = None,
    ) -> None:
        self.provider_type = provider_type
        self.provider_message = provider_message
        self.provider_code = provider_code
        self.released = tuple(released)
        self.result = result
        super().__init__(message, path=path, hint=hint, pending=pending)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out["provider"] = {"type": self.provider_type, "message": self.provider_message, "code": self.provider_code}
        if self.released:
            out["released"] = list(self.released)
        return out


class ConstraintError(CtxlockError):
    """A constrained-decoding grammar that cannot be compiled or applied."""


class UnsupportedSchemaError(ConstraintError):
    """The JSON Schema uses a feature the constraint engine does not support; it is rejected, never ignored."""


class SamplerError(CtxlockError):
    """Sampling parameters or logits that cannot be used as given."""


class UsageError(CtxlockError):
    """A provider usage object that is malformed, of an unknown shape, or breaks an invariant of its format (cached
    tokens more than the prompt, reasoning more than the output, a total that is not the sum of its parts)."""


class ExplainError(CtxlockError):
    """An `explain` input that cannot be used: a search text that is empty or too long, an events file that is
    not JSON objects, a record of the wrong kind."""


class ProviderCountError(CtxlockError):
    """A closed provider's count cannot be made: an unknown provider, a calibration file that is not one."""


class CalibrationError(ProviderCountError):
    """A usage log or calibration file `ctxlock calibrate` cannot use (names the file, line and JSON path)."""


class PriceError(CtxlockError):
    """A price table that cannot be read, a model it has no entry for, or no price for a kind of token used."""


class ServeError(CtxlockError):
    """`ctxlock serve`: its config, or a request the HTTP edge refuses before the pipeline sees it."""


class ServeConfigError(ServeError):
    """A ctxlock.toml (or CTXLOCK_SERVE_TOKENS) that cannot be used as written: `path` names the key."""


class AuthError(ServeError):
    """A protected route called without a bearer token, or with one the config does not hold."""


class BodyTooLargeError(ServeError):
    """A request body over the configured byte limit; it was not read past the limit."""


class HeadersTooLargeError(ServeError):
    """A request whose line and headers are over `limits.max_header_bytes`, or with more header fields than
    `limits.max_header_count`: HTTP 431, and the connection is closed (docs/serve-limits.md)."""


class RequestTimeoutError(ServeError):
    """A request whose headers did not end within `limits.header_timeout_seconds`, or whose body came slower than
    `limits.min_body_rate`: HTTP 408, and the connection is closed (docs/serve-limits.md)."""


class OverloadedError(ServeError):
    """Every pool worker is busy and the queue is full: try again after `retry_after` seconds."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None, retry_after: int = 1) -> None:
        self.retry_after = retry_after
        super().__init__(message, path=path, hint=hint)


class RateLimitedError(OverloadedError):
    """A bearer token (or, with no tokens configured, a client address) sent more requests than its configured rate
    (`limits.requests_per_second`, `limits.burst`): HTTP 429, try again after `retry_after` seconds."""


class DeadlineError(ServeError):
    """The request's work ran past the configured render deadline."""


class RouteNotFoundError(ServeError):
    """No such route or method, or a model name the config does not hold."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None, status: int = 404) -> None:
        self.status = status
        super().__init__(message, path=path, hint=hint)


class InternalServeError(ServeError):
    """An exception ctxlock did not expect while serving a request: logged in full on the server, answered as JSON."""


class TrajectoryError(CtxlockError):
    """A trajectory (ctxlock.trajectory) that cannot be built as given: a completion id outside the vocabulary,
    log-probs that do not pair with the ids, steps out of order, a malformed line of `ctxlock trajectory`'s input.
    `path` names the line and the JSON path."""


class TelemetryError(CtxlockError):
    """OpenTelemetry traces (docs/telemetry.md): an OTLP JSON file or Langfuse export that cannot be read as a
    session (`path` names the file and the JSON path), an OTLP endpoint that did not take the spans, or the `otel`
    extra not installed."""


class LiveServerError(CtxlockError):
    """`ctxlock probe` (docs/live-probe.md): a live server (vLLM, llama.cpp, `ctxlock serve`) that could not be asked,
    or whose answer cannot be used. `path` names the server's URL and the route."""


class ServerUnreachableError(LiveServerError):
    """No answer: the connection was refused or reset, the name does not resolve, TLS failed, or the answer did not
    come in full within the timeout."""


class ServerAnswerError(LiveServerError):
    """An answer that cannot be used: not JSON (or not strict JSON), over the response size cap (read no further),
    not the shape the route answers, or a redirect to another host (never followed)."""


class ServerRefusedError(LiveServerError):
    """The server answered a 4xx or 5xx status; `message` carries the server's own words and `status` the code."""

    def __init__(self, message: str, *, path: str | None = None, hint: str | None = None, status: int = 0) -> None:
        self.status = status
        super().__init__(message, path=path, hint=hint)

    def to_dict(self) -> dict:
        return {**super().to_dict(), "status": self.status}
