"""`ctxlock lint`: a chat template checked against the failures templates ship with (arguments it never reads, a
double BOS, history it rewrites, raises ordinary requests reach, a clock read, training masks, portability to other
Jinja engines), each finding with its template line, as text, JSON or SARIF."""

from ctxlock.lint._engines import ENGINES, Engine
from ctxlock.lint._findings import Finding, Report, Rule, Severity, Skipped
from ctxlock.lint._fix import TagResult, tag_generation
from ctxlock.lint._lint import CHECKS, RULES, lint
from ctxlock.lint._portability import OTHER_ENGINES
from ctxlock.lint._sarif import to_sarif

__all__ = [
    "CHECKS",
    "ENGINES",
    "OTHER_ENGINES",
    "RULES",
    "Engine",
    "Finding",
    "Report",
    "Rule",
    "Severity",
    "Skipped",
    "TagResult",
    "lint",
    "tag_generation",
    "to_sarif",
]
