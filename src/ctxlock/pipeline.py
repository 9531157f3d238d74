"""The one seam between a loaded model and the features that use it.

Accounting, assistant masks, budgets, compaction and the prompt-cache report all need "a model they can call":
its id, its tokenizer, its special tokens, and its parse, render, tokenize and encode stages. They take a
`Pipeline`, this typed protocol, instead of importing `ctxlock.model` (which sits above them and imports them),
so no lower package reaches back up. `ctxlock.Model` is the implementation; a test or a tool may pass any object
with these members. The package layers are drawn in docs/architecture.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, Unpack

from ctxlock.request import Request
from ctxlock.template import Rendered, RenderKwargs, RenderOptions
from ctxlock.tensors import ModelInput, TorchInput
from ctxlock.tokenizer import Tokenized, Tokenizer

if TYPE_CHECKING:
    from ctxlock.multimodal import ImageFamily, MultimodalInput, StageOptions

# What the stages accept as a request: a parsed `Request`, or the JSON of one (a mapping, text or bytes).
RequestLike = Request | Mapping[str, Any] | str | bytes


class Pipeline(Protocol):
    """A model as the features see it: request -> template -> tokenizer -> tensors, and its identity."""

    @property
    def id(self) -> str: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def special_tokens(self) -> dict[str, str]: ...

    def parse(self, request: RequestLike, **options: Any) -> Request: ...

    def render(
        self, request: RequestLike, options: RenderOptions | None = None, **kwargs: Unpack[RenderKwargs]
    ) -> Rendered: ...

    def tokenize(self, rendered: Rendered) -> Tokenized: ...

    def encode(
        self, request: RequestLike, options: RenderOptions | None = None, **kwargs: Unpack[RenderKwargs]
    ) -> ModelInput | TorchInput: ...

    def refuse_images(self, request: Request) -> None: ...

    def run_images(
        self,
        request: RequestLike,
        options: RenderOptions | None = None,
        *,
        media: Mapping[str, bytes] | None = None,
        family: ImageFamily | None = None,
        images: StageOptions | None = None,
        decode: bool = True,
        **kwargs: Unpack[RenderKwargs],
    ) -> MultimodalInput: ...
