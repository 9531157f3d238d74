"""The lint tests run the portability rule with every engine: @huggingface/jinja from the pinned npm package."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fetched
from ctxlock.lint._engines import HF_JINJA_ENV


@pytest.fixture(autouse=True, scope="module")
def hf_jinja_package() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HF_JINJA_ENV, str(fetched.hf_jinja_dir()))
        yield
