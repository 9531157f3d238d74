"""Red-team regressions of the API and the CLI: defects that generated inputs found, each kept as a test."""

from __future__ import annotations

import copy
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

import ctxlock
import ctxlock.template._render
import fetched
import reference
from cli_runner import run_main as _main
from conformance import FIXED_NOW, TEMPLATE_KWARGS, vocab_for
from ctxlock.errors import CtxlockError
from ctxlock.template._render import ChatTemplate
from ctxlock.tensors._assemble import TorchInput

QWEN = "Qwen-Qwen2.5-7B-Instruct.jinja"
REQUESTS: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": "hi"}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]},
]


@pytest.fixture(scope="module")
def qwen() -> tuple[ctxlock.Model, ChatTemplate]:
    source = (fetched.templates_dir() / QWEN).read_text("utf-8")
    return ctxlock.load(str(fetched.hf_tokenizer_dir("qwen2"))), ChatTemplate(source, id=QWEN)


@pytest.mark.parametrize("batch", [False, True], ids=["encode", "encode_batch"])
def test_torch_input_pickles_copies_and_compares_like_batch_encoding(qwen, batch: bool) -> None:
    """`return_tensors="pt"` gave a TorchInput that pickle, copy and deepcopy could not rebuild (its read-only
    __setattr__ refused the slot state: a DataLoader worker pickles its batches) and whose == raised (Mapping's ==
    compares tensors elementwise). BatchEncoding does all three."""
    model, template = qwen
    kwargs = {"chat_template": template, "now": FIXED_NOW, "return_tensors": "pt"}

    def make() -> TorchInput:
        if batch:
            return model.encode_batch(REQUESTS, pad_to_multiple_of=8, **kwargs)  # type: ignore[return-value]
        return model.encode(REQUESTS[1], **kwargs)  # type: ignore[return-value]

    ti = make()
    for again in (pickle.loads(pickle.dumps(ti)), copy.copy(ti), copy.deepcopy(ti)):
        assert isinstance(again, TorchInput)
        assert list(again) == list(ti)
        assert all(again[k].equal(ti[k]) and again[k].dtype == ti[k].dtype for k in ti)
        assert again.model_input == ti.model_input
        assert again == ti
    assert ti == make()
    other = model.encode(REQUESTS[0], **kwargs)
    assert ti != other and ti != dict(ti)
    with pytest.raises(TypeError):
        hash(ti)  # torch tensors are mutable: unhashable, as a BatchEncoding is


# ---------------------------------------------------------------------------------------------------------------
# Content parts joined for a "string" template: every character of the joined string is the request's


def _covered(rendered: Any, start: int, end: int, prefix: str) -> list[int]:
    """The offsets in [start, end) that no request span of a path under `prefix` covers."""
    inside = set()
    for s in rendered.request_spans:
        if s.path == prefix or s.path.startswith((prefix + ".", prefix + "[")):
            inside.update(range(max(s.start, start), min(s.end, end)))
    return [k for k in range(start, end) if k not in inside]


def test_the_newlines_between_joined_parts_are_request_text_on_every_string_template() -> None:
    """The "\\n" ctxlock puts between text parts came from no template: it was attributed to the template's own text,
    so a client sending empty parts put runs of "trusted" newlines in the middle of its message (a control token made
    of newlines would have been honoured), and request_spans had holes in the message. Every template of the set that
    reads content as a string, with parts that are empty, newlines or text."""
    models: dict[str, ctxlock.Model] = {}
    shapes = [["alpha", "", "omega"], ["alpha", "", "", "\n", "omega"], ["alpha", "\n\n", "omega"], ["alpha", "omega"]]
    checked = set()
    for path in fetched.template_paths():
        source = path.read_text("utf-8")
        if ctxlock.template._render.content_format(source) != "string":
            continue
        vocab = vocab_for(path.name)
        model = models.setdefault(vocab, ctxlock.load(str(fetched.hf_tokenizer_dir(vocab))))
        template = ChatTemplate(source, id=path.name)
        for texts in shapes:
            parts = [{"type": "text", "text": t} for t in texts]
            data = {"messages": [{"role": "user", "content": parts}]}
            try:
                extra = TEMPLATE_KWARGS.get(path.name)
                rendered = model.render(data, chat_template=template, now=FIXED_NOW, chat_template_kwargs=extra)
            except CtxlockError:
                continue  # a template that needs more than one user message: nothing to look at
            joined = "\n".join(texts)
            start = rendered.text.find(joined)
            if start < 0:
                continue  # the template changed the content (strip, ...): its spans are checked elsewhere
            assert rendered.flattened == ("messages[0].content",)
            gaps = _covered(rendered, start, start + len(joined), "messages[0].content")
            assert not gaps, f"{path.name} {texts!r}: offsets {gaps} of the joined content are not request text"
            checked.add(path.name)
    assert len(checked) >= 30, sorted(checked)


