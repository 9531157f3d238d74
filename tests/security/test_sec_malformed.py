"""Malformed model files and malformed Python requests raise only ctxlock's typed errors.

Model directories: a small HF directory (a byte-level BPE tokenizer.json trained here with `tokenizers`, a
tokenizer_config.json, special_tokens_map.json and chat_template.jinja) and manifest directories (the built-in
book model's ctxlock.json, and one naming an hf-tokenizers file) are damaged by generated mutations: bit flips,
truncations, invalid UTF-8, a JSON value of the wrong type, a lone surrogate, a deleted key, a deleted file, and
a directory or FIFO under a file's name. `ctxlock.load(dir)` must load or raise a CtxlockError, never a bare
KeyError, AttributeError, UnicodeError, OSError or RecursionError, and never block.

Requests: Python values nested past MAX_JSON_DEPTH or containing themselves raise the typed error bytes would.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
from ctxlock.artifacts import BUILTIN_DIR
from ctxlock.errors import ArtifactFormatError, CtxlockError, RequestError, RequestJSONError
from hypothesis_profiles import examples

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
FUZZ = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog", "天空为什么是蓝色？", "hello"] * 5, trainer)
    return tok.to_str()


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_originals(tmp_path_factory.mktemp("models"))


def build_originals(base: Path) -> dict[str, Path]:
    """The undamaged model directories, each loadable as is (checked)."""
    hf = base / "hf"
    hf.mkdir()
    (hf / "tokenizer.json").write_text(_tokenizer_json(), "utf-8")
    config = {
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": {"__type": "AddedToken", "content": "<|endoftext|>"},
    }
    (hf / "tokenizer_config.json").write_text(json.dumps(config), "utf-8")
    (hf / "special_tokens_map.json").write_text(json.dumps({"unk_token": "<|endoftext|>"}), "utf-8")
    (hf / "chat_template.jinja").write_text(CHATML, "utf-8")
    book = base / "book"
    shutil.copytree(BUILTIN_DIR / "book", book)
    manifest = base / "manifest-hf"
    manifest.mkdir()
    shutil.copyfile(hf / "tokenizer.json", manifest / "tokenizer.json")
    (manifest / "chat_template.jinja").write_text(CHATML, "utf-8")
    spec = {
        "description": "an hf-tokenizers file named by a manifest",
        "tokenizer": {"format": "hf-tokenizers", "file": "tokenizer.json"},
        "template": "chat_template.jinja",
        "special_tokens": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    }
    (manifest / "ctxlock.json").write_text(json.dumps(spec), "utf-8")
    dirs = {"hf": hf, "book": book, "manifest-hf": manifest}
    for d in dirs.values():
        ctxlock.load(str(d)).encode({"messages": [{"role": "user", "content": "hello"}]})
    return dirs


FILES = {
    "hf": ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"),
    "book": ("ctxlock.json", "chat_template.jinja"),
    "manifest-hf": ("ctxlock.json", "tokenizer.json", "chat_template.jinja"),
}
TARGETS = [(model, name) for model, names in FILES.items() for name in names]
JSON_TARGETS = [(m, n) for m, n in TARGETS if n.endswith(".json")]

# Values of every JSON type, plus the awkward ones: a lone surrogate, an unknown key's worth of nesting.
WRONG_VALUES = st.sampled_from(
    [None, True, 0, -1, 2**70, 1.5, "", "\ud800", "x\udfffy", "../../etc/passwd", "/dev/zero", [], [1], {}, {"a": 1}]
)


def load_only_typed(root: Path) -> None:
    """ctxlock.load(root) in a thread: it must return or raise a CtxlockError, within 20 s (a FIFO must not block)."""
    outcome: list[BaseException | None] = []

    def go() -> None:
        try:
            ctxlock.load(str(root))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    worker.join(20)
    assert outcome, f"ctxlock.load({root}) did not finish (blocked on a file?)"
    exc = outcome[0]
    if exc is not None and not isinstance(exc, CtxlockError):
        raise AssertionError(f"untyped {type(exc).__name__} from a malformed model: {exc}"[:500]) from exc


def _copy(originals: dict[str, Path], model: str, into: Path) -> Path:
    root = into / model
    shutil.copytree(originals[model], root)
    return root


@FUZZ
@given(target=st.sampled_from(TARGETS), data=st.data())
def test_bit_flips_and_truncations(
    target: tuple[str, str], data: st.DataObject, originals: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    model, name = target
    root = _copy(originals, model, tmp_path_factory.mktemp("flip"))
    path = root / name
    raw = bytearray(path.read_bytes())
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="cut at")]
    for bit in data.draw(st.lists(st.integers(0, 2**40), min_size=1, max_size=6), label="bits"):
        if raw:
            bit %= len(raw) * 8
            raw[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(raw))
    load_only_typed(root)


@FUZZ
@given(target=st.sampled_from(TARGETS), data=st.data())
def test_invalid_utf8(
    target: tuple[str, str], data: st.DataObject, originals: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A byte that cannot start or continue UTF-8 anywhere in the file: an ArtifactFormatError naming the file."""
    model, name = target
    root = _copy(originals, model, tmp_path_factory.mktemp("utf8"))
    path = root / name
    raw = path.read_bytes()
    at = data.draw(st.integers(0, len(raw)), label="at")
    bad = data.draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]), label="bytes")
    path.write_bytes(raw[:at] + bad + raw[at:])
    with pytest.raises(ArtifactFormatError) as exc:
        ctxlock.load(str(root))
    assert str(path) in str(exc.value.path)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every JSON path in a value, the root included."""
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            out += _paths(v, (*at, i))
    return out


def _replace(value: Any, at: tuple[Any, ...], new: Any, *, delete: bool) -> Any:
    if not at:
        return new
    parent = value
    for key in at[:-1]:
        parent = parent[key]
    if delete and isinstance(parent, dict):
        del parent[at[-1]]
    else:
        parent[at[-1]] = new
    return value


@FUZZ
@given(target=st.sampled_from(JSON_TARGETS), data=st.data())
def test_wrong_json_types_surrogates_and_missing_keys(
    target: tuple[str, str], data: st.DataObject, originals: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Any node of a JSON file (the root included: `[]` as a manifest) replaced by a value of another type or a
    lone surrogate, or a key deleted. ensure_ascii writes a surrogate as the escape `\\ud800`, valid JSON text."""
    model, name = target
    root = _copy(originals, model, tmp_path_factory.mktemp("json"))
    path = root / name
    value = json.loads(path.read_text("utf-8"))
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        at = data.draw(st.sampled_from(_paths(value)), label="path")
        new = copy.deepcopy(data.draw(WRONG_VALUES, label="value"))  # a later edit may go inside it
        value = _replace(value, at, new, delete=data.draw(st.booleans()))
    path.write_text(json.dumps(value, ensure_ascii=True), "ascii")
    load_only_typed(root)


