"""The minijinja worker: a child process that renders one template with minijinja's Python binding, for
`ctxlock.lint._engines` (run by path as `python -I _minijinja_worker.py`; it imports nothing of ctxlock).

It reads one JSON job from stdin, {"source", "contexts", "now", "max_chars", "fuel", "max_bytes"}, and writes a
first line {"engine": minijinja's version}, then one JSON line per context, in order: {"text": ...} or {"error":
..., "line": N | null, "phase": "parse" | "render" | "limit", "construct": the template text minijinja's error
points at | null}. Its address space is capped at `max_bytes` (minijinja allocates in Rust, where no Python limit
reaches: a template that builds a huge string ends the process, which the parent reports), and minijinja's fuel
bounds the instructions of each render.

The environment is the one the peers that run chat templates on minijinja build:
- mistral.rs, mistralrs-core/src/pipeline/chat_template.rs (`apply_chat_template_to`): `set_lstrip_blocks(true)`,
  `set_trim_blocks(true)`, `minijinja_contrib::pycompat::unknown_method_callback` (Python's str and dict methods),
  `raise_exception` and `strftime_now` functions, and the `{% generation %}` / `{% endgeneration %}` tags removed
  from the source;
- text-generation-inference, router/src/infer/chat_template.rs (`ChatTemplate::new`): the same callback, functions
  and tag removal, minijinja's `loop_controls` feature, and minijinja's own `tojson` filter.
Where they differ, this follows: trim_blocks and lstrip_blocks on (mistral.rs; TGI leaves both off), minijinja's
own `tojson` (TGI; mistral.rs replaces it with one that prints Python's separators and no HTML escapes), and none
of the other source rewrites either peer makes for particular templates. The binding's `pycompat=True` is the
contrib callback.
"""

from __future__ import annotations

import json
import re
import resource
import sys
from datetime import datetime
from typing import Any

# mistral.rs's pattern for the generation tags (TGI replaces the two plain spellings, which it covers).
_GENERATION_TAG = re.compile(r"\{%-?\s*(?:end)?generation\s*-?%\}")
_WHERE = re.compile(r" \(in [^)]*:\d+\)$")
_MAX_MESSAGE = 2000


def _out(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value) + "\n")  # ASCII: a lone surrogate of the text is escaped, not an error
    sys.stdout.flush()


def _bound(text: str) -> str:
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 1] + "…"


def _failure(exc: Any, source: bytes, phase: str) -> dict[str, Any]:
    """An answer for minijinja's TemplateError `exc`: its message (without the template name), line, and the text of
    the construct its byte range points at."""
    span = exc.range
    construct = None
    if isinstance(span, tuple) and len(span) == 2:
        construct = source[span[0] : span[1]].decode("utf-8", "replace")[:500] or None
    return {"error": _bound(_WHERE.sub("", str(exc.message))), "line": exc.line, "phase": phase, "construct": construct}


def main() -> int:
    job = json.loads(sys.stdin.read())
    limit = int(job["max_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from importlib.metadata import version

    import minijinja

    _out({"engine": version("minijinja")})
    wall = datetime.fromisoformat(job["now"]).replace(tzinfo=None)

    def strftime_now(fmt: str) -> str:
        return wall.strftime(str(fmt))

    raised: list[str] = []  # what the template's last raise_exception said (the binding drops the error's line)

    def raise_exception(message: Any) -> None:
        raised[:] = [str(message)]
        raise minijinja.TemplateError(str(message))

    env = minijinja.Environment(
        trim_blocks=True,
        lstrip_blocks=True,
        pycompat=True,
        fuel=int(job["fuel"]),
        globals={"raise_exception": raise_exception, "strftime_now": strftime_now},
    )
    source = _GENERATION_TAG.sub("", job["source"])
    encoded = source.encode("utf-8", "surrogatepass")
    try:
        env.add_template("chat_template", source)
    except minijinja.TemplateError as exc:
        failed = _failure(exc, encoded, "parse")
        for _ in job["contexts"]:
            _out(failed)
        return 0
    max_chars = int(job["max_chars"])
    for context in job["contexts"]:
        raised.clear()
        try:
            text = env.render_template("chat_template", **context)
        except minijinja.TemplateError as exc:
            if raised:
                _out(_failure(exc, encoded, "render") | {"error": _bound(f"raise_exception: {raised[0]}")})
                continue
            _out(_failure(exc, encoded, "limit" if exc.kind == "OutOfFuel" else "render"))
            continue
        except MemoryError:
            _out({"error": "out of memory", "line": None, "phase": "limit", "construct": None})
            continue
        except Exception as exc:  # a function of the environment raised (strftime_now with a bad format, ...)
            _out({"error": _bound(f"{type(exc).__name__}: {exc}"), "line": None, "phase": "render", "construct": None})
            continue
        except BaseException as exc:  # pyo3's PanicException, no Exception: minijinja panicked (a failed allocation)
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise
            why = _bound(f"minijinja panicked ({exc}): out of memory, or its own bug")
            _out({"error": why, "line": None, "phase": "limit", "construct": None})
            continue
        if len(text) > max_chars:
            text = ""  # let go of it before the next render, which has the same address space
            _out({"error": f"output over {max_chars} characters", "line": None, "phase": "limit", "construct": None})
        else:
            _out({"text": text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
