"""The attribute names ctxlock writes and reads, pinned to one version of the OpenTelemetry semantic conventions.

The GenAI names are those of semantic conventions 1.44.0 as the `opentelemetry-semantic-conventions` package 0.66b2
ships them (`opentelemetry.semconv._incubating.attributes.gen_ai_attributes`; tests/telemetry checks every name
here against that module). The span shape: https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/
(span name `{gen_ai.operation.name} {gen_ai.request.model}`, kind CLIENT); the message content attributes:
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-input-messages.json (role and typed parts)."""

from __future__ import annotations

SEMCONV_VERSION = "1.44.0"
SEMCONV_PACKAGE = "opentelemetry-semantic-conventions 0.66b2"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_VERSION}"
SCOPE = "ctxlock"

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
# Opt-in content (the conventions: "SHOULD NOT be captured by default"): ctxlock writes them only with --content.
INPUT_MESSAGES = "gen_ai.input.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
CHAT = "chat"

GEN_AI_NAMES = (
    OPERATION_NAME,
    PROVIDER_NAME,
    REQUEST_MODEL,
    INPUT_TOKENS,
    OUTPUT_TOKENS,
    CACHE_READ,
    CACHE_CREATION,
    INPUT_MESSAGES,
    SYSTEM_INSTRUCTIONS,
    TOOL_DEFINITIONS,
)

# ctxlock's own attributes (no content unless marked).
SEMCONV_ATTR = "ctxlock.semconv.version"  # on the resource and on every span
RECORD_ID = "ctxlock.record.id"
TEMPLATE_ID = "ctxlock.template.id"
TEMPLATE_SHA256 = "ctxlock.template.sha256"
TOKENIZER_ID = "ctxlock.tokenizer.id"
TOKENIZER_SHA256 = "ctxlock.tokenizer.sha256"
IDS_SHA256 = "ctxlock.ids.sha256"
REQUEST_SHA256 = "ctxlock.request.sha256"
COUNT_PARTS = "ctxlock.count.parts"  # string[]: each part's JSON path (system, messages[1], tools[0], template, ...)
COUNT_TOKENS = "ctxlock.count.tokens"  # int[]: its tokens, in the same order
COUNT_NOTE = "ctxlock.count.note"
NEUTRALIZED_COUNT = "ctxlock.neutralized.count"
NEUTRALIZED_TOKENS = "ctxlock.neutralized.tokens"  # string[]: the vocabulary's control strings met in request text
USAGE_SOURCE = "ctxlock.usage.source"  # "ctxlock": the gen_ai.usage figures are ctxlock's, not a provider's report
CACHE_PROVIDER = "ctxlock.cache.provider"
CACHE_BUSTER_KIND = "ctxlock.cache.buster.kind"
CACHE_BUSTER = "ctxlock.cache.buster"
REQUEST = "ctxlock.request"  # content: the request's exact JSON as sent
RECORD = "ctxlock.record"  # content: the canonical record