@pytest.mark.parametrize(("model", "name"), TARGETS)
@pytest.mark.parametrize("replacement", ["missing", "directory", "fifo", "link-to-fifo"])
def test_file_replaced_by_nothing_a_directory_or_a_fifo(
    model: str, name: str, replacement: str, originals: dict[str, Path], tmp_path: Path
) -> None:
    """A deleted file, or a directory or FIFO under its name (a FIFO would block a read): loads or is typed."""
    root = _copy(originals, model, tmp_path)
    path = root / name
    path.unlink()
    if replacement == "directory":
        path.mkdir()
        (path / "inside.txt").write_text("x")
    elif replacement == "fifo":
        os.mkfifo(path)
    elif replacement == "link-to-fifo":
        os.mkfifo(root / "pipe")
        path.symlink_to("pipe")
    load_only_typed(root)


def test_the_reported_cases(originals: dict[str, Path], tmp_path: Path) -> None:
    """The red-team findings, one by one, with the error class and the file or field each must name."""

    def damaged(model: str, name: str, content: str | bytes | None) -> Path:
        root = tmp_path / f"{model}-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(originals[model], root)
        if content is None:
            (root / name).unlink()
        elif isinstance(content, bytes):
            (root / name).write_bytes(content)
        else:
            (root / name).write_text(content, "utf-8")
        return root

    cases = [
        (damaged("hf", "tokenizer.json", b"\x7b\xff"), ArtifactFormatError, "tokenizer.json"),
        (damaged("book", "ctxlock.json", "[]"), ArtifactFormatError, "ctxlock.json"),
        (damaged("book", "ctxlock.json", '{"tokenizer": {"format": "book"}}'), ArtifactFormatError, "vocab"),
        (damaged("manifest-hf", "tokenizer.json", None), ctxlock.errors.ArtifactNotFoundError, "tokenizer.json"),
        (damaged("hf", "tokenizer_config.json", '{"pad_token": "\\ud800"}'), ArtifactFormatError, "pad_token"),
        (
            damaged(
                "book",
                "ctxlock.json",
                '{"tokenizer": {"format": "book", "vocab": ["a"], "control": [], '
                '"unk": "a"}, "special_tokens": {"pad_token": "\\ud800"}}',
            ),
            ArtifactFormatError,
            "pad_token",
        ),
    ]
    chat_dir = damaged("hf", "chat_template.jinja", None)
    (chat_dir / "chat_template.jinja").mkdir()
    cases.append((chat_dir, ArtifactFormatError, "chat_template.jinja"))
    for root, error, names in cases:
        with pytest.raises(error) as exc:
            ctxlock.load(str(root))
        assert names in f"{exc.value.path} {exc.value.message}", (root, exc.value)


