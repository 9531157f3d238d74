"""`ctxlock.template.RenderOptions`: one frozen, hashable value for what the caller chose, built the same from the
Python API's keyword arguments, from a record's `RunOptions` and from the CLI's flags; records keep their bytes."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone

import pytest

import ctxlock
from ctxlock.cli.render import render_options
from ctxlock.errors import OptionError
from ctxlock.records import RunOptions
from ctxlock.request import Dialect, ToolArguments, Utf8Policy
from ctxlock.template._options import RENDER_OPTIONS, ContentFormat, InjectionPolicy, RenderOptions
from ctxlock.template._render import DEFAULT_LIMITS, ChatTemplate, RenderLimits, render

JST = timezone(timedelta(hours=9))
REQUEST = {"messages": [{"role": "system", "content": "简洁回答"}, {"role": "user", "content": "天空为什么是蓝色？"}]}


@pytest.fixture(scope="module")
def book() -> ctxlock.Model:
    return ctxlock.load("book")


def _kwargs_form() -> RenderOptions:
    return RenderOptions.from_kwargs(
        {
            "add_generation_prompt": True,
            "chat_template_kwargs": {"enable_thinking": False, "mode": "x"},
            "injection": "keep",
            "now": datetime(2026, 1, 2, 3, 4, 5, tzinfo=JST),
            "seed": 7,
            "dialect": "openai",
            "utf8": "replace",
            "tool_arguments": "as-sent",
            "content_format": "string",
            "limits": RenderLimits(max_seconds=2.0, max_output_chars=1000),
        }
    )


def _run_options() -> RunOptions:
    """The RunOptions `ctxlock render --record` built before RenderOptions existed, for the flags in `_cli_form`."""
    return RunOptions(
        add_generation_prompt=True,
        continue_final_message=False,
        chat_template_kwargs={"enable_thinking": False, "mode": "x"},
        special_tokens="keep",
        now="2026-01-02T03:04:05+09:00",
        dialect="openai",
        utf8="replace",
        tool_arguments="as-sent",
        content_format="string",
        sampling=None,
        render_seed=7,
        limits={**DEFAULT_LIMITS.to_dict(), "max_seconds": 2.0, "max_output_chars": 1000},
    )


def _cli_form() -> RenderOptions:
    options, sampler = render_options(
        None,
        var=["enable_thinking=false", 'mode="x"'],
        injection=InjectionPolicy.KEEP,
        now="2026-01-02T03:04:05+09:00",
        render_seed="7",
        dialect="openai",
        utf8="replace",
        tool_arguments=ToolArguments.AS_SENT,
        content_format=ContentFormat.STRING,
        template_timeout=2.0,
        max_render_chars=1000,
    )
    assert sampler is None
    return options


def test_the_value_is_frozen_and_hashable() -> None:
    options = _kwargs_form()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.injection = InjectionPolicy.TEXT  # type: ignore[misc]
    assert hash(options) == hash(_kwargs_form())
    assert {options, _kwargs_form()} == {options}
    assert RenderOptions() == RenderOptions.from_kwargs({}) and hash(RenderOptions()) == hash(RenderOptions())


def test_caller_values_are_frozen_copies() -> None:
    variables = {"mode": ["a"]}
    tools = [{"type": "function", "function": {"name": "f"}}]
    options = RenderOptions(chat_template_kwargs=variables, tools=tools)
    variables["mode"].append("b")
    tools[0]["function"]["name"] = "g"
    assert options.template_variables() == {"mode": ["a"]}
    assert options.to_kwargs()["tools"] == [{"type": "function", "function": {"name": "f"}}]
    hash(options)


def test_the_fields_are_typed() -> None:
    options = _kwargs_form()
    assert options.injection is InjectionPolicy.KEEP
    assert options.content_format is ContentFormat.STRING
    assert options.utf8 is Utf8Policy.REPLACE
    assert options.tool_arguments is ToolArguments.AS_SENT
    assert options.dialect is Dialect.OPENAI
    # A value naming no member is kept as given: the stage that reads it refuses it with its own error.
    assert RenderOptions(injection="sometimes").injection == "sometimes"


def test_kwargs_run_options_and_cli_give_one_value() -> None:
    from_kwargs, from_cli = _kwargs_form(), _cli_form()
    from_record = RenderOptions.from_record(_run_options().to_dict())
    assert from_kwargs == from_record == from_cli
    assert hash(from_kwargs) == hash(from_record) == hash(from_cli)


def test_the_cli_records_what_it_always_recorded() -> None:
    recorded = RunOptions(**_cli_form().to_record(), sampling=None)
    assert recorded.to_dict() == _run_options().to_dict()
    assert list(recorded.to_dict()) == list(_run_options().to_dict())  # key order: the record's bytes
    plain, _ = render_options(None)
    assert RunOptions(**plain.to_record()).to_dict() == RunOptions(add_generation_prompt=True).to_dict()


def test_record_and_kwargs_forms_round_trip() -> None:
    options = _kwargs_form()
    assert RenderOptions.from_record(options.to_record()) == options
    assert RenderOptions.from_kwargs(options.to_kwargs()) == options
    assert RenderOptions().to_kwargs() == {}
    assert "dialect" not in options.to_kwargs(parse=False)


def test_generation_prompt_defaults_to_not_continuing() -> None:
    assert RenderOptions().generation_prompt is True
    assert RenderOptions(continue_final_message=True).generation_prompt is False
    assert RenderOptions(add_generation_prompt=False).generation_prompt is False


def test_unknown_keywords_are_refused_and_old_names_point_to_the_one_name() -> None:
    with pytest.raises(OptionError) as info:
        RenderOptions.from_kwargs({"add_generation_promt": True}, method="render")
    assert "did you mean 'add_generation_prompt'?" in info.value.hint
    # One name per option, transformers' where it has one: the old names are refused, naming the new one.
    for old, new in [
        ("special_tokens", "injection="),
        ("template", "chat_template="),
        ("return_assistant_mask", "return_assistant_tokens_mask="),
    ]:
        with pytest.raises(OptionError) as info:
            RenderOptions.from_kwargs({old: "raise"}, method="render")
        assert info.value.path == old and new in info.value.hint, (old, info.value.hint)
    assert "injection" in RENDER_OPTIONS and "chat_template" in RENDER_OPTIONS
    assert "special_tokens" not in RENDER_OPTIONS and "template" not in RENDER_OPTIONS


def test_model_methods_take_the_value_or_its_keywords(book: ctxlock.Model) -> None:
    options = RenderOptions(now=datetime(2026, 1, 2, tzinfo=JST), seed=3, injection="keep")
    by_value = book.run(REQUEST, options)
    by_keywords = book.run(REQUEST, **options.to_kwargs())
    assert by_value.rendered == by_keywords.rendered
    assert list(by_value.tokenized.ids) == list(by_keywords.tokenized.ids)
    assert (
        book.encode(REQUEST, options).input_ids.tolist()
        == book.encode(REQUEST, **options.to_kwargs()).input_ids.tolist()
    )
    # Keywords given with a value apply over it.
    assert (
        book.render(REQUEST, options, add_generation_prompt=False).text
        == book.render(REQUEST, options.replace(add_generation_prompt=False)).text
    )
    with pytest.raises(TypeError, match="RenderOptions"):
        book.render(REQUEST, {"seed": 3})  # type: ignore[arg-type]
    assert book.render(REQUEST, now=options.now, seed=3, injection="keep") == by_value.rendered


def test_template_render_takes_the_value_or_its_keyword_form() -> None:
    request = ctxlock.parse_request(REQUEST)
    template = ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}{{ mode }}", id="t")
    now = datetime(2026, 1, 2, tzinfo=JST)
    by_value = render(request, template, RenderOptions(now=now, chat_template_kwargs={"mode": "!"}, injection="raise"))
    by_keywords = render(request, template, now=now, chat_template_kwargs={"mode": "!"}, policy="raise")
    assert by_value == by_keywords and by_value.text.endswith("!")
    with pytest.raises(TypeError):
        render(request, template, nonsense=True)
