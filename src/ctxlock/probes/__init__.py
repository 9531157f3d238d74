"""The probe corpus: ordinary chat requests (a system turn, tools and their results, reasoning, content parts, ...)
shipped as data, extensible by the user, and rendered through a model's template to see how it behaves; the shared
ground of `ctxlock lint`, `ctxlock diff-template` and `ctxlock probe`."""
