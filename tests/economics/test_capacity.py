"""`ctxlock.economics` and `model.capacity`: a model's window read from its real files (every fetched GGUF, a real
converted HF directory with the config.json shapes real models ship), checked against the references (the `gguf`
package's reader, transformers' AutoConfig and AutoTokenizer); the precedence, every conflict said, transformers'
"no limit" sentinel ignored; hostile values never crash a load nor become a window. Then `fit` without flags, and
`ctxlock clamp`."""

from __future__ import annotations

import json
import math
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import gguf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctxlock
import fetched
from cli_runner import in_process_cli, invoke
from ctxlock.artifacts._gguf import read_metadata
from ctxlock.cli import budget as budget_cmds
from ctxlock.cli import clamp as clamp_cmds
from ctxlock.economics._capacity import LARGE_INTEGER, Capacity, from_files, override, with_price
from ctxlock.economics._usage import PriceTable
from hypothesis_profiles import examples

PRICES = Path(__file__).parents[1] / "data" / "usage" / "prices.json"


def _reference_context_length(path: Path) -> tuple[str, int]:
    reader = gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    return arch, int(reader.fields[f"{arch}.context_length"].contents())


# The `gguf` package's reader parses every token in Python (tens of seconds for a large vocabulary): it is the
# reference on the three smallest files; on every file, the header as ctxlock's own reader parses it.
GGUF_REFERENCE = ("bert-bge", "llama-spm", "phi-3")


@pytest.mark.parametrize("name", fetched.gguf_names())
def test_every_fetched_gguf_states_its_window(name: str) -> None:
    path = fetched.gguf_path(name)
    if name in GGUF_REFERENCE:
        arch, expected = _reference_context_length(path)
    else:
        meta = read_metadata(path)
        arch = meta.get("general.architecture")
        expected = meta.get(f"{arch}.context_length")
    cap = ctxlock.load(str(path)).capacity
    assert cap.context_window == expected
    assert cap.source == f"{path.name} {arch}.context_length"
    assert cap.max_output_tokens is None and cap.output_source == "unknown"
    assert cap.notes == ()


def _hf_dir(tmp_path: Path, config: Any = None, tokenizer_config: dict | None = None, **files: Any) -> Path:
    """The real Qwen2 tokenizer directory (converted and saved by transformers), with these files written in."""
    d = tmp_path / "model"
    shutil.copytree(fetched.hf_tokenizer_dir("qwen2"), d)
    if config is not None:
        (d / "config.json").write_text(json.dumps(config))
    if tokenizer_config is not None:
        tc = json.loads((d / "tokenizer_config.json").read_text())
        (d / "tokenizer_config.json").write_text(json.dumps({**tc, **tokenizer_config}))
    for name, value in files.items():
        (d / f"{name}.json").write_text(json.dumps(value))
    return d


def _auto_config(d: Path) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(d))


@pytest.mark.reference
def test_the_sentinel_is_no_window(tmp_path: Path) -> None:
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_base import VERY_LARGE_INTEGER

    d = _hf_dir(tmp_path)
    assert AutoTokenizer.from_pretrained(str(d)).model_max_length == VERY_LARGE_INTEGER  # what the file states
    cap = ctxlock.load(str(d)).capacity
    assert cap.context_window is None and cap.source == "unknown"
    assert cap.notes == ("tokenizer_config.json model_max_length 1e+30 is transformers' 'no limit' sentinel: ignored",)
    assert VERY_LARGE_INTEGER >= LARGE_INTEGER


@pytest.mark.reference
def test_config_json_against_tokenizer_config(tmp_path: Path) -> None:
    """Qwen2.5's shape: config.json 32,768 positions (and a sliding_window, which is no window), the tokenizer's
    model_max_length 131,072. The model's positions win, and the conflict is said."""
    from transformers import AutoTokenizer

    config = {"model_type": "qwen2", "max_position_embeddings": 32768, "sliding_window": 131072}
    d = _hf_dir(tmp_path, config, {"model_max_length": 131072})
    assert _auto_config(d).max_position_embeddings == 32768
    assert AutoTokenizer.from_pretrained(str(d)).model_max_length == 131072
    cap = ctxlock.load(str(d)).capacity
    assert (cap.context_window, cap.source) == (32768, "config.json max_position_embeddings")
    assert [(f.source, f.value) for f in cap.found] == [
        ("config.json max_position_embeddings", 32768),
        ("tokenizer_config.json model_max_length", 131072),
    ]
    (note,) = cap.notes
    assert note.startswith(
        "tokenizer_config.json model_max_length 131,072 differs from config.json max_position_embeddings 32,768: "
        "using config.json max_position_embeddings"
    )
    assert ctxlock.load(str(d)).artifacts.describe()["capacity"]["context_window"] == 32768


@pytest.mark.reference
def test_multimodal_text_config(tmp_path: Path) -> None:
    config = {
        "model_type": "llava",
        "text_config": {"model_type": "llama", "max_position_embeddings": 4096},
        "vision_config": {"model_type": "clip_vision_model"},
    }
    d = _hf_dir(tmp_path, config)
    assert _auto_config(d).get_text_config().max_position_embeddings == 4096
    cap = ctxlock.load(str(d)).capacity
    assert (cap.context_window, cap.source) == (4096, "config.json text_config max_position_embeddings")


