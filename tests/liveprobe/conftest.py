"""A real llama.cpp llama-server for the live-probe tests (tests/llama_server.py): built once per cache, started once
per test process on a tiny model around the real Qwen2 vocabulary, serving the Qwen2.5 template of the fixture set
(``--chat-template-file``; the GGUF embeds no template)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fetched
import llama_server

QWEN25_TEMPLATE = "Qwen-Qwen2.5-7B-Instruct.jinja"


@pytest.fixture(scope="session")
def tiny_qwen2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight model GGUF with the real qwen2 vocabulary and no chat template (25 MB, about 1 s)."""
    return llama_server.tiny_gguf("qwen2", tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf", chat_template=None)


@pytest.fixture(scope="session")
def qwen25_template() -> Path:
    return fetched.templates_dir() / QWEN25_TEMPLATE


@pytest.fixture(scope="session")
def qwen25_llama_server(tiny_qwen2_gguf: Path, qwen25_template: Path) -> Iterator[llama_server.LlamaServer]:
    """llama-server on ``tiny_qwen2_gguf`` with ``--chat-template-file`` the Qwen2.5 template; ``.url`` is its base
    URL. Started once per test process (about 1 s)."""
    with llama_server.running(tiny_qwen2_gguf, chat_template_file=qwen25_template) as server:
        yield server
