"""How many examples a property test draws: its weight times the profile's scale.

The profile is hypothesis' own (`--hypothesis-profile NAME` or `$HYPOTHESIS_PROFILE`), registered in
tests/conftest.py: `ci` (the default, what `make test` runs) draws each test's full weight; `dev` (what `make check`
runs) a tenth of it, at least 5, for a fast inner loop. A test states its weight as `examples(300)` instead of a bare
`max_examples=300`: the number says how much that property is worth relative to the others, the profile says how
much time the run has.
"""

from __future__ import annotations

import os

SCALES = {"ci": 1.0, "dev": 0.1}
DEFAULT = "ci"


def profile() -> str:
    name = os.environ.get("HYPOTHESIS_PROFILE", DEFAULT)
    if name not in SCALES:
        raise ValueError(f"HYPOTHESIS_PROFILE={name!r}: the profiles are {sorted(SCALES)}")
    return name


def examples(weight: int) -> int:
    """max_examples for a test of this weight under the active profile."""
    scale = SCALES[profile()]
    return weight if scale >= 1 else min(weight, max(5, round(weight * scale)))
