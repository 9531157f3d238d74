"""Role markers: what a template writes between turns, found by rendering a probe conversation of sentinel words
(`template.role_markers` renders it and caches the verdict). A template whose markers are plain text lets a user
forge a turn, whatever the special-token policy."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ctxlock.template._values import ChatTemplate

ROLE_PROBES: tuple[tuple[tuple[str, str], ...], ...] = (
    (
        ("system", "QZXPROBEALPHA"),
        ("user", "QZXPROBEBRAVO"),
        ("assistant", "QZXPROBECHARLIE"),
        ("user", "QZXPROBEDELTA"),
    ),
    (("user", "QZXPROBEBRAVO"), ("assistant", "QZXPROBECHARLIE"), ("user", "QZXPROBEDELTA")),
)


@dataclass(frozen=True)
class RoleMarkers:
    """What a probe render found between turns. `plain` lists each turn boundary whose text holds no control token
    of the vocabulary, as (boundary, text the template wrote there, template line or None). `checked` is False
    when the template renders no probe conversation (it raised on both), with the reason."""

    checked: bool
    plain: tuple[tuple[str, str, int | None], ...] = ()
    reason: str = ""

    @property
    def forgeable(self) -> bool:
        return bool(self.plain)

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "plain_text": [{"boundary": b, "text": t, "line": line} for b, t, line in self.plain],
            "reason": self.reason,
        }

    def warning(self, template: ChatTemplate) -> dict[str, Any] | None:
        if not self.plain:
            return None
        # Named first: the boundary a user forges to write the assistant's reply, then the others.
        order = ("user→assistant", "user→generation prompt", "assistant→user")
        boundary, text, line = min(self.plain, key=lambda p: order.index(p[0]) if p[0] in order else len(order))
        others = f" (and {len(self.plain) - 1} more boundary)" if len(self.plain) > 1 else ""
        return {
            "kind": "plain_text_role_markers",
            "message": f"the template's role markers are plain text, not control tokens: at the {boundary} boundary "
            f"it writes {text!r}{others}, which any message can contain, so a user can forge a turn and no "
            "special-token policy can stop it",
            "path": f"{template.id} line {line}" if line else template.id,
        }


def role_boundaries(text: str, probe: tuple[tuple[str, str], ...]) -> Iterator[tuple[str, str]]:
    """(boundary name, text between two turns) for a probe render: from the end of each sentinel to the next
    one, and from the last one to the end (the generation prompt). Turns the template dropped are skipped, and a
    system turn folded into the first user turn (Mistral's templates join them with a blank line, no marker) is
    not a boundary: it has no role marker to forge."""
    found = sorted((text.find(content), len(content), role) for role, content in probe if content in text)
    for k, (start, size, role) in enumerate(found):
        end = start + size
        if k + 1 < len(found):
            between, name = text[end : found[k + 1][0]], f"{role}→{found[k + 1][2]}"
        else:
            between, name = text[end:], f"{role}→generation prompt"
        if role == "system" and not re.search(r"\w", between):
            continue
        yield name, between


def line_of(marker: str, source: str) -> int | None:
    """The template line that writes a marker: the first line holding its stripped text, else its longest word,
    else its longest run of punctuation (`:` of `{{ role }}: `, where the role name comes from a variable)."""
    candidates = [
        marker.strip(),
        *sorted(re.findall(r"[^\W\d_]{2,}", marker), key=len, reverse=True),
        *sorted(re.findall(r"[^\w\s]+", marker), key=len, reverse=True),
    ]
    for c in candidates:
        if c and (at := source.find(c)) >= 0:
            return source.count("\n", 0, at) + 1
    return None


__all__ = ["ROLE_PROBES", "RoleMarkers", "line_of", "role_boundaries"]
