"""`ctxlock count`: the request's exact token count, attributed part by part, with each part's marginal cost."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.accounting._layout import Counts, count_format
from ctxlock.cli.files import read_request, template_file
from ctxlock.cli.images import MediaOpt, read_media
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt, TemplateOpt
from ctxlock.economics._capacity import Capacity
from ctxlock.errors import OptionError, PriceError, RequestValidationError
from ctxlock.model._model import load
from ctxlock.outside import loads_outside
from ctxlock.providers import ProviderCount, count_provider, load_calibration

_BAR = 30


def _show(counts: Counts, model_id: str, cap: Capacity) -> None:
    console.print(f"[bold]{escape(model_id)}[/] · {counts.total:,} tokens · request {counts.request_bytes:,} bytes")
    if cap.context_window is not None:
        left = cap.context_window - counts.total
        console.print(
            f"window {cap.context_window:,} from {escape(cap.source)} · {left:,} left (ctxlock clamp: the cap)"
        )
    else:
        console.print("window unknown (the model's files state none; ctxlock clamp --context-window N)")
    width = max((len(p.part) for p in counts.parts), default=8)
    for p in counts.parts:
        share = p.tokens / counts.total if counts.total else 0.0
        bar = "█" * round(share * _BAR)
        marginal = ""
        if counts.marginal:
            marginal = f"  marginal {p.marginal:+,}" if p.marginal is not None else f"  marginal -  ({p.marginal_note})"
        console.print(f"{escape(p.part):<{width}}  {p.tokens:>8,}  {share:6.1%}  {bar:<{_BAR}}{escape(marginal)}")
    for path in counts.unseen:
        console.print(f"[yellow]unseen[/]  {escape(path)}: the template wrote no byte of it; the model never sees it")
    for image in counts.images:
        steps = "; ".join(f"{s['step']} {tuple(s['from'])} -> {tuple(s['to'])}" for s in image["steps"])
        kind = image.get("kind", "image")
        source = f"{len(image['frames'])} frames" if kind == "video" else f"sha256 {image['sha256'][:16]}…"
        console.print(
            f"[cyan]{kind} {image['index']}[/]  {image['tokens']:,} tokens in {escape(image['part'])} "
            f"(grid {tuple(image['grid'])}; {escape(steps)}; {source})"
        )
    for note in counts.notes:
        console.print(f"[yellow]note[/]    {escape(note)}")


# C0 and C1 controls but tab and newline, and DEL: a model name, a document title or a tool name from the request
# would act on the terminal (a title change, colours) in the human view; they are shown escaped. --json is exact.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _label(text: str) -> str:
    return escape(_CONTROLS.sub(lambda m: repr(m.group())[1:-1], text))


def _show_provider(counted: ProviderCount) -> None:
    kind = "exact encoding" if counted.exact_tokenizer else "proxy"
    console.print(
        f"[bold]{_label(counted.provider)} {_label(counted.model)}[/] · {counted.total:,} input tokens "
        f"(range {counted.low:,}..{counted.high:,}; {counted.basis}) · {kind}: {_label(counted.tokenizer[:40])}"
    )
    by = counted.by_basis()
    console.print(" · ".join(f"{b} {n:,}" for b, n in by.items()))
    if counted.calibration is not None:
        cal = counted.calibration
        console.print(f"calibrated by {_label(cal['file'])} (sha256 {cal['sha256'][:16]}…): {_label(cal['summary'])}")
    width = max((len(p.part) for p in counted.parts), default=8)
    for p in counted.parts:
        span = "" if p.low == p.high else f" ({p.low:,}..{p.high:,})"
        console.print(f"{_label(p.part):<{width}}  {p.tokens:>8,}  {p.basis:<10}  {_label(p.method)}{_label(span)}")
    for note in counted.notes:
        console.print(f"[yellow]note[/]    {_label(note)}")


def _provider_count(
    request: str, provider: str, model: str | None, calibration: Path | None, media: list[str]
) -> ProviderCount:
    data = read_request(request)
    name = model
    if name is None:
        obj = loads_outside(data, "$", error=RequestValidationError)
        name = obj.get("model") if isinstance(obj, dict) else None
        if not isinstance(name, str) or not name:
            raise RequestValidationError(
                "no model to count for: the request names none",
                path="model",
                hint=f"pass --model (the {provider} model name, e.g. gpt-4o or claude-sonnet-4-5)",
            )
    cal = load_calibration(calibration) if calibration is not None else None
    return count_provider(data, provider=provider, model=name, media=read_media(media), calibration=cal)


PricesOpt = Annotated[
    str | None,
    typer.Option(
        "--prices",
        help="Also price each part (docs/bill.md): a LiteLLM-format price table (JSON or TOML), or genai-prices "
        "for its bundled data. A single request has no cache history: every token is uncached input.",
    ),
]
PriceModelOpt = Annotated[
    str | None, typer.Option("--price-model", help="The price entry for --prices (default: the request's model).")
]


ProviderOpt = Annotated[
    str | None,
    typer.Option(
        "--provider",
        help="Count as a closed provider counts: openai (text exact under the model's published encoding, the "
        "framing and images by OpenAI's documented rules, tools estimated) or anthropic (a proxy tokenizer, images "
        "and PDFs by Anthropic's rules). Each figure says exact, documented or estimated, with a range. --model is "
        "then the provider's model name (default: the request's).",
    ),
]
CalibrationOpt = Annotated[
    Path | None,
    typer.Option(
        "--calibration",
        help="With --provider: a calibration file from `ctxlock calibrate` (the estimates scaled by the factors it "
        "fitted on your logs, their ranges the error it measured; its sha256 is in the output).",
    ),
]


def _provider_cmd(
    request: str,
    provider: str,
    model: str | None,
    calibration: Path | None,
    media: list[str],
    format: str | None,
    as_json: bool,
    prices: str | None = None,
    price_model: str | None = None,
) -> None:
    def go() -> ProviderCount:
        if format is not None and format not in ("anthropic", "openai"):
            raise OptionError(f"unknown count format {format[:40]!r}", path="--format", hint="anthropic or openai")
        return _provider_count(request, provider, model, calibration, media)

    counted = guarded(as_json or format is not None, go)
    if prices is not None:  # --prices: the provider's parts, priced (one block of its own)
        priced = guarded(as_json, lambda: _priced(_provider_parts(counted), counted.model, prices, price_model))
        if as_json:
            print_json({**counted.to_dict(), "bill": priced})
        else:
            _show_provider(counted)
            _show_priced(priced)
        return
    if format is not None:
        shape = {"object": "response.input_tokens"} if format == "openai" else {}
        print_json(
            {
                **shape,
                "input_tokens": counted.total,
                "exact": counted.basis == "exact",
                "range": [counted.low, counted.high],
                "basis": counted.basis,
                "provider": counted.provider,
                "model": counted.model,
            }
        )
    elif as_json:
        print_json(counted.to_dict())
    else:
        _show_provider(counted)


def register(app: typer.Typer) -> None:
    @app.command("count")
    def count_cmd(
        request: Annotated[str, typer.Argument(help="Request JSON file, or - for stdin.")] = "-",
        model: ModelOpt = None,
        template: TemplateOpt = None,
        marginal: Annotated[
            bool,
            typer.Option(
                "--marginal",
                help="Also give each part's marginal cost: the total minus the total of the request without that "
                "part, rendered and tokenized in full (one more render per part).",
            ),
        ] = False,
        no_generation_prompt: Annotated[
            bool, typer.Option("--no-generation-prompt", help="Count without opening an assistant turn.")
        ] = False,
        format: Annotated[
            str | None,
            typer.Option(
                "--format",
                help='Print only the total in a provider\'s count-tokens shape: anthropic ({"input_tokens": N}) or '
                'openai ({"object": "response.input_tokens", "input_tokens": N}).',
            ),
        ] = None,
        media: MediaOpt = [],  # noqa: B006 (typer reads the default)
        provider: ProviderOpt = None,
        calibration: CalibrationOpt = None,
        as_json: JsonOpt = False,
        prices: PricesOpt = None,
        price_model: PriceModelOpt = None,
    ) -> None:
        """Count a request's tokens exactly, part by part: the template's own text, system, each tool, each
        message, each document and the generation prompt, summing to len(input_ids). Names every request part
        the template never wrote (the model never sees it). Also gives the request's size in bytes and the
        model's window with its source (--json: "capacity"), when its files state one. Images (for a model with
        an image processor) are counted exactly from their headers alone, with their resize steps; nothing is
        decoded."""

        if provider is not None:
            _provider_cmd(request, provider, model, calibration, media, format, as_json, prices, price_model)
            return
        if calibration is not None:
            raise OptionError("--calibration applies to a closed provider's count", hint="add --provider")

        def go() -> tuple[Counts, str, Capacity, dict[str, str]]:
            data = read_request(request)
            m = load(model)
            tpl = template_file(template)
            options: dict = {"chat_template": tpl} if tpl is not None else {}
            if no_generation_prompt:
                options["add_generation_prompt"] = False
            counts = m.count(data, marginal=marginal, media=read_media(media), **options)
            # The provider's shape holds this model's count: labelled as such (`count_format`), never bare.
            named = f"the model's {tpl!r}" if isinstance(tpl, str) else None
            by = {
                "model": m.id,
                "tokenizer": m.tokenizer.id,
                "template": named or (tpl.id if tpl else "the model's own"),
            }
            if format is not None:
                count_format(counts, format)  # an unknown format fails here, inside the JSON error handling
            return counts, m.id, m.capacity, by

        counts, model_id, cap, by = guarded(as_json or format is not None, go)
        # --prices: each part's dollars (ctxlock.economics.request_bill), in one block of its own.
        priced = None
        if prices is not None:
            priced = guarded(
                as_json, lambda: _priced(_count_parts(counts), _request_model(counts), prices, price_model)
            )
        if format is not None:
            print_json(count_format(counts, format, counted_by=by))
        elif as_json:
            print_json({**counts.to_dict(), "capacity": cap.to_dict(), **({"bill": priced} if priced else {})})
        else:
            _show(counts, model_id, cap)
            _show_priced(priced)


def _request_model(counts: Counts) -> str | None:
    data = counts.source  # the request as given (already parsed once by the count: valid JSON)
    raw = loads_outside(data, "$", error=RequestValidationError) if isinstance(data, bytes | str) else data
    name = raw.get("model") if isinstance(raw, dict) else None
    return name if isinstance(name, str) else None


def _count_parts(counts: Counts) -> list[Any]:
    # Imported only with --prices: a plain count does not load the bill.
    from ctxlock.economics import PartTokens

    return [PartTokens(p.part, p.tokens) for p in counts.parts]


def _provider_parts(counted: ProviderCount) -> list[Any]:
    # Imported only with --prices: a plain count does not load the bill.
    from ctxlock.economics._bill import provider_parts

    return provider_parts(counted.parts)


def _priced(parts: list[Any], model: str | None, prices: str, price_model: str | None) -> dict[str, Any]:
    """The request's parts priced as uncached input (`request_bill`)."""
    # Imported only with --prices: a plain count does not load the bill or the price readers.
    from ctxlock.economics import PriceTable, genai_table, request_bill
    from ctxlock.outside._files import read_input  # with the bill's: read only with --prices

    name = price_model or model
    if not isinstance(name, str) or not name:
        raise PriceError("the request names no model", path="$.model", hint="pass --price-model NAME")
    if prices == "genai-prices":
        table = genai_table([name]).table
    else:
        table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), prices)
    bill = request_bill(parts, table, name)
    return {"prices": {"name": table.name, "sha256": table.sha256}, **bill.to_dict()}


def _show_priced(priced: dict[str, Any] | None) -> None:
    if priced is None:
        return
    console.print(f"priced by {escape(priced['prices']['name'])} · {escape(priced['model'])} · all uncached input")
    for p in priced["parts"]:
        console.print(f"${p['total']:<16} {escape(p['part'])}")
    console.print(f"${priced['total']:<16} total")
