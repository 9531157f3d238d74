"""schemathesis against the real server's own OpenAPI document (`GET /openapi.json`): for every operation, bounded
generated requests (those that fit the schema, and those that do not) over real HTTP, with schemathesis' checks: no
5xx, every status documented, the content type and the body as documented, Retry-After where documented."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode

# Imported here, at collection, not lazily mid-test: pytest rewrites schemathesis' modules (a plugin) with ast.parse,
# and on CPython 3.11 a parse racing another thread's fails (https://github.com/python/cpython/issues/106905).
from schemathesis.specs.openapi import converter as _converter  # noqa: F401
from schemathesis.specs.openapi.adapter import parameters as _parameters  # noqa: F401
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from serve_server import TOKEN, client, running

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
INPUTS = {"requestBody", "parameters"}
# Bounded: a few examples per operation and mode keep the whole file under a minute on a quiet machine.
EXAMPLES = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    root = tmp_path_factory.mktemp("schema")
    cfg = root / "ctxlock.toml"
    cfg.write_text(
        f'[server]\nstore = "{root / "store"}"\ntokens = ["{TOKEN}"]\n\n'
        "[limits]\nmax_body_bytes = 65536\nrender_deadline_seconds = 2.0\nqueue_depth = 64\n\n"
        '[models.nemo]\nspec = "mistral-nemo"\nmax_model_len = 131072\nbudget = { max_input_tokens = 64 }\n',
        "utf-8",
    )
    with running(cfg) as url, client(url) as c:
        rid = c.post("/v1/render?record=1", json={"messages": [{"role": "user", "content": "hi"}]}).json()["record_id"]
        yield url, rid


def test_the_openapi_document_names_every_route(served: tuple[str, str]) -> None:
    url, _ = served
    with client(url) as c:
        doc = c.get("/openapi.json").json()
        assert client(url, token=None).get("/openapi.json").status_code == 401  # protected like every route
    assert doc["openapi"] == "3.1.0"
    assert set(doc["paths"]) >= {
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/v1/chat/completions/render",
        "/v1/completions/render",
        "/v1/messages/count_tokens",
        "/v1/responses/input_tokens",
        "/v1/render",
        "/v1/count",
        "/v1/fit",
        "/v1/cache-report",
        "/v1/records",
        "/v1/records/{id}",
        "/v1/records/{id}/replay",
        "/v1/diff",
        "/v1/parse",
        "/v1/models",
        "/records/{id}/view",
        "/diff/{a}/{b}/view",
        "/healthz",
        "/metrics",
    }
    for path, methods in doc["paths"].items():
        for method, op in methods.items():
            if method == "post" and path != "/v1/records/{id}/replay":
                assert "requestBody" in op, path
            errors = {"200", "400", "401", "404", "413", "429", "503"}
            if path.endswith("/render") and path != "/v1/render":  # vLLM's: its error shape, and 400 for 422
                assert "422" not in op["responses"], path
                assert op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("VllmError")
            else:
                errors.add("422")
            assert errors <= set(op["responses"]), path


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_5xx_and_no_schema_violation(
    served: tuple[str, str], mode: GenerationMode, tmp_path: Path
) -> None:
    url, rid = served
    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers=AUTH)
    with client(url) as c:
        doc = c.get("/openapi.json").json()
    operations = [r.ok() for r in schema.get_all_operations()]
    assert len(operations) >= 20
    if mode is GenerationMode.NEGATIVE:  # only an operation that takes input has a negative case
        takes = {(m.upper(), p) for p, ms in doc["paths"].items() for m, op in ms.items() if set(op) & INPUTS}
        operations = [op for op in operations if (op.method.upper(), op.path) in takes]
    seen: dict[str, set[int]] = {}
    for operation in operations:
        # The record routes get the id of a real record (generated hex ids only ever find nothing: 404).
        ids = {k: rid for k in ("id", "a", "b") if "{" + k + "}" in operation.path}

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(mode, path_parameters=ids or None))
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(headers=AUTH, checks=CHECKS, timeout=30)
            seen.setdefault(case.operation.label, set()).add(response.status_code)

        run()
    # Every operation answered, and every answer was a documented status below 500.
    assert len(seen) == len(operations)
    assert all(code < 500 or code == 503 for codes in seen.values() for code in codes), seen
    if mode is GenerationMode.POSITIVE:
        assert any(200 in codes for codes in seen.values())
