"""The llama-server the live-probe tests run against is the reference it should be: for one conversation, its
/apply-template prompt is ctxlock's render with the same template, and its /tokenize ids (and the count of
/v1/chat/completions/input_tokens) are ctxlock's ids for that prompt with the same GGUF vocabulary. A server that
cannot start fails with its own log's last lines."""

from __future__ import annotations

from pathlib import Path

import pytest

import llama_server
from ctxlock.artifacts import load_template_file
from ctxlock.model import load
from ctxlock.request import parse_request
from ctxlock.template import render

# Plain text only: request text that spells a control token is where ctxlock and llama.cpp differ on purpose.
MESSAGES = [
    {"role": "system", "content": "You are terse. Answer in one line."},
    {"role": "user", "content": "Wie spät ist es in Zürich?  Und in 東京 (UTC+9)?\n\n  Tabs:\tok 12345"},
    {"role": "assistant", "content": "Zürich 14:05, 東京 21:05."},
    {"role": "user", "content": "Danke! 🙂"},
]


def test_llama_server_renders_and_tokenizes_as_ctxlock(
    qwen25_llama_server: llama_server.LlamaServer, tiny_qwen2_gguf: Path, qwen25_template: Path
) -> None:
    url = qwen25_llama_server.url
    template = load_template_file(qwen25_template)
    expected_text = render(parse_request({"messages": MESSAGES}), template).text

    prompt = llama_server.post_json(url, "/apply-template", {"messages": MESSAGES})["prompt"]
    assert prompt == expected_text

    run = load(str(tiny_qwen2_gguf)).run({"messages": MESSAGES}, chat_template=template)
    assert run.rendered.text == expected_text
    body = {"content": prompt, "add_special": False, "parse_special": True, "with_pieces": False}
    ids = llama_server.post_json(url, "/tokenize", body)["tokens"]
    assert ids == list(run.tokenized.ids)
    assert ids.count(151644) == 5  # <|im_start|>: four turns and the generation prompt, each one control token

    counted = llama_server.post_json(url, "/v1/chat/completions/input_tokens", {"messages": MESSAGES})
    assert counted["input_tokens"] == len(ids)  # qwen2 adds no BOS


def test_a_server_that_cannot_start_says_why(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(llama_server.LlamaServerError) as caught, llama_server.running(tmp_path / "none.gguf", log=log):
        pass
    assert "exited with status 1" in str(caught.value)
    assert "failed to load model" in str(caught.value)  # the tail of the server's own log
    assert log.is_file()
