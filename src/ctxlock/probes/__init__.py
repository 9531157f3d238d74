"""The probe corpus: ordinary chat requests (a system turn, tools and their results, reasoning, content parts, ...)
shipped as data, extensible by the user, and rendered through a model's template to see how it behaves; the shared
ground of `ctxlock lint`, `ctxlock diff-template` and `ctxlock probe`."""

from ctxlock.probes._capabilities import CAPABILITIES, Verdict, capabilities
from ctxlock.probes._corpus import EXERCISES, Corpus, Probe, load_corpus, read_probes
from ctxlock.probes._render import (
    PROBE_NOW,
    Divergence,
    ProbeError,
    ProbeRender,
    diverge,
    excerpt,
    first_difference,
    render_probe,
    render_probes,
    text_difference,
)

__all__ = [
    "CAPABILITIES",
    "EXERCISES",
    "PROBE_NOW",
    "Corpus",
    "Divergence",
    "Probe",
    "ProbeError",
    "ProbeRender",
    "Verdict",
    "capabilities",
    "diverge",
    "excerpt",
    "first_difference",
    "load_corpus",
    "read_probes",
    "render_probe",
    "render_probes",
    "text_difference",
]