def test_sliding_window_alone_is_not_a_window(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, {"model_type": "mistral", "sliding_window": 4096})
    cap = ctxlock.load(str(d)).capacity
    assert cap.context_window is None and cap.source == "unknown"


def test_other_config_keys_and_several_that_disagree(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, {"model_type": "gpt2", "n_positions": 1024})
    assert ctxlock.load(str(d)).capacity.source == "config.json n_positions"
    cap = from_files(config={"max_position_embeddings": 8192, "max_sequence_length": 4096})
    assert (cap.context_window, cap.source) == (4096, "config.json max_sequence_length")
    assert "using the smallest, max_sequence_length" in cap.notes[0]


def test_rope_scaling_is_said_not_applied() -> None:
    rope = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    cap = from_files(config={"max_position_embeddings": 32768, "rope_scaling": rope})
    assert cap.context_window == 32768
    assert cap.notes == (
        "config.json rope_scaling yarn factor 4.0: the window is max_position_embeddings as written (vLLM multiplies "
        "it by the factor for some scaling types; pass --context-window to use that)",
    )


def test_mistral_params_json(tmp_path: Path) -> None:
    """Mistral's params.json `max_seq_len` (as vLLM maps it); the tekken file states none."""
    d = _hf_dir(tmp_path, params={"dim": 5120, "max_seq_len": 131072})
    cap = ctxlock.load(str(d)).capacity
    assert (cap.context_window, cap.source) == (131072, "params.json max_seq_len")


def test_the_embedded_models_state_no_window() -> None:
    for name in ("mistral-nemo", "book"):
        cap = ctxlock.load(name).capacity
        assert cap == Capacity() and cap.to_dict()["source"] == "unknown"


def test_price_table_entries_and_overrides() -> None:
    table = PriceTable.parse(PRICES.read_bytes(), "prices.json")
    files = from_files(config={"max_position_embeddings": 200000})
    cap = with_price(files, table.lookup("claude-sonnet-4-5"), table.name)
    assert (cap.context_window, cap.max_output_tokens) == (1000000, 64000)
    assert cap.source == "price table prices.json claude-sonnet-4-5 max_input_tokens"
    assert cap.output_source == "price table prices.json claude-sonnet-4-5 max_output_tokens"
    assert any("config.json max_position_embeddings 200,000 differs" in n for n in cap.notes)
    legacy = PriceTable.parse(b'{"m": {"input_cost_per_token": 1e-6, "max_tokens": 4096}}', "t.json")
    cap = with_price(Capacity(), legacy.lookup("m"), "t.json")
    assert cap.context_window is None
    assert (cap.max_output_tokens, cap.output_source) == (
        4096,
        "price table t.json m max_tokens (legacy: the output limit)",
    )
    flagged = override(files, context_window=1000, max_output_tokens=10)
    assert (flagged.context_window, flagged.source, flagged.output_source) == (
        1000,
        "--context-window",
        "--max-output-tokens",
    )
    assert override(files) is files


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(["max_position_embeddings", "n_positions", "max_seq_len"]), value=HOSTILE, tok=HOSTILE)
def test_hostile_values_are_never_a_window_silently(key: str, value: Any, tok: Any) -> None:
    cap = from_files(config={key: value}, tokenizer_config={"model_max_length": tok}, params={"max_seq_len": value})
    for f in cap.found:
        assert isinstance(f.value, int) and not isinstance(f.value, bool) and f.value > 0
    if cap.context_window is not None:
        assert cap.context_window in {f.value for f in cap.found}
    # a value that is present and not a positive integer (nor the sentinel) is said in a note
    for where, v in (("config.json", value), ("tokenizer_config.json", tok)):
        usable = not isinstance(v, bool) and (
            (isinstance(v, int) and v > 0) or (isinstance(v, float) and math.isfinite(v) and v.is_integer() and v > 0)
        )
        if v is not None and not usable:
            assert any(n.startswith(where) for n in cap.notes), (where, v, cap.notes)


def test_a_hostile_gguf_context_length_is_a_note(tmp_path: Path) -> None:
    src = fetched.gguf_path("llama-spm")
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), arch="llama")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "llama.context_length"):
            continue
        value = field.contents()
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_array(field.name, value)
        else:
            writer.add_key_value(field.name, value, vtype)
    writer.add_string("llama.context_length", "a lot")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    cap = ctxlock.load(str(tmp_path / "bad.gguf")).capacity
    assert cap.context_window is None
    assert cap.notes == ("bad.gguf llama.context_length 'a lot' is not a positive integer: ignored",)


# -- fit and clamp -------------------------------------------------------------------------------------------------

REQUEST = {
    "messages": [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Why is the sky blue?"},
    ],
    "max_tokens": 40000,
}


