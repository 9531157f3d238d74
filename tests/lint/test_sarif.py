"""`ctxlock lint --sarif`: the log validates against the official SARIF 2.1.0 schema, and meets what GitHub code
scanning expects beyond it.

The schema is OASIS's sarif-2.1.0-rtm.5 JSON schema as the npm package @microsoft/jest-sarif ships it, fetched once
with `npm pack`, pinned by sha256 (`sarif_schema_path`). It leaves out what code scanning needs to show a result
(https://docs.github.com/en/code-security/code-scanning/integrating-with-code-scanning/sarif-support-for-code-scanning,
and Microsoft's SARIF validator's GH rules, src/Sarif.Multitool.Library/Rules/GH1001, GH1003, GH1005, GH2012 in
https://github.com/microsoft/sarif-sdk): a ruleId, a location whose artifact URI is relative (or a file: URI), a
region with startLine >= 1, a level code scanning knows, rules with short, full and help texts.

The logs: fixture templates linted from a working directory that holds them (findings with and without lines, a
template that does not compile, a file name that needs percent-encoding), a model's own templates (outside the
working directory: file: URIs), and a report with a rule that did not run.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import jsonschema
import pytest

import ctxlock
import fetched
from cli_runner import run_main
from ctxlock.errors import TemplateError
from ctxlock.lint import RULES, lint, to_sarif
from ctxlock.template import ChatTemplate

# ---------------------------------------------------------------------------------------------------- the schema


def sarif_schema_path() -> Path:
    """The official SARIF 2.1.0 schema, fetched and sha256-pinned by tests/fetched.py."""
    return fetched.sarif_schema_path()


# RFC 3986 URI references: the characters a URI may hold, percent-escapes well formed (jsonschema checks "uri" only
# with the rfc3987 package, which is not installed here).
_URI_CHARS = re.compile(r"(?:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})*")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")


def _format_checker() -> jsonschema.FormatChecker:
    checker = jsonschema.FormatChecker()

    @checker.checks("uri-reference")
    def _reference(value: object) -> bool:
        return not isinstance(value, str) or bool(_URI_CHARS.fullmatch(value))

    @checker.checks("uri")
    def _absolute(value: object) -> bool:
        return not isinstance(value, str) or (bool(_URI_CHARS.fullmatch(value)) and bool(_SCHEME.match(value)))

    return checker


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft4Validator:
    schema = json.loads(sarif_schema_path().read_text("utf-8"))
    assert schema["$schema"] == "http://json-schema.org/draft-04/schema#"
    return jsonschema.Draft4Validator(schema, format_checker=_format_checker())


def _validate(validator: jsonschema.Draft4Validator, log: dict[str, Any]) -> None:
    errors = sorted(validator.iter_errors(log), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors[:10])


def _code_scanning(log: dict[str, Any], *, relative: bool = True) -> list[dict[str, Any]]:
    """What code scanning needs beyond the schema (see the module's docstring); the results."""
    [run] = log["runs"]
    rules = run["tool"]["driver"]["rules"]
    for rule in rules:
        assert rule["id"] and rule["shortDescription"]["text"] and rule["fullDescription"]["text"]
        assert rule["help"]["text"]
    for result in run["results"]:
        assert result["ruleId"] and rules[result["ruleIndex"]]["id"] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note")
        assert result["message"]["text"].strip()
        assert result["partialFingerprints"]
        assert result["locations"]
        for location in result["locations"]:
            physical = location["physicalLocation"]
            uri = physical["artifactLocation"]["uri"]
            if relative:
                assert not _SCHEME.match(uri) and not uri.startswith("/"), uri
            else:
                assert uri.startswith("file:///"), uri
            start = physical["region"]["startLine"]
            assert isinstance(start, int) and start >= 1
    fingerprints = [json.dumps(r["partialFingerprints"]) for r in run["results"]]
    assert len(set(fingerprints)) == len(fingerprints), "two results code scanning would take for one"
    return list(run["results"])


# ----------------------------------------------------------------------------------------------------- the logs

FIXTURES = ("meta-llama-Llama-3.1-8B-Instruct.jinja", "google-gemma-2-2b-it.jinja")
BROKEN = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}\n"  # line 2 does not close its {{


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding the templates, as a repository does: templates/<fixture>, broken.jinja, and a
    copy of Gemma 2's template under a name with a space and a non-ASCII letter."""
    root = tmp_path_factory.mktemp("repo")
    (root / "templates").mkdir()
    for name in FIXTURES:
        shutil.copy(fetched.templates_dir() / name, root / "templates" / name)
    (root / "broken.jinja").write_text(BROKEN, "utf-8")
    shutil.copy(fetched.templates_dir() / FIXTURES[1], root / "templates" / "gemma två.jinja")
    return root


