"""`ctxlock calibrate`: fit a closed provider's estimates to the usage the provider reported for the user's own
requests, and measure the error left on requests held back from the fit (docs/closed-providers.md)."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from ctxlock.cli.files import open_output, read_request
from ctxlock.cli.output import console, guarded, print_json
from ctxlock.errors import InputError, OptionError
from ctxlock.providers import HOLDOUT, PROVIDERS, Calibration, fit, log_rows, read_calibration


def _lines(files: list[str]) -> Iterator[tuple[str, bytes]]:
    for name in files:
        data = read_request(name, option="LOG")
        for n, line in enumerate(data.split(b"\n"), 1):
            if line.strip():
                yield f"{name}:{n}", line


# Controls but tab and newline: a model name from the log would act on the terminal; shown escaped (count.py too).
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _label(text: str) -> str:
    return escape(_CONTROLS.sub(lambda m: repr(m.group())[1:-1], text))


def _write(out: Path, raw: bytes) -> None:
    """The calibration file, written whole: a FIFO or a device at `out` is refused before it is opened (opening a
    FIFO for writing waits for a reader), and a failed write (a full disk) is one error line."""
    try:
        mode = os.stat(out).st_mode
    except OSError:
        mode = None  # not there yet (open_output names a missing directory)
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError("is not a regular file", path=f"--out {out}", hint="pass a file path to write the calibration")
    with open_output(out) as f:
        f.write(raw)


def register(app: typer.Typer) -> None:
    @app.command("calibrate")
    def calibrate_cmd(
        logs: Annotated[
            list[str],
            typer.Argument(
                help='Usage logs: JSON lines {"request": {...as sent...}, "usage": {...as the provider reported '
                "it...}} (any usage shape `ctxlock usage` reads). - reads stdin."
            ),
        ],
        provider: Annotated[str, typer.Option("--provider", help="The provider the log is from: openai|anthropic.")],
        out: Annotated[Path, typer.Option("--out", help="Where to write the calibration file (JSON).")],
        model: Annotated[
            str | None,
            typer.Option("--model", help="The provider's model name (default: each request's `model`, one per log)."),
        ] = None,
        as_json: Annotated[
            bool, typer.Option("--json", help="Print one JSON object instead of the human view.")
        ] = False,
    ) -> None:
        """Fit one correction factor per kind of estimated part (text under the proxy tokenizer, tools, tool
        calls, framing) so that the count matches the provider's reported input tokens on your own requests, and
        measure the error left on every 5th request, held back from the fit. Writes a calibration file for
        `ctxlock count --provider P --calibration FILE`; its sha256 names it in every count that uses it. Nothing
        leaves the machine."""

        def go() -> Calibration:
            if provider not in PROVIDERS:
                raise OptionError(
                    f"no closed-provider count for {provider!r}", hint=f"--provider {'|'.join(PROVIDERS)}"
                )
            rows, name = log_rows(_lines(logs), provider=provider, model=model)
            cal = fit(rows, provider=provider, model=name, holdout=HOLDOUT)
            raw = cal.file_bytes()
            _write(out, raw)
            return read_calibration(raw, str(out))

        cal = guarded(as_json, go)
        if as_json:
            print_json({**cal.to_json(), "sha256": cal.sha256, "file": cal.source, "summary": cal.residuals.summary()})
            return
        console.print(
            f"[bold]{_label(cal.provider)} {_label(cal.model)}[/]: fitted on {cal.fitted_on} requests; "
            f"{_label(cal.residuals.summary())} (max {cal.residuals.max_pct:.1f}%)"
        )
        for kind, factor in sorted(cal.factors.items()):
            note = "  (not in the fit: factor 1, the prior range)" if kind in cal.unfitted else ""
            console.print(f"  {kind:<10} × {factor:.4f}{note}")
        console.print(f"wrote {_label(cal.source)} (sha256 {cal.sha256})")
