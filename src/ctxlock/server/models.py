"""The models a server offers, loaded once at start-up from the config: each with its template (the model's own or
the configured file), its named templates, its budget policy and its render limits (the deadline)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ctxlock.artifacts import load_template_file
from ctxlock.errors import RequestValidationError, RouteNotFoundError
from ctxlock.model._model import Model, load
from ctxlock.request import json_type_name
from ctxlock.server.config import Limits, ModelConfig, ServeConfig
from ctxlock.template._options import RenderOptions
from ctxlock.template._render import ChatTemplate
from ctxlock.template.sandbox._limits import RenderLimits
from ctxlock.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServedModel:
    name: str
    model: Model
    template: ChatTemplate | None  # the configured file, or None: the model's own
    named: Mapping[str, ChatTemplate]
    max_model_len: int | None
    budget: Mapping[str, Any] | None
    limits: RenderLimits
    # The ids the tokenizer's own `add_special_tokens` puts before and after a text (its BOS, its EOS).
    special_affixes: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

    def option_kwargs(self) -> dict[str, Any]:
        """The render options every request on this model gets: the configured template and the limits."""
        out: dict[str, Any] = {"limits": self.limits}
        if self.template is not None:
            out["chat_template"] = self.template
        return out

    def options(
        self,
        *,
        add_generation_prompt: bool | None = True,
        continue_final_message: bool = False,
        kwargs: dict[str, Any] | None = None,
        template_name: str | None = None,
    ) -> RenderOptions:
        template: Any = self.template
        if template_name is not None:
            template = self.named[template_name]
        return RenderOptions(
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=kwargs or None,
            chat_template=template,
            limits=self.limits,
        )

    def named_template(self, value: Any, *, allow_named: bool, where: str) -> str | None:
        """A request's `chat_template`: refused, unless the config allows named templates and it is one of them."""
        if value is None:
            return None
        if not allow_named:
            raise RequestValidationError(
                "a request may not choose the chat template",
                path="$.chat_template",
                hint=f"{where} uses the configured template; set server.allow_named_templates to let requests name "
                "one of a model's configured templates (never send a template body)",
            )
        if not isinstance(value, str) or value not in self.named:
            names = ", ".join(sorted(self.named)) or "none configured"
            raise RequestValidationError(
                "chat_template is not one of this model's configured template names",
                path="$.chat_template",
                hint=f"names: {names} (a template body or a path is never accepted)",
            )
        return value


def render_limits(limits: Limits) -> RenderLimits:
    # The deadline is the render's wall-time bound, not scaled by the input (the body limit already bounds it).
    return RenderLimits(
        max_seconds=limits.render_deadline_seconds,
        max_output_chars=limits.max_render_chars,
        seconds_per_input_mchar=0.0,
    )


def special_affixes(tokenizer: Tokenizer) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What `add_special_tokens=True` adds around a text: the post-processor's (or the backend's) ids before and
    after the text's own ids, read off one probe text."""
    plain = tokenizer.encode("a")
    full = tokenizer.encode("a", add_special_tokens=True)
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return tuple(full[:k]), tuple(full[k + len(plain) :])
    return (), ()


def load_served(mc: ModelConfig, limits: Limits) -> ServedModel:
    model = load(mc.spec)
    model.warm_up(wait=True)
    # Plain-text encode and decode build their own engines on first use (seconds for a large vocabulary): built
    # here, at start-up, so that no request pays for them against its deadline.
    model.tokenizer.decode(model.tokenizer.encode("warm up", add_special_tokens=True))
    model.tokenizer.token_bytes()
    template = load_template_file(mc.template) if mc.template is not None else None
    named = {name: load_template_file(path, id=name) for name, path in mc.templates}
    return ServedModel(
        name=mc.name,
        model=model,
        template=template,
        named=named,
        max_model_len=mc.max_model_len,
        budget=dict(mc.budget) if mc.budget is not None else None,
        limits=render_limits(limits),
        special_affixes=special_affixes(model.tokenizer),
    )


class Models:
    """The served models by configured name; the first is the default (a request without `model`). With
    `server.fallback_model` set, a peer route's body naming a model not served here gets that model (llama.cpp
    ignores the name); the answer says so in its `X-Ctxlock-Model-Fallback` header."""

    def __init__(self, config: ServeConfig) -> None:
        self.by_name = {mc.name: load_served(mc, config.limits) for mc in config.models}
        self.default = config.default_model
        self.fallback = config.fallback_model

    def get(self, name: Any) -> ServedModel:
        if name is None:
            return self.by_name[self.default]
        if not isinstance(name, str):
            raise RequestValidationError(
                f"model must be a string, not {json_type_name(name)}",
                path="$.model",
                hint=f"name a served model: {', '.join(self.by_name)} (GET /v1/models)",
            )
        if name not in self.by_name:
            raise RouteNotFoundError(
                "no model by that name is served here",
                path="$.model",
                hint=f"served models: {', '.join(self.by_name)} (GET /v1/models); a path or spec is never taken; "
                "server.fallback_model answers other names with one of them",
            )
        return self.by_name[name]

    def resolve(self, name: Any) -> tuple[ServedModel, bool]:
        """A peer route's `model`: the served model and whether the fallback stood in for an unknown name (a name
        that is not a string is refused all the same)."""
        if self.fallback is not None and isinstance(name, str) and name not in self.by_name:
            return self.by_name[self.fallback], True
        return self.get(name), False
