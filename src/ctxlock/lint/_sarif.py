"""Lint reports as one SARIF 2.1.0 log (https://docs.oasis-open.org/sarif/sarif/v2.1.0/sarif-v2.1.0.html), the
format code-scanning services read (GitHub's upload-sarif). One run, one result per finding, the rules listed in the
driver; a finding with a template line is located in the template's own file when the template is one, else at the
file it came from with the line in the message. Rules that could not run are tool notifications."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ctxlock.lint._findings import Report, Rule, Severity

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}
_SYNTAX = Rule("syntax", "the template does not compile", "a syntax error fails every request")


def _uri(origin: str) -> tuple[str, bool]:
    """The artifact URI of a template's origin (relative to the working directory when under it), and whether the
    template's lines are the file's lines (a .jinja file of its own)."""
    path = origin.split(":", 1)[0] if not os.path.exists(origin) else origin
    own = path.endswith(".jinja") and os.path.isfile(path)
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        return rel.as_posix(), own
    except (ValueError, OSError):
        return Path(path).as_posix(), own


def to_sarif(reports: Sequence[Report], rules: Sequence[Rule], version: str) -> dict[str, Any]:
    all_rules = [*rules, _SYNTAX]
    index = {r.id: i for i, r in enumerate(all_rules)}
    results: list[dict[str, Any]] = []
    notifications: list[dict[str, Any]] = []
    for report in reports:
        uri, own = _uri(report.origin or report.template_id)
        for f in report.findings:
            text = f.message if own or f.line is None else f"{f.message} (template line {f.line})"
            if f.hint:
                text = f"{text}. {f.hint}"
            location: dict[str, Any] = {"artifactLocation": {"uri": uri}}
            if own and f.line is not None:
                location["region"] = {"startLine": f.line}
            result: dict[str, Any] = {
                "ruleId": f.rule,
                "level": _LEVEL[f.severity],
                "message": {"text": text},
                "locations": [{"physicalLocation": location}],
                "partialFingerprints": {"templateSha256": report.template_sha256},
            }
            if f.rule in index:
                result["ruleIndex"] = index[f.rule]
            if f.probe:
                result["properties"] = {"probe": f.probe}
            results.append(result)
        for s in report.skipped:
            notifications.append(
                {"level": "warning", "message": {"text": f"{uri}: rule {s.rule} did not run: {s.reason}"}}
            )
    driver = {
        "name": "ctxlock lint",
        "version": version,
        "rules": [
            {
                "id": r.id,
                "name": r.id.replace("-", " ").title().replace(" ", ""),
                "shortDescription": {"text": r.summary},
                "fullDescription": {"text": f"{r.summary}. Seen in: {r.why}"},
                "help": {"text": f"ctxlock's docs: template-checks.md, rule {r.id}"},
            }
            for r in all_rules
        ],
    }
    invocation = {"executionSuccessful": True, "toolExecutionNotifications": notifications}
    run = {"tool": {"driver": driver}, "results": results, "invocations": [invocation]}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