TARGETS = [*(f"templates/{n}" for n in FIXTURES), "broken.jinja", "templates/gemma två.jinja"]


@pytest.fixture(scope="module")
def linted(workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the SARIF log, the --json reports) of one `ctxlock lint --sarif FILE --json` run in the working directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        code, out, err = run_main(["lint", *TARGETS, "--sarif", "lint.sarif", "--json", "--fail-on", "never"])
    assert code == 0, err
    return json.loads((workdir / "lint.sarif").read_text("utf-8")), json.loads(out)


def test_the_log_validates_against_the_schema(validator: jsonschema.Draft4Validator, linted: Any) -> None:
    log, _ = linted
    _validate(validator, log)
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1


def test_the_log_meets_code_scanning(linted: Any) -> None:
    log, reports = linted
    results = _code_scanning(log)
    assert len(results) == sum(len(r["findings"]) for r in reports["reports"])
    assert {r["ruleId"] for r in results} >= {"syntax", "reachable-raise", "double-bos", "unread-argument"}
    driver = log["runs"][0]["tool"]["driver"]
    assert [r["id"] for r in driver["rules"]] == [*RULES, "syntax"]
    assert driver["name"] == "ctxlock lint" and driver["version"]


def test_results_are_at_the_findings_lines(workdir: Path, linted: Any) -> None:
    """A finding with a line is at that line of its file; one about the whole template at line 1; the syntax error
    at the line that does not parse; a file name is percent-encoded."""
    log, reports = linted
    results = log["runs"][0]["results"]
    findings = [(r["template"]["origin"], f) for r in reports["reports"] for f in r["findings"]]
    assert len(findings) == len(results)
    for (origin, finding), result in zip(findings, results, strict=True):
        physical = result["locations"][0]["physicalLocation"]
        assert unquote(physical["artifactLocation"]["uri"]) == origin
        assert result["ruleId"] == finding["rule"] and result["level"] == finding["severity"]
        assert physical["region"]["startLine"] == (finding["line"] or 1)
        assert result.get("properties", {}).get("probe") == finding["probe"]
    by_rule = {(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["ruleId"]): r for r in results}
    syntax = by_rule["broken.jinja", "syntax"]
    assert syntax["level"] == "error" and syntax["locations"][0]["physicalLocation"]["region"]["startLine"] == 2
    bos = by_rule["templates/meta-llama-Llama-3.1-8B-Instruct.jinja", "double-bos"]
    line = bos["locations"][0]["physicalLocation"]["region"]["startLine"]
    assert "bos_token" in (workdir / "templates" / FIXTURES[0]).read_text("utf-8").splitlines()[line - 1]
    assert ("templates/gemma%20tv%C3%A5.jinja", "reachable-raise") in by_rule


def test_a_model_s_templates_are_file_uris(validator: jsonschema.Draft4Validator) -> None:
    """A model's embedded templates: located at the model file (outside the working directory: a file: URI), the
    template line in the message; three templates in one file, their results told apart."""
    code, out, err = run_main(["lint", str(fetched.gguf_path("command-r")), "--sarif", "-", "--fail-on", "never"])
    assert code == 0, err
    log = json.loads(out)
    _validate(validator, log)
    results = _code_scanning(log, relative=False)
    assert {urlsplit(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]).path for r in results} == {
        str(fetched.gguf_path("command-r").resolve())
    }
    assert all(r["locations"][0]["physicalLocation"]["region"]["startLine"] == 1 for r in results)
    assert any("(template line " in r["message"]["text"] for r in results)


def test_a_rule_that_did_not_run_is_a_notification(validator: jsonschema.Draft4Validator) -> None:
    def boom(_: Any) -> list[Any]:
        raise TemplateError("it went wrong", path="boom")

    model = ctxlock.load(str(fetched.gguf_path("qwen2")))
    template = ChatTemplate("{% for m in messages %}{{ m['content'] }}{% endfor %}", id="inline")
    report = lint(model, template, rules=["boom", "nondeterminism"], extra={"boom": boom})
    log = to_sarif([report], list(RULES.values()), "0")
    _validate(validator, log)
    assert log["runs"][0]["results"] == []
    [note] = log["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert note["level"] == "warning" and "rule boom did not run: TemplateError" in note["message"]["text"]
