"""Lint reports as one SARIF 2.1.0 log (https://docs.oasis-open.org/sarif/sarif/v2.1.0/sarif-v2.1.0.html), the
format code-scanning services read (GitHub's upload-sarif). One run, one result per finding, the rules listed in the
driver; a finding with a template line is located in the template's own file when the template is one, else at the
file it came from with the line in the message. Rules that could not run are tool notifications."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ctxlock.lint._findings import Finding, Report, Rule, Severity

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.NOTE: "note"}
_SYNTAX = Rule("syntax", "the template does not compile", "a syntax error fails every request")


def _uri(origin: str) -> tuple[str, bool]:
    """The artifact URI of a template's origin, and whether the template's lines are the file's lines (a .jinja file
    of its own). A URI reference relative to the working directory when the file is under it (what code scanning
    maps to the repository), else an absolute `file:` URI; percent-encoded either way (RFC 3986). The path as given
    is tried before the one its symlinks resolve to: a link in the repository to a file outside it is the
    repository's path, not the target's."""
    path = origin if os.path.exists(origin) else origin.rsplit(":", 1)[0]  # "model.gguf:tokenizer.chat_template"
    own = path.endswith(".jinja") and os.path.isfile(path)
    try:
        given, full, cwd = Path(os.path.abspath(path)), Path(path).resolve(), Path.cwd().resolve()
        same = given.exists() and full.exists() and given.samefile(full)  # lexical `..` after a link may not be
    except (OSError, RuntimeError):
        return quote(Path(path).as_posix()), own
    for candidate in (given, full) if same else (full,):
        try:
            return quote(candidate.relative_to(cwd).as_posix()), own
        except ValueError:
            continue
    return full.as_uri(), own


def _fingerprint(report: Report, f: Finding) -> str:
    """What tells this finding from the others of its file across runs: the template (a model's set has several in
    one file), the rule, the probe and the message. Not the template's digest: an edit elsewhere in the file keeps
    the finding the same alert."""
    key = "\0".join((report.template_id, f.rule, f.probe or "", f.message))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


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
            # Code scanning shows a result at a line only: a finding about the whole template is at its first.
            line = f.line if own and f.line is not None else 1
            location: dict[str, Any] = {"artifactLocation": {"uri": uri}, "region": {"startLine": line}}
            result: dict[str, Any] = {
                "ruleId": f.rule,
                "level": _LEVEL[f.severity],
                "message": {"text": text},
                "locations": [{"physicalLocation": location}],
                "partialFingerprints": {"ctxlockFinding/v1": _fingerprint(report, f)},
                "properties": {"templateSha256": report.template_sha256},
            }
            if f.rule in index:
                result["ruleIndex"] = index[f.rule]
            if f.probe:
                result["properties"]["probe"] = f.probe
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
                "help": {"text": f"{r.summary}. Seen in: {r.why}. ctxlock's docs: template-checks.md, rule {r.id}"},
            }
            for r in all_rules
        ],
    }
    invocation = {"executionSuccessful": True, "toolExecutionNotifications": notifications}
    run = {"tool": {"driver": driver}, "results": results, "invocations": [invocation]}
    return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}
