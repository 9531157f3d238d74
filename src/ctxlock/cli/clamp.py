"""`ctxlock clamp`: the output cap a request can ask for (Pi (github.com/badlogic/pi-mono)'s rule, docs/budgets.md):
room = window − input − margin, with margin = max(C, ⌈input·r⌉), the window from the model's files, a price table or a
flag, and the source of each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from ctxlock.accounting._layout import count
from ctxlock.budget._fit import clamp_margin, clamp_max_tokens
from ctxlock.cli.files import read_request, template_file
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.cli.render import JsonOpt, ModelOpt, RequestArg, TemplateOpt
from ctxlock.economics._capacity import Capacity, override, with_price
from ctxlock.economics._usage import PriceTable
from ctxlock.errors import BudgetError, CapacityUnknownError, UsageError
from ctxlock.model._model import Model, load
from ctxlock.outside._files import read_input
from ctxlock.request import parse_request

# The request fields that ask for an output length, by dialect (OpenAI Chat, OpenAI Responses, Anthropic).
REQUEST_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")

MaxTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--max-tokens",
        min=1,
        help="The output length asked for (default: the request's own max_completion_tokens, max_tokens or "
        "max_output_tokens; none: as much as fits).",
    ),
]
WindowOpt = Annotated[
    int | None,
    typer.Option("--context-window", min=1, help="The window N, over what the model's files or --prices state."),
]
MaxOutputOpt = Annotated[
    int | None,
    typer.Option("--max-output-tokens", min=1, help="The model's output limit, over what the files or --prices state."),
]
MarginOpt = Annotated[int, typer.Option("--margin", min=0, help="C: the smallest margin kept free, in tokens.")]
MarginFractionOpt = Annotated[
    float, typer.Option("--margin-fraction", min=0.0, max=1.0, help="r: the margin as a fraction of the input.")
]
PricesOpt = Annotated[
    Path | None,
    typer.Option("--prices", help="A price table (LiteLLM's format): its entry's max_input_tokens is the window."),
]
PriceModelOpt = Annotated[str | None, typer.Option("--price-model", help="The price table's entry (with --prices).")]
NoGenerationPromptOpt = Annotated[
    bool, typer.Option("--no-generation-prompt", help="Count the input without opening an assistant turn.")
]


def _capacity(m: Model, prices: Path | None, price_model: str | None, window: int | None, output: int | None):
    cap = m.capacity
    if prices is not None:
        if price_model is None:
            raise UsageError("a price table needs its entry", path="--price-model", hint="pass --price-model NAME")
        table = PriceTable.parse(read_input(prices, label=f"--prices {prices}"), str(prices))
        cap = with_price(cap, table.lookup(price_model), table.name)
    cap = override(cap, context_window=window, max_output_tokens=output)
    if cap.context_window is None:
        raise CapacityUnknownError(
            f"model {m.id!r} states no context window",
            path="--context-window",
            hint="pass --context-window N, or --prices P --price-model NAME",
        )
    return cap


def _requested(data: bytes, flag: int | None) -> tuple[int | None, str]:
    if flag is not None:
        return flag, "--max-tokens"
    extra = parse_request(data).extra
    for key in REQUEST_FIELDS:
        value = extra.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BudgetError(f"{key} must be a positive integer, got {value!r:.40}", path=key)
        return value, f"request {key}"
    return None, "none (as much as fits)"


def clamp_report(
    m: Model, data: bytes, cap: Capacity, requested: tuple[int | None, str], margin: int, r: float, **options: Any
) -> dict[str, Any]:
    """Everything the clamp decided, as one JSON-ready dict."""
    counts = count(m, data, **options)
    window = cap.context_window
    assert window is not None
    n = counts.total
    room = window - n - clamp_margin(n, margin, r)
    effective = clamp_max_tokens(window, n, requested[0], margin_tokens=margin, margin_fraction=r)
    limited_by = "requested" if requested[0] is not None and effective == requested[0] else "room"
    if cap.max_output_tokens is not None and cap.max_output_tokens < effective:
        effective, limited_by = cap.max_output_tokens, "max_output_tokens"
    return {
        "input_tokens": n,
        "request_bytes": counts.request_bytes,
        "context_window": window,
        "window_source": cap.source,
        "margin": clamp_margin(n, margin, r),
        "room": room,
        "requested": requested[0],
        "requested_source": requested[1],
        "max_output_tokens": cap.max_output_tokens,
        "output_source": cap.output_source,
        "max_tokens": effective,
        "limited_by": limited_by,
        "notes": list(cap.notes),
    }


def clamp(
    request: RequestArg = "-",
    model: ModelOpt = None,
    max_tokens: MaxTokensOpt = None,
    context_window: WindowOpt = None,
    max_output_tokens: MaxOutputOpt = None,
    margin: MarginOpt = 0,
    margin_fraction: MarginFractionOpt = 0.0,
    prices: PricesOpt = None,
    price_model: PriceModelOpt = None,
    template: TemplateOpt = None,
    no_generation_prompt: NoGenerationPromptOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """The max_tokens to send with this request (docs/budgets.md): min(asked, window − input − margin, the model's
    output limit), margin = max(--margin, ⌈input · --margin-fraction⌉). The window comes from --context-window, else
    --prices, else the model's files (config.json, params.json, GGUF, tokenizer_config.json), and the output names
    each source. No room left is an error (exit 1); so is a model with no window and no flag."""

    def go() -> dict[str, Any]:
        data = read_request(request)
        m = load(model)
        cap = _capacity(m, prices, price_model, context_window, max_output_tokens)
        options: dict[str, Any] = {"chat_template": template_file(template)} if template is not None else {}
        if no_generation_prompt:
            options["add_generation_prompt"] = False
        return clamp_report(m, data, cap, _requested(data, max_tokens), margin, margin_fraction, **options)

    out = guarded(as_json, go)
    if as_json:
        print_json(out)
        return
    console.print(f"[bold]max_tokens {out['max_tokens']:,}[/] (limited by {out['limited_by']})")
    console.print(f"input      {out['input_tokens']:,} tokens · request {out['request_bytes']:,} bytes")
    console.print(f"window     {out['context_window']:,} from {escape(out['window_source'])}")
    console.print(f"margin     {out['margin']:,} · room {out['room']:,}")
    asked = "-" if out["requested"] is None else f"{out['requested']:,}"
    console.print(f"asked      {asked} from {escape(out['requested_source'])}")
    limit = "-" if out["max_output_tokens"] is None else f"{out['max_output_tokens']:,}"
    console.print(f"output cap {limit} from {escape(out['output_source'])}")
    for note in out["notes"]:
        console.print(f"[yellow]note[/]       {escape(note)}")


def register(app: typer.Typer) -> None:
    app.command()(clamp)