def _request(tmp_path: Path, request: dict = REQUEST) -> str:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(request))
    return str(path)


def test_fit_uses_the_models_window_without_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_cli = in_process_cli(monkeypatch)
    gguf_path = str(fetched.gguf_path("qwen2"))
    out = run_cli("fit", _request(tmp_path), "--model", gguf_path, "--json", "--record", "--store", str(tmp_path / "s"))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["policy"]["context_window"] == 32768
    assert data["policy"]["window_source"] == "model ggml-vocab-qwen2.gguf qwen2.context_length"
    shown = run_cli("records", "show", data["record_id"], "--store", str(tmp_path / "s"))
    record = json.loads(shown.stdout)
    assert record["decisions"]["budget"]["policy"]["window_source"] == data["policy"]["window_source"]
    # a flag overrides, and says so; without a window and without a flag: one typed error line
    flagged = json.loads(
        run_cli("fit", _request(tmp_path), "--model", gguf_path, "--context-window", "100", "--json").stdout
    )
    assert (flagged["policy"]["context_window"], flagged["policy"]["window_source"]) == (100, "--context-window")
    none = run_cli("fit", _request(tmp_path), "--model", "mistral-nemo")
    assert none.returncode == 1 and none.stdout == ""
    assert none.stderr.startswith("error: CapacityUnknownError: --context-window: model 'mistral-nemo' states no")
    assert "pass --context-window N" in none.stderr


def _clamp(*args: str) -> Any:
    return invoke(clamp_cmds.register, "clamp", *args)


def test_fit_on_a_model_directory_without_flags(tmp_path: Path) -> None:
    d = _hf_dir(tmp_path, {"model_type": "qwen2", "max_position_embeddings": 40}, {"model_max_length": 131072})
    tpl = str(fetched.templates_dir() / "Qwen-Qwen2.5-7B-Instruct.jinja")
    out = invoke(budget_cmds.register, "fit", _request(tmp_path), "--model", str(d), "-t", tpl, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert (data["budget"], data["policy"]["window_source"]) == (40, "model config.json max_position_embeddings")
    assert data["input_tokens"] <= 40


def test_clamp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_cli = in_process_cli(monkeypatch)
    gguf_path = str(fetched.gguf_path("qwen2"))
    req = _request(tmp_path)
    n = len(ctxlock.load(gguf_path).encode(REQUEST)["input_ids"][0])
    out = _clamp(req, "--model", gguf_path, "--margin", "10", "--margin-fraction", "0.1", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    margin = max(10, math.ceil(Decimal("0.1") * n))
    assert data["input_tokens"] == n and data["margin"] == margin
    assert data["room"] == 32768 - n - margin == data["max_tokens"]  # the request asked for 40,000: more than fits
    assert (data["requested"], data["requested_source"], data["limited_by"]) == (40000, "request max_tokens", "room")
    assert data["request_bytes"] == len(json.dumps(REQUEST).encode())
    assert data["window_source"] == "ggml-vocab-qwen2.gguf qwen2.context_length"
    asked = json.loads(_clamp(req, "--model", gguf_path, "--max-tokens", "500", "--json").output)
    assert (asked["max_tokens"], asked["limited_by"]) == (500, "requested")
    prices = ("--prices", str(PRICES), "--price-model", "claude-sonnet-4-5")
    priced = json.loads(_clamp(req, "--model", gguf_path, *prices, "--json").output)
    assert priced["context_window"] == 1000000 and (priced["max_tokens"], priced["limited_by"]) == (40000, "requested")
    small = json.loads(_clamp(req, "--model", gguf_path, "--max-output-tokens", "64", "--json").output)
    assert (small["max_tokens"], small["limited_by"]) == (64, "max_output_tokens")
    human = _clamp(req, "--model", gguf_path)
    assert human.output.startswith(f"max_tokens {32768 - n:,} (limited by room)\n")
    assert "window     32,768 from ggml-vocab-qwen2.gguf qwen2.context_length" in human.output
    # the errors, as the command prints them: one line, exit 1
    full = run_cli("clamp", req, "--model", gguf_path, "--context-window", str(n + 5), "--margin", "5")
    assert full.returncode == 1 and full.stderr.startswith("error: BudgetExceeded: max_tokens: only 0 tokens left")
    unknown = _clamp(req, "--model", "book", "--json")
    assert unknown.exit_code == 1 and json.loads(unknown.output)["error"]["type"] == "CapacityUnknownError"
    bad = _clamp(_request(tmp_path, {**REQUEST, "max_tokens": "lots"}), "--model", gguf_path, "--json")
    assert bad.exit_code == 1 and "max_tokens must be a positive integer" in bad.output


def test_the_margins_ceiling_is_exact() -> None:
    from ctxlock.budget._fit import clamp_margin

    assert clamp_margin(1000, 0, 0.1) == 100  # float arithmetic says 100.00000000000001
    assert clamp_margin(1001, 0, 0.1) == 101
    assert clamp_margin(3, 0, "0.333333333333") == 1
    assert clamp_margin(10**12 + 1, 0, 1e-12) == 2