# ------------------------------------------------------------------------------------------- Python requests

MAX_DEPTH = 128  # request.MAX_JSON_DEPTH: bytes stop there, and so must Python values


def _nest(depth: int, kinds: list[bool]) -> Any:
    """`depth` containers, one inside the next; kinds[i] True = a dict, False = a list."""
    value: Any = "leaf"
    for i in range(depth):
        value = {"k": value} if kinds[i % len(kinds)] else [value]
    return value


@settings(max_examples=examples(40), deadline=None)
@given(depth=st.integers(1, 3000), kinds=st.lists(st.booleans(), min_size=1, max_size=5), where=st.integers(0, 2))
def test_deep_python_values_fail_like_bytes(depth: int, kinds: list[bool], where: int) -> None:
    """Nesting in a Mapping request is limited as in bytes: the same outcome, error class, message and path as the
    JSON text of the same value, whether it is the content, an extra field or a tool's parameters."""
    deep = _nest(depth, kinds)
    request: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}]}
    if where == 0:
        request["extra_field"] = deep
    elif where == 1:
        request["messages"][0]["content"] = deep
    else:
        request["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {"x": deep}}}]

    def outcome(data: Any) -> tuple[str, str, str | None] | None:
        try:
            ctxlock.parse_request(data)
        except RequestError as exc:
            return type(exc).__name__, exc.message, exc.path
        return None

    got = outcome(request)
    if depth < 500:  # json.dumps itself cannot write deeper values than Python's recursion limit allows
        assert got == outcome(json.dumps(request).encode())
    if depth >= MAX_DEPTH:
        assert got is not None and got[0] == "RequestJSONError"


def _cyclic(shape: list[int]) -> tuple[Any, str]:
    """A value that contains itself: containers nested along `shape` (0 = dict, 1 = list), the innermost one
    holding the outermost; returns it and the JSON path (below the field) where the cycle comes round."""
    outer: Any = {} if shape[0] == 0 else []
    node, path = outer, ""
    for kind in shape[1:]:
        child: Any = {} if kind == 0 else []
        if isinstance(node, dict):
            node["k"] = child
            path += ".k"
        else:
            node.append(child)
            path += "[0]"
        node = child
    if isinstance(node, dict):
        node["back"] = outer
        path += ".back"
    else:
        node.append(outer)
        path += f"[{len(node) - 1}]"
    return outer, path


@settings(max_examples=examples(40), deadline=None)
@given(shape=st.lists(st.integers(0, 1), min_size=1, max_size=8), in_messages=st.booleans())
def test_self_referencing_python_values_are_typed(shape: list[int], in_messages: bool) -> None:
    value, below = _cyclic(shape)
    if in_messages:
        request: dict[str, Any] = {"messages": [{"role": "user", "content": "hi", "meta": value}]}
        field = "messages[0].meta"
    else:
        request = {"messages": [{"role": "user", "content": "hi"}], "meta": value}
        field = "meta"
    with pytest.raises(RequestError) as exc:
        ctxlock.parse_request(request)
    assert "contains itself" in exc.value.message
    assert exc.value.path == f"{field}{below}"


def test_the_request_itself_in_its_messages() -> None:
    request: dict[str, Any] = {"messages": []}
    request["messages"].append(request)
    with pytest.raises(RequestError) as exc:
        ctxlock.parse_request(request)
    assert exc.value.path == "messages[0]"


def test_a_shared_value_is_not_a_cycle() -> None:
    """The same list twice (a DAG, not a cycle) is fine: JSON just writes it twice."""
    shared = [{"a": 1}]
    request = {"messages": [{"role": "user", "content": "hi"}], "x": shared, "y": [shared, shared]}
    text = json.dumps(request, separators=(",", ":"))
    assert ctxlock.parse_request(request).source_sha256 == ctxlock.parse_request(text).source_sha256


def test_depth_limit_is_exactly_the_bytes_limit() -> None:
    """127 nested containers below the request object pass, 128 do not, as for the same JSON text."""
    for depth, ok in ((MAX_DEPTH - 1, True), (MAX_DEPTH, False)):
        request = {"messages": [{"role": "user", "content": "hi"}], "x": _nest(depth, [False])}
        if ok:
            ctxlock.parse_request(request)
            continue
        with pytest.raises(RequestJSONError, match=f"deeper than {MAX_DEPTH}"):
            ctxlock.parse_request(request)
