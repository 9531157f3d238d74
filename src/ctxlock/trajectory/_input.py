"""One line of `ctxlock trajectory`'s input (docs/trajectories.md, "The input"): a chat request (its `messages` are the
prompt; `tools`, `chat_template_kwargs`, ... as in any request) and `steps`, a list in which completions and new
messages alternate, starting with a completion:

    {"messages": [...], "tools": [...],
     "steps": [{"completion_ids": [...], "logprobs": [...], "finish_reason": "tool_calls"},
               {"messages": [{"role": "tool", "tool_call_id": "...", "content": "..."}]},
               {"completion_ids": [...]}]}

Read through the strict JSON reader; every error is a `TrajectoryError` naming the line and the JSON path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ctxlock.errors import CtxlockError, TrajectoryError
from ctxlock.outside import loads_outside
from ctxlock.trajectory._build import MAX_STEPS, Trajectory, TrajectoryResult

if TYPE_CHECKING:
    from ctxlock.model import Model

_COMPLETION_KEYS = frozenset({"completion_ids", "logprobs", "finish_reason"})


def read_line(raw: bytes | str, where: str) -> dict[str, Any]:
    """The line as JSON, its shape checked (the ids against the vocabulary later, in `build_line`)."""
    value = loads_outside(raw, f"{where} $", error=TrajectoryError)
    if not isinstance(value, dict):
        raise TrajectoryError("a trajectory line is a JSON object", path=f"{where} $", hint="see docs/trajectories.md")
    steps = value.get("steps")
    if not isinstance(steps, list) or not steps:
        raise TrajectoryError("expected `steps`: a non-empty list", path=f"{where} $.steps")
    if len(steps) > MAX_STEPS:
        raise TrajectoryError(f"{len(steps)} steps, over the limit of {MAX_STEPS}", path=f"{where} $.steps")
    for k, step in enumerate(steps):
        path = f"{where} $.steps[{k}]"
        want = "completion" if k % 2 == 0 else "messages"
        if not isinstance(step, dict):
            raise TrajectoryError("a step is a JSON object", path=path)
        if want == "completion":
            extra = sorted(set(step) - _COMPLETION_KEYS)
            if "completion_ids" not in step or extra:
                raise TrajectoryError(
                    f"step {k} must be a completion ({{'completion_ids': [...]}})"
                    + (f"; unknown keys {extra}" if extra else ""),
                    path=path,
                    hint="steps alternate: a completion, then the messages that follow it",
                )
            reason = step.get("finish_reason", "stop")
            if reason is not None and not isinstance(reason, str):
                raise TrajectoryError("finish_reason is a string or null", path=f"{path}.finish_reason")
        elif set(step) != {"messages"}:
            raise TrajectoryError(
                f"step {k} must be new messages ({{'messages': [...]}})",
                path=path,
                hint="steps alternate: a completion, then the messages that follow it",
            )
    return value


def build_line(model: Model, value: dict[str, Any], where: str, **render_options: Any) -> TrajectoryResult:
    """The trajectory of one read line; an error names the line and the step's JSON path."""
    request = {k: v for k, v in value.items() if k != "steps"}
    try:
        traj = Trajectory(model, request, render_options)
        for step in value["steps"]:
            if "completion_ids" in step:
                traj.complete(step["completion_ids"], step.get("logprobs"), step.get("finish_reason", "stop"))
            else:
                traj.add(step["messages"])
        return traj.result()
    except TrajectoryError as exc:
        raise TrajectoryError(exc.message, path=f"{where} $.{exc.path}" if exc.path else where, hint=exc.hint) from None
    except CtxlockError as exc:
        if exc.path and not exc.path.startswith(where):
            exc.path = f"{where} {exc.path}"
        raise
