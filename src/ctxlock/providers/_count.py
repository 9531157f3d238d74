"""Closed providers' input tokens, part by part, each figure labelled exact, documented or estimated.

**OpenAI** (`provider="openai"`): the model's published encoding (`openai:MODEL`, tiktoken's mapping; the ranks file
of the bpe-openai package, pinned by tiktoken's sha256) counts every text exactly: message contents, names, tool
call arguments. What OpenAI adds around them:

- the message framing, by the rule of OpenAI's cookbook "How to count tokens with tiktoken"
  (https://cookbook.openai.com/examples/how_to_count_tokens_with_tiktoken): 3 tokens per message, the role's tokens,
  1 per `name` (beside the name's own tokens), and 3 that prime the reply. Documented;
- images, by OpenAI's tile or patch rule per model and `detail` (`_images`). Documented;
- tool definitions, by the same cookbook's function-calling estimate (per function 7 tokens on o200k models, 10 on
  cl100k ones, the `name:description` text, 3 per property plus its `name:type:description` text, enums, and 12 at
  the end). OpenAI does not publish how it renders tools: estimated;
- an assistant turn's tool calls: the name's and the arguments' tokens, and 3 per call for the framing, which is not
  published: estimated.

**Anthropic** (`provider="anthropic"`): no tokenizer is published. Text is counted with a proxy, named in the output
(o200k_base); images by Anthropic's published rule; a base64 PDF by its documented 1,500 to 3,000 tokens per page
of text plus the page's image; the tool-use system prompt by Anthropic's published table where it has the model;
everything else estimated. Each estimated figure's range is a prior (`PRIOR`) until `ctxlock calibrate` has
measured the error on the user's own traffic; a calibration then scales each kind of part and gives the range it
measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from ctxlock.artifacts import openai_encoding
from ctxlock.core import thaw
from ctxlock.errors import ProviderCountError
from ctxlock.model import Model, load
from ctxlock.multimodal import image_sizes
from ctxlock.providers._images import anthropic_image, openai_image
from ctxlock.providers._values import Basis, PartCount, ProviderCount
from ctxlock.request import Message, Request, parse_request

PROVIDERS = ("openai", "anthropic")
# An uncalibrated estimate's range: ctxlock's prior, not a measurement (docs/closed-providers.md). The low and high
# factors apply to the point figure.
PRIOR = (0.75, 1.35)
ANTHROPIC_PROXY = "openai:o200k_base"
# Anthropic's tool-use system prompt by model and tool_choice (auto/none, any/tool), as its pricing table lists it
# (https://docs.anthropic.com/en/docs/agents-and-tools/tool-use/overview#pricing).
_ANTHROPIC_TOOL_PROMPT: tuple[tuple[str, int, int], ...] = (
    ("claude-opus-4", 346, 313),
    ("claude-sonnet-4", 346, 313),
    ("claude-haiku-4", 346, 313),
    ("claude-3-7-sonnet", 346, 313),
    ("claude-3-5-haiku", 264, 340),
    ("claude-3-opus", 530, 281),
    ("claude-3-sonnet", 159, 235),
    ("claude-3-haiku", 264, 340),
)
PDF_PAGE_TEXT = (1500, 3000)  # Anthropic: "1,500-3,000 tokens per page", beside each page's image
PDF_PAGE_IMAGE = (0, 1600)  # the page's image, by the image rule, at most about 1,600 tokens


def _estimate(part: str, kind: str, tokens: int, method: str) -> PartCount:
    lo, hi = PRIOR
    return PartCount(part, kind, tokens, math.floor(tokens * lo), math.ceil(tokens * hi), "estimated", method)


def _exact(part: str, kind: str, tokens: int, method: str) -> PartCount:
    return PartCount(part, kind, tokens, tokens, tokens, "exact", method)


def _texts(message: Message) -> list[str]:
    if message.content is None:
        return []
    if isinstance(message.content, str):
        return [message.content]
    return [str(p["text"]) for p in message.content if p.get("type") == "text" and isinstance(p.get("text"), str)]


def _other_parts(message: Message) -> list[tuple[int, str]]:
    """(index, type) of the content parts that are neither text nor an image nor a document."""
    if message.content is None or isinstance(message.content, str):
        return []
    return [
        (i, str(p.get("type")))
        for i, p in enumerate(message.content)
        if p.get("type") not in ("text", "image_url", "image", "document")
    ]


def _detail(message: Message, part_index: int) -> str:
    if message.content is None or isinstance(message.content, str):
        return "auto"
    part = message.content[part_index]
    image_url = part.get("image_url")
    if isinstance(image_url, Mapping) and isinstance(image_url.get("detail"), str):
        return str(image_url["detail"])
    return "auto"


def _part_index(path: str, message_path: str) -> int:
    rest = path[len(message_path) :]
    return int(rest[len(".content[") : rest.index("]")])


class _Counter:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.tok = model.tokenizer

    def n(self, text: str) -> int:
        return len(self.tok.encode(text)) if text else 0


def _openai_tool(c: _Counter, tool: Mapping[str, Any], func_init: int) -> int:
    # The cookbook's estimate (module docstring); its reading of the schema, property by property.
    fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
    assert isinstance(fn, Mapping)
    n = func_init + c.n(f"{fn.get('name', '')}:{str(fn.get('description') or '').rstrip('.')}")
    params = fn.get("parameters")
    props = params.get("properties") if isinstance(params, Mapping) else None
    if isinstance(props, Mapping) and props:
        n += 3
        for key, prop in props.items():
            n += 3
            prop = prop if isinstance(prop, Mapping) else {}
            enum = prop.get("enum")
            if isinstance(enum, (list, tuple)):
                n -= 3
                n += sum(3 + c.n(str(item)) for item in enum)
            n += c.n(f"{key}:{prop.get('type', '')}:{str(prop.get('description') or '').rstrip('.')}")
    return n


def _images(request: Request, media: Mapping[str, bytes] | None) -> dict[str, tuple[int, int, int]]:
    """{part path: (message index, width, height)} of every image."""
    out: dict[str, tuple[int, int, int]] = {}
    for size in image_sizes(request, media, unfetched=True):
        message = request.messages[size.ref.message]
        base = message.source
        idx = _part_index(size.ref.path, base) if size.ref.path.startswith(base + ".content[") else -1
        out[f"{base}.content[{idx}]" if idx >= 0 else size.ref.path] = (size.ref.message, size.width, size.height)
    return out


def _tool_calls(c: _Counter, message: Message, per_call: int, method: str) -> PartCount | None:
    if not message.tool_calls:
        return None
    n = 0
    for call in message.tool_calls:
        args = (
            call.arguments if isinstance(call.arguments, str) else json.dumps(thaw(call.arguments), ensure_ascii=False)
        )
        n += per_call + c.n(call.name) + c.n(args)
    return _estimate(f"{message.source}.tool_calls", "tool_call", n, method)


def _documents(message: Message, provider: str) -> list[PartCount]:
    out: list[PartCount] = []
    if message.content is None or isinstance(message.content, str):
        return out
    for i, p in enumerate(message.content):
        if p.get("type") != "document":
            continue
        path = f"{message.source}.content[{i}]"
        pages = p.get("pages")
        if p.get("source") == "pdf" and isinstance(pages, int) and provider == "anthropic":
            lo = pages * (PDF_PAGE_TEXT[0] + PDF_PAGE_IMAGE[0])
            hi = pages * (PDF_PAGE_TEXT[1] + PDF_PAGE_IMAGE[1])
            method = (
                f"{pages} PDF pages x (1,500 to 3,000 text tokens + the page image, up to about 1,600): Anthropic's "
                "documented range; the point is its middle"
            )
            out.append(PartCount(path, "document", (lo + hi) // 2, lo, hi, "documented", method))
    return out


def count_openai(request: Request, model: str, media: Mapping[str, bytes] | None = None) -> ProviderCount:
    encoding = openai_encoding(model)
    m = load(f"openai:{model.removeprefix('openai:')}")
    c = _Counter(m)
    name = model.removeprefix("openai:")
    enc = f"{encoding} (tiktoken's encoding for {name})"
    parts: list[PartCount] = []
    notes: list[str] = []
    func_init = 7 if encoding == "o200k_base" else 10
    for i, tool in enumerate(request.tools or ()):
        method = "OpenAI cookbook's function-calling estimate; OpenAI does not publish how it renders tools"
        parts.append(_estimate(f"tools[{i}]", "tool", _openai_tool(c, tool, func_init), method))
    if request.tools:
        parts.append(_estimate("tool_framing", "framing", 12, "the cookbook's 12 tokens after the tool definitions"))
    images = _images(request, media)
    framing = 3
    names = 0
    for message in request.messages:
        text = sum(c.n(t) for t in _texts(message))
        parts.append(_exact(message.source, "text", text, enc))
        framing += 3 + c.n(message.role)
        if message.name:
            names += 1
            framing += 1 + c.n(message.name)
        for path, (_, w, h) in images.items():
            if path.startswith(message.source + ".content["):
                detail = _detail(message, _part_index(path, message.source))
                it = openai_image(name, w, h, detail)
                basis: Basis = "documented" if it.known_model and w > 0 else "estimated"
                if w == 0:
                    notes.append(f"{path}: an image URL without its bytes (--media URL=FILE): its size is unknown")
                parts.append(PartCount(path, "image", it.tokens, it.low, it.high, basis, it.rule))
        call = _tool_calls(c, message, 3, f"{enc} over each call's name and arguments, 3 per call (not published)")
        if call is not None:
            parts.append(call)
        for idx, kind in _other_parts(message):
            notes.append(f"{message.source}.content[{idx}]: a {kind} part, not counted (no published rule)")
        for found in _documents(message, "openai"):
            notes.append(f"{found.part}: a document, not counted (OpenAI publishes no rule for files)")
    for doc in request.documents or ():
        notes.append(f"a top-level document ({doc.get('title', 'untitled')}), not counted")
    method = (
        f"OpenAI's documented rule: 3 per message ({len(request.messages)}) and its role's tokens, 1 per name "
        f"({names}) with the name's tokens, 3 to prime the reply"
    )
    parts.append(PartCount("framing", "framing", framing, framing, framing, "documented", method))
    return ProviderCount(
        provider="openai",
        model=name,
        parts=tuple(parts),
        tokenizer=f"{encoding} sha256 {m.tokenizer.describe().get('file_sha256', '')}",
        exact_tokenizer=True,
        notes=tuple(notes),
    )


def _anthropic_tool_prompt(model: str, tool_choice: str) -> tuple[int, str] | None:
    found = [t for t in _ANTHROPIC_TOOL_PROMPT if model.startswith(t[0])]
    if not found:
        return None
    prefix, auto, forced = max(found, key=lambda t: len(t[0]))
    n = forced if tool_choice in ("any", "tool") else auto
    return n, f"Anthropic's tool-use system prompt for {prefix}, tool_choice {tool_choice}: {n} tokens (published)"


def count_anthropic(
    request: Request, model: str, media: Mapping[str, bytes] | None = None, *, tool_choice: str = "auto"
) -> ProviderCount:
    m = load(ANTHROPIC_PROXY)
    c = _Counter(m)
    proxy = "proxy o200k_base (Anthropic publishes no tokenizer)"
    parts: list[PartCount] = []
    notes: list[str] = []
    for i, tool in enumerate(request.tools or ()):
        fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool
        assert isinstance(fn, Mapping)
        sent = {"name": fn.get("name"), "description": fn.get("description"), "input_schema": fn.get("parameters")}
        as_sent = json.dumps({k: thaw(v) for k, v in sent.items() if v is not None}, ensure_ascii=False)
        parts.append(_estimate(f"tools[{i}]", "tool", c.n(as_sent), f"{proxy}, over the tool's JSON"))
    if request.tools:
        known = _anthropic_tool_prompt(model, tool_choice)
        if known is not None:
            prompt, said = known
            parts.append(PartCount("tool_framing", "framing", prompt, prompt, prompt, "documented", said))
        else:
            parts.append(
                _estimate("tool_framing", "framing", 346, "the Claude 4 figure; the model is not in the table")
            )
    images = _images(request, media)
    framing = 0
    for message in request.messages:
        text = sum(c.n(t) for t in _texts(message))
        parts.append(_estimate(message.source, "text", text, proxy))
        framing += 3
        for path, (_, w, h) in images.items():
            if path.startswith(message.source + ".content["):
                it = anthropic_image(w, h)
                image_basis: Basis = "documented" if w > 0 else "estimated"
                if w == 0:
                    notes.append(f"{path}: an image URL without its bytes (--media URL=FILE): its size is unknown")
                parts.append(PartCount(path, "image", it.tokens, it.low, it.high, image_basis, it.rule))
        call = _tool_calls(c, message, 8, f"{proxy}, over each call's name and input, 8 per call")
        if call is not None:
            parts.append(call)
        parts.extend(_documents(message, "anthropic"))
        for idx, kind in _other_parts(message):
            notes.append(f"{message.source}.content[{idx}]: a {kind} part, not counted (no published rule)")
    for doc in request.documents or ():
        notes.append(f"a top-level document ({doc.get('title', 'untitled')}), not counted")
    parts.append(_estimate("framing", "framing", framing + 4, "3 per message and 4 for the turn: not published"))
    return ProviderCount(
        provider="anthropic",
        model=model,
        parts=tuple(parts),
        tokenizer="o200k_base (proxy)",
        exact_tokenizer=False,
        notes=tuple(notes),
    )


def count_provider(
    request: bytes | str | Mapping[str, Any] | Request,
    *,
    provider: str,
    model: str,
    media: Mapping[str, bytes] | None = None,
    calibration: Any = None,
) -> ProviderCount:
    """A request's input tokens as `provider` counts them for `model`, part by part (module docstring)."""
    req = request if isinstance(request, Request) else parse_request(request, tool_arguments="as-sent")
    if provider == "openai":
        counted = count_openai(req, model, media)
    elif provider == "anthropic":
        raw = req.extra.get("tool_choice") if req.extra else None
        choice = str(raw.get("type")) if isinstance(raw, Mapping) else "auto"
        counted = count_anthropic(req, model, media, tool_choice=choice)
    else:
        raise ProviderCountError(
            f"no closed-provider count for {provider!r}", hint=f"providers: {', '.join(PROVIDERS)}"
        )
    if calibration is not None:
        counted = calibration.apply(counted)
    return counted