# ---------------------------------------------------------------------------------------------------------------
# detok --json: an error is a JSON object on stdout too, as every other command's --json


BAD_IDS = ["[1,", "null", "{}", '["a"]', "[1.5]", "[-1]", "[true]", "[99999999999999999999]", "[[1]]", ""]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_detok_json_errors_are_json_lines_on_stdout(bad: str) -> None:
    """`detok --json` printed nothing on stdout for a bad input, where the README's convention (and every other
    command) prints {"error": {...}} with --json. detok's output is one JSON object per line, so the error is one
    line too, after the lines of the inputs before it."""
    for argv, stdin in (
        (["detok", "-m", "book", "--ids", bad, "--json"], b""),
        (["detok", "-m", "book", "--jsonl", "--json"], b"[4, 5]\n" + bad.encode() + b"\n[4]\n"),
    ):
        code, out, err = _main(argv, stdin)
        if bad == "" and "--jsonl" in argv:
            assert code == 0  # blank lines are skipped
            continue
        assert code == 1, (argv, code, err)
        assert len(err.splitlines()) == 1 and err.startswith("error: ")
        lines = out.splitlines()
        objects = [json.loads(line) for line in lines]  # every stdout line is one JSON object
        error = objects[-1]["error"]
        assert set(error) == {"type", "message", "path", "hint"}
        assert error["type"] in err and error["path"] in err  # the same error as the stderr line
        assert error["path"].startswith("stdin line 2" if "--jsonl" in argv else "--ids")
        if "--jsonl" in argv:
            assert objects[0]["text"] and len(objects) == 2  # the first line decoded; the third never read


# ---------------------------------------------------------------------------------------------------------------
# Content format detection: a template that reads parts without a for loop is not a "string" template

PARTS_WITHOUT_A_LOOP = {
    "map-attribute": "{% for m in messages %}[{{ m.role }}]{{ m.content | map(attribute='text') | join(' ') }}"
    "{% endfor %}",
    "index-attr": "{% for m in messages %}[{{ m.role }}]{{ m.content[0].text }}{% endfor %}",
    "index-item": "{% for m in messages %}[{{ m['role'] }}]{{ m['content'][0]['text'] }}{% endfor %}",
    "selectattr-first": "{% for m in messages %}[{{ m.role }}]"
    "{{ (m.content | selectattr('type', 'equalto', 'text') | first).text }}{% endfor %}",
    "first-filter": "{% for m in messages %}{{ (m.content | first)['text'] }}{% endfor %}",
    "last-message": "{{ messages[-1].content[0].text }}",
    "else-branch": "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
    "{{ m.content | map(attribute='text') | join(' ') }}{% endif %}{% endfor %}",
}


