"""Anthropic `document` blocks: base64 PDF (digest, size, page count by pypdf), plain text and content sources in
the canonical request; rendered through `documents` where the template reads them, a DocumentError at the block's
JSON path otherwise (and always for a PDF, whose text ctxlock does not extract); `count` marks the provider's own
document count as unknown. Real PDFs are written by pypdf; real templates come from the fetched llama.cpp set."""

from __future__ import annotations

import base64
import hashlib
import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pypdf import PdfWriter
from typer.testing import CliRunner

import ctxlock
import fetched
from ctxlock.accounting._layout import count, count_format
from ctxlock.cli import app
from ctxlock.errors import CtxlockError, DocumentError, RequestValidationError
from ctxlock.request import Dialect, parse_request
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

RAG = ChatTemplate(
    "{% for d in documents or [] %}[{{ d.title }}] {{ d.text }}\n{% endfor %}"
    "{% for m in messages %}{{ m.role }}: {% if m.content is string %}{{ m.content }}{% else %}"
    "{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}\n{% endfor %}",
    id="rag",
)


def _pdf(pages: int) -> bytes:
    writer = PdfWriter()
    for _ in range(pages):
        writer.add_blank_page(width=612, height=792)
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


def _request(*documents: dict, text: str = "Summarize the document.") -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": text}, *documents]}]}


def _pdf_block(data: bytes, **extra) -> dict:
    source = {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(data).decode()}
    return {"type": "document", "source": source, **extra}


TEXT_DOC = {
    "type": "document",
    "source": {"type": "text", "media_type": "text/plain", "data": "The meeting moved to Tuesday."},
    "title": "notes",
    "citations": {"enabled": True},
}
CONTENT_DOC = {
    "type": "document",
    "source": {"type": "content", "content": [{"type": "text", "text": "First."}, {"type": "text", "text": "Second."}]},
    "title": "chunks",
}


@pytest.fixture(scope="module")
def qwen() -> ctxlock.Model:
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2")))


def test_pdf_is_accepted_with_digest_and_page_count() -> None:
    data = _pdf(3)
    req = parse_request(_request(_pdf_block(data, title="report")))
    assert req.dialect is Dialect.ANTHROPIC
    part = req.messages[0].content[1]
    assert part["type"] == "document" and part["source"] == "pdf"
    assert part["sha256"] == hashlib.sha256(data).hexdigest()
    assert part["bytes"] == len(data) and part["pages"] == 3 and part["title"] == "report"


def test_text_and_content_documents_render_where_the_template_takes_documents(qwen) -> None:
    rendered = qwen.render(_request(TEXT_DOC, CONTENT_DOC), chat_template=RAG)
    assert rendered.text.startswith("[notes] The meeting moved to Tuesday.\n[chunks] First.\nSecond.\nuser: Summarize")
    paths = {s.path for s in rendered.request_spans}
    assert "messages[0].content[1].source.data" in paths  # provenance names where the client sent the text
    assert "messages[0].content[2].source.content[1].text" in paths


def test_request_documents_come_first_then_blocks(qwen) -> None:
    req = {**_request(TEXT_DOC), "documents": [{"title": "top", "text": "Top-level."}]}
    with pytest.raises(RequestValidationError):  # an Anthropic request has no top-level documents key ...
        parse_request(req, dialect="openai")
    rendered = qwen.render(_request(TEXT_DOC), chat_template=RAG, documents=[{"title": "caller", "text": "Caller."}])
    assert rendered.text.startswith("[caller] Caller.\n[notes] The meeting")


def test_real_rag_template_renders_a_text_document(qwen) -> None:
    source = (fetched.templates_dir() / "ibm-granite-granite-3.3-2B-Instruct.jinja").read_text("utf-8")
    granite = ChatTemplate(source, id="granite-3.3")
    rendered = qwen.render(_request(TEXT_DOC), chat_template=granite)
    assert "The meeting moved to Tuesday." in rendered.text
    # the same text sent as the HF `documents` variable renders the same way
    plain = qwen.render(
        {"messages": [{"role": "user", "content": "Summarize the document."}]},
        chat_template=granite,
        documents=[{"title": "notes", "text": "The meeting moved to Tuesday."}],
    )
    assert rendered.text == plain.text


def test_template_without_documents_is_a_typed_error_at_the_block(qwen) -> None:
    source = (fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text("utf-8")
    with pytest.raises(DocumentError) as info:
        qwen.render(_request(TEXT_DOC), chat_template=ChatTemplate(source, id="qwen2.5"))
    assert info.value.path == "messages[0].content[1]" and "documents" in info.value.message


def test_pdf_render_is_a_typed_error(qwen) -> None:
    with pytest.raises(DocumentError) as info:
        qwen.render(_request(TEXT_DOC, _pdf_block(_pdf(2))), chat_template=RAG)
    assert info.value.path == "messages[0].content[2]" and "2 pages" in info.value.message


def test_count_marks_the_provider_document_count_unknown(qwen) -> None:
    counts = count(qwen, _request(TEXT_DOC), chat_template=RAG)
    assert counts.provider_unknown == ("messages[0].content[1]",)
    assert counts.to_dict()["provider_document_tokens"] == {"messages[0].content[1]": "unknown"}
    assert any("unknown" in n for n in counts.notes)
    assert count_format(counts, "anthropic")["exact"] is False
    plain = count(qwen, {"messages": [{"role": "user", "content": "hi"}]}, chat_template=RAG)
    assert count_format(plain, "anthropic") == {"input_tokens": plain.total}


def test_cli_count_says_unknown(tmp_path) -> None:
    req = tmp_path / "req.json"
    req.write_text(json.dumps(_request(TEXT_DOC)), encoding="utf-8")
    tpl = tmp_path / "rag.jinja"
    tpl.write_text(RAG.source, encoding="utf-8")
    model = str(fetched.hf_tokenizer_dir("qwen2"))
    result = CliRunner().invoke(app, ["count", str(req), "--model", model, "--template", str(tpl), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["provider_document_tokens"] == {"messages[0].content[1]": "unknown"}


BAD = [
    ({"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "%%%"}}, "source.data"),
    (_pdf_block(b"not a pdf at all"), "source.data"),
    (_pdf_block(_pdf(2)[:60]), "source.data"),
    (_pdf_block(_pdf(0)), "source.data"),
    (
        {"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
        "source.media_type",
    ),
    ({"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}}, "source.type"),
    ({"type": "document", "source": {"type": "file", "file_id": "file_1"}}, "source.type"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/html", "data": "x"}}, "source.media_type"),
    ({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": 3}}, "source.data"),
    ({"type": "document", "source": {"type": "content", "content": [{"type": "image"}]}}, "source.content[0].type"),
    ({"type": "document", "source": {"type": "nope"}}, "source.type"),
    ({"type": "document"}, "source"),
    ({**TEXT_DOC, "extra": 1}, "extra"),
]


@pytest.mark.parametrize(("block", "where"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_documents_are_typed_errors_at_their_path(block, where) -> None:
    with pytest.raises(RequestValidationError) as info:
        parse_request(_request(block))
    expected = "messages[0].content[1]" + (f".{where}" if where else "")
    assert info.value.path == expected and info.value.hint


@settings(max_examples=examples(40), deadline=None)
@given(st.binary(max_size=2000))
def test_hostile_pdf_bytes_never_crash(tail) -> None:
    try:
        req = parse_request(_request(_pdf_block(b"%PDF-1.7\n" + tail)))
    except CtxlockError as exc:
        assert exc.path == "messages[0].content[1].source.data"
    else:
        assert req.messages[0].content[1]["pages"] >= 1
