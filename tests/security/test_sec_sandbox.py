"""The sandbox gives no silent answers (issue 14, item 6): an unsafe attribute raises when it is used.

jinja's sandbox turns an unsafe attribute into an Undefined that prints as "", so `'{0.__class__}'.format(1)`
rendered an empty string where the README promises TemplateSecurityError. Every way of reaching an unsafe
attribute (attribute syntax, subscription, `|attr`, `str.format` fields, `format_map`) is tried on every unsafe name
class, and every way of using the result (print, format, iterate, test, measure).
"""

from __future__ import annotations

import itertools

import pytest

from ctxlock.errors import TemplateSecurityError
from ctxlock.request import parse_request
from ctxlock.template._render import ChatTemplate, render

REQUEST = parse_request({"messages": [{"role": "user", "content": "hi"}]})

UNSAFE = ["__class__", "__globals__", "__init__", "__subclasses__", "__mro__", "_private", "__dict__"]
REACH = [
    "''.{a}",
    "''['{a}']",
    "(''|attr('{a}'))",
    "messages[0].content.{a}",
    "(messages[0].content|attr('{a}'))",
    "messages.{a}",
    "namespace().{a}",
]
USE = ["{{{{ {x} }}}}", "{{{{ '%s'|format({x}) }}}}", "{{% for c in {x} %}}{{% endfor %}}", "{{{{ {x}|length }}}}"]


@pytest.mark.parametrize(("attribute", "reach", "use"), list(itertools.product(UNSAFE, REACH, USE)))
def test_using_an_unsafe_attribute_raises(attribute: str, reach: str, use: str) -> None:
    source = use.format(x=reach.format(a=attribute))
    with pytest.raises(TemplateSecurityError):
        render(REQUEST, ChatTemplate(source, id="probe"))


@pytest.mark.parametrize(
    "source",
    [
        "{{ ('{0.__class__}'|attr('format'))(1) }}",
        "{{ '{0.__class__}'.format(1) }}",
        "{{ '{0.__class__.__mro__}'.format(messages) }}",
        "{{ '{x.__class__}'.format_map({'x': 1}) }}",
        "{{ messages[1].content.format(1) }}",
        "{{ '{0.__init__.__globals__}'.format(raise_exception) }}",
    ],
)
def test_format_fields_that_reach_unsafe_attributes_raise(source: str) -> None:
    # The last message's text is itself a format string that probes: a request may not reach attributes either.
    request = parse_request(
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{0.__class__}"}]}
    )
    with pytest.raises(TemplateSecurityError):
        render(request, ChatTemplate(source, id="probe"))


def test_testing_for_an_unsafe_attribute_is_still_allowed() -> None:
    # `is defined` asks without using the value: templates that probe (as transformers allows) keep working.
    r = render(REQUEST, ChatTemplate("{{ ''.__class__ is defined }}|{{ messages.append is defined }}", id="probe"))
    assert r.text == "False|False"


def test_request_strings_expose_only_str_attributes() -> None:
    # The provenance a request string carries is not visible to templates.
    r = render(REQUEST, ChatTemplate("{{ messages[0].content.spans is defined }}", id="probe"))
    assert r.text == "False"