@pytest.mark.parametrize("name", list(PARTS_WITHOUT_A_LOOP))
def test_a_template_that_reads_parts_without_a_loop_gets_them_as_sent(name: str) -> None:
    """The detection looked only for `{% for part in message.content %}`: a template that reads
    `content[0].text` or `content|map(attribute='text')` was called "string", its parts were joined, and it then
    rendered the message as nothing (a joined string has no `.text`): the user's text silently dropped, where
    transformers renders it. Such a template reads parts ("openai"), and auto renders what transformers does."""
    source = PARTS_WITHOUT_A_LOOP[name]
    assert ctxlock.template._render.content_format(source) == "openai"
    model = ctxlock.load("book")
    parts = [{"type": "text", "text": "blue"}, {"type": "text", "text": "sky"}]
    messages = [{"role": "user", "content": parts}]
    expected = reference.reference_render(source, copy.deepcopy(messages))
    assert "blue" in expected
    rendered = model.render(
        {"messages": messages}, chat_template=ChatTemplate(source, id=name), add_generation_prompt=False
    )
    assert rendered.text == expected
    assert rendered.content_format == "openai" and rendered.flattened == ()


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}{{ m.content }}{% if m.content[0] == '/' %}!{% endif %}{% endfor %}",
        "{% for m in messages %}{{ m.content | trim | first }}{{ m.content[-1] }}{% endfor %}",
        "{% for m in messages %}{{ m['content'][:10] }}{{ m.text }}{{ (messages | first).content }}{% endfor %}",
    ],
    ids=["char-index", "first-char", "slice"],
)
def test_string_templates_that_index_characters_stay_string(source: str) -> None:
    assert ctxlock.template._render.content_format(source) == "string"


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_model_input_stays_read_only_through_pickle_and_deepcopy(qwen, side: str) -> None:
    """numpy unpickles and deep-copies arrays writable, so the "read-only", hashable ModelInput came back with
    writable arrays: its ids could then change under its hash. Rebuilt through the constructor, it is frozen again."""
    model, template = qwen
    mi = model.encode_batch(REQUESTS, chat_template=template, now=FIXED_NOW, padding_side=side)
    for again in (pickle.loads(pickle.dumps(mi)), copy.deepcopy(mi), copy.copy(mi)):
        assert again == mi and hash(again) == hash(mi)
        assert (again.valid_lengths, again.padding_side, again.pad_id) == (mi.valid_lengths, mi.padding_side, mi.pad_id)
        for key, array in again.items():
            assert not array.flags.writeable, key
            with pytest.raises(ValueError, match="read-only"):
                array[0, 0] = 0


# ---------------------------------------------------------------------------------------------------------------
# fit --policy: a field of the wrong JSON type is one error line naming it, never a traceback

BAD_FIELD_VALUES: list[Any] = ["100", 1.5, 1e309, True, None, [1], {}, 10**30 + 0.5]
POLICY_FIELDS = ["max_input_tokens", "reserve_output_tokens", "optional_priority", "order", "history"]


@pytest.mark.parametrize("field", POLICY_FIELDS)
def test_fit_policy_fields_of_the_wrong_type_are_one_line_naming_the_field(tmp_path, field: str) -> None:
    """`fit --policy` with `"order": 5`, `"optional_priority": null` or `"max_input_tokens": "100"` escaped as a
    TypeError or AttributeError traceback (issue 16, item 9: no input may produce one)."""
    example = Path(__file__).parents[2] / "examples" / "long-chat.json"
    policy = tmp_path / "policy.json"
    checked = 0
    for value in BAD_FIELD_VALUES:
        data = {} if field == "max_input_tokens" else {"max_input_tokens": 2000}
        if field == "history" and isinstance(value, str):
            continue  # a string history is checked by name (unknown history mode)
        if value is None and field in ("max_input_tokens", "order"):
            continue  # null is allowed there (order: none; max_input_tokens: then context_window is needed)
        data[field] = value
        policy.write_text(json.dumps(data), "utf-8")
        for extra in ([], ["--json"]):
            code, out, err = _main(["fit", "-m", "book", "--policy", str(policy), str(example), *extra])
            assert code == 1, (data, code, err)
            assert len(err.splitlines()) == 1 and err.startswith("error: BudgetError: "), (data, err)
            # A non-finite number (1e309 is written as Infinity) is refused by the strict JSON reader at its JSON
            # path in the file; every other value by the policy's own check, naming the policy field.
            named = f"$.{field}" if value == 1e309 else f"policy.{field}"
            assert named in err, (data, err)
            if extra:
                assert json.loads(out)["error"]["path"].endswith(named)
            checked += 1
    assert checked >= 12


