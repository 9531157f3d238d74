"""`ctxlock diff-template`: two chat templates (files, model directories, GGUF files or hub specs) compared by what
they render for the probe corpus, not by their Jinja text: the conversations that differ, the first diverging token of
each, and the capabilities that changed. Guide: docs/template-diff.md.

    >>> a, b = load_sides("old.jinja", "new.jinja", model="path/to/model")   # doctest: +SKIP
    >>> diff = diff_templates(a, b, load_corpus())                            # doctest: +SKIP
    >>> [(p.probe.name, p.divergence.index) for p in diff.differing]          # doctest: +SKIP
"""

from ctxlock.templatediff._capabilities import TEMPLATE_CAPABILITIES, CapabilityDiff, capability_diffs
from ctxlock.templatediff._diff import TemplateDiff, diff_templates
from ctxlock.templatediff._probe import ProbeDiff, compare
from ctxlock.templatediff._sides import TEMPLATE_SUFFIXES, Side, load_sides, spec_kind

__all__ = [
    "TEMPLATE_CAPABILITIES",
    "TEMPLATE_SUFFIXES",
    "CapabilityDiff",
    "ProbeDiff",
    "Side",
    "TemplateDiff",
    "capability_diffs",
    "compare",
    "diff_templates",
    "load_sides",
    "spec_kind",
]