@pytest.mark.parametrize("order", [5, 1.5, True, None, 10**30])
def test_a_sampling_order_that_is_not_an_array_is_one_line(tmp_path, order: Any) -> None:
    """`render --sampling` with `"order": 5` (or null, true) escaped as a TypeError traceback."""
    sampling = tmp_path / "sampling.json"
    sampling.write_text(json.dumps({"temperature": 0.7, "order": order}), "utf-8")
    request = b'{"messages": [{"role": "user", "content": "blue sky"}]}'
    for extra in ([], ["--json"]):
        code, out, err = _main(["render", "-m", "book", "--sampling", str(sampling), "-", *extra], request)
        assert code == 1, (order, code, err)
        assert len(err.splitlines()) == 1 and err.startswith("error: SamplerError: ") and "order" in err, err
        if extra:
            assert json.loads(out)["error"]["type"] == "SamplerError"


# ---------------------------------------------------------------------------------------------------------------
# replay and diff of an imported record whose fields have the wrong type: one line, never a traceback

TAMPERED: list[tuple[tuple[Any, ...], Any]] = [
    (("options", "chat_template_kwargs"), 5),
    (("options", "special_tokens"), True),
    (("options", "sampling"), True),
    (("options", "now"), 5),
    (("dynamic", "now"), 5),
    (("request", "replaced_bytes"), True),
    (("input_ids",), 1.5),
    (("errors",), True),
    (("template",), 5),
    (("tokenizer",), True),
    (("replay", "tokenizer", "unk"), []),
]


def test_replaying_a_tampered_imported_record_is_one_line(tmp_path) -> None:
    """`records import` checks a record's form, not every field; `replay` (and `diff`) of an imported record with
    `"options": {"chat_template_kwargs": 5}`, `"dynamic": {"now": 5}`, `"input_ids": 1.5`, ... escaped as a
    TypeError, ValueError or KeyError traceback (found by mutating a real record's fields at random)."""
    store = str(tmp_path / "store")
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"messages": [{"role": "user", "content": "blue sky"}]}), "utf-8")
    code, out, _ = _main(["render", "-m", "book", "--record", "--store", store, "--json", str(request)])
    rid = json.loads(out)["record_id"]
    record = json.loads(_main(["records", "export", rid, "--store", store])[1].splitlines()[0])
    checked = refused = 0
    for path, value in TAMPERED:
        data = copy.deepcopy(record)
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        line = tmp_path / "tampered.jsonl"
        line.write_text(json.dumps(data) + "\n", "utf-8")
        code, out, err = _main(["records", "import", str(line), "--store", store])
        if code != 0:  # import refused it, in one line: nothing to replay
            assert code == 1 and len(err.splitlines()) == 1 and err.startswith("error: "), (path, err)
            continue
        tampered = out.split()[0]
        for argv in (["replay", tampered], ["diff", tampered, rid], ["diff", rid, tampered]):
            code, out, err = _main([*argv, "--store", store])
            assert code in (0, 1, 3), (path, argv, code, err)
            lines = err.splitlines()
            if lines:  # an error (a diverging layer is a report on stdout, exit 1, no error line)
                assert len(lines) == 1 and lines[0].startswith("error: "), (path, argv, err)
                refused += "error: RecordFormatError: record " in lines[0]
            checked += 1
    assert checked >= 15 and refused >= 5


_PER_CHARACTER = """
import resource, sys
import ctxlock
from ctxlock.template.sandbox._env import RenderLimits
from ctxlock.template._render import ChatTemplate
m = ctxlock.load("book")
tpl = ChatTemplate("{% for c in messages[0].content %}{{ c }}|{% endfor %}", "per-char")
m.render({"messages": [{"role": "user", "content": "a"}]}, chat_template=tpl)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = int(sys.argv[1])
request = {"messages": [{"role": "user", "content": "a" * n}]}
r = m.render(request, chat_template=tpl, limits=RenderLimits(max_seconds=600))
assert len(r.text) == 2 * n
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def test_a_template_printing_its_input_a_character_at_a_time_holds_no_object_per_character() -> None:
    # Render limits grow with the input (issue 16 item 7), so a template that prints a long input one character at a
    # time stays within them; what it may not do is hold one output object per character (about 750 bytes of memory
    # per input character before the render joined its output as it went; about 265 now, most of it the spans).
    import subprocess

    n = 400_000
    out = subprocess.run([sys.executable, "-c", _PER_CHARACTER, str(n)], capture_output=True, text=True, check=True)
    grew = int(out.stdout.strip())
    assert grew < 450 * n, f"the render grew the process by {grew:,} bytes for {n:,} input characters"
