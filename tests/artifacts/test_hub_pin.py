"""Issue 15 item 7: pinned hub models.

`--model org/name@revision` resolves a branch, a tag or a commit in the local HF cache as huggingface_hub's
`try_to_load_from_cache` does (refs/<revision> first, else snapshots/<revision>); the record names the commit it
resolved to, and a run made through a ref (a rolling reference, `main` by default) is flagged in the output and
the record, with the pinned spec to use instead. The cache is a fake one in a tmp dir, with real tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_hub import make_model

import ctxlock as cl
import fetched
from cli_runner import ctxlock
from ctxlock.errors import ArtifactFormatError, ArtifactNotFoundError

MAIN = "a" * 40
TAGGED = "0123456789abcdef0123456789abcdef01234567"
REPO = "Qwen/Qwen2.5-pin-test"
REQUEST = {"messages": [{"role": "user", "content": "hi"}]}


def _files(template: str) -> dict[str, bytes]:
    src = fetched.hf_tokenizer_dir("qwen2")
    return {
        "tokenizer.json": (src / "tokenizer.json").read_bytes(),
        "tokenizer_config.json": (src / "tokenizer_config.json").read_bytes(),
        "chat_template.jinja": template.encode(),
    }


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    make_model(
        cache,
        REPO,
        commits={
            MAIN: _files("main: {{ messages[0].content }}"),
            TAGGED: _files("tagged: {{ messages[0].content }}"),
        },
        refs={"main": MAIN, "v1.0": TAGGED},
    )
    return cache


def test_revision_in_the_spec_resolves_like_huggingface_hub(cache: Path) -> None:
    from ctxlock.artifacts._hub import is_hub_id, resolve_hub_revision

    root = cache / "models--Qwen--Qwen2.5-pin-test"
    main = resolve_hub_revision(REPO)
    assert (main.commit, main.via, main.rolling, main.revision) == (MAIN, "refs/main", True, "main")
    tag = resolve_hub_revision(f"{REPO}@v1.0")
    assert (tag.commit, tag.via, tag.rolling, tag.snapshot) == (TAGGED, "refs/v1.0", True, root / "snapshots" / TAGGED)
    pinned = resolve_hub_revision(f"{REPO}@{TAGGED}")
    assert (pinned.commit, pinned.via, pinned.rolling) == (TAGGED, f"snapshots/{TAGGED}", False)
    assert pinned.warning() is None and f"--model {REPO}@{MAIN}" in (main.warning() or "")
    assert is_hub_id(f"{REPO}@v1.0") and is_hub_id(f"{REPO}@{MAIN}") and not is_hub_id("nope@main")
    # huggingface_hub reads refs/<revision> first, even for a name that looks like a commit.
    (root / "refs" / MAIN).write_text(TAGGED)
    assert resolve_hub_revision(f"{REPO}@{MAIN}").commit == TAGGED


def test_unknown_revisions_are_typed_errors(cache: Path) -> None:
    from ctxlock.artifacts._hub import resolve_hub_revision

    with pytest.raises(ArtifactNotFoundError, match="revision 'dev'"):
        resolve_hub_revision(f"{REPO}@dev")
    with pytest.raises(ArtifactNotFoundError, match="revision 'aaaaaaa'"):
        resolve_hub_revision(f"{REPO}@aaaaaaa")  # an abbreviated commit is not resolved offline
    with pytest.raises(ArtifactFormatError, match="two revisions"):
        resolve_hub_revision(f"{REPO}@main", revision="v1.0")
    bad = ctxlock("render", "-", "--model", f"{REPO}@dev", stdin=json.dumps(REQUEST))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "revision 'dev'" in bad.stderr


def test_loaded_model_knows_its_revision(cache: Path) -> None:
    tagged = cl.load(f"{REPO}@v1.0")
    assert tagged.id == REPO and tagged.hub.commit == TAGGED and tagged.hub.rolling
    assert tagged.render(REQUEST).text == "tagged: hi"
    pinned = cl.load(f"{REPO}@{MAIN}")
    assert pinned.render(REQUEST).text == "main: hi" and not pinned.hub.rolling
    assert cl.load(REPO).hub.to_dict() == {
        "repo_id": REPO,
        "revision": "main",
        "commit": MAIN,
        "resolved_via": "refs/main",
        "rolling": True,
    }


def test_record_names_the_commit_and_flags_a_rolling_ref(cache: Path, tmp_path: Path) -> None:
    from ctxlock.records import ExecutionRecord
    from ctxlock.records._store import Store

    store = tmp_path / "store"

    def record(spec: str) -> tuple[dict, dict]:
        proc = ctxlock(
            "render", "-", "-m", spec, "--record", "--store", str(store), "--json", stdin=json.dumps(REQUEST)
        )
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        return out, ExecutionRecord.from_bytes(Store(store).get_record(out["record_id"])).data

    out, rec = record(REPO)
    assert rec["model"]["hub"] == {
        "repo_id": REPO,
        "revision": "main",
        "commit": MAIN,
        "resolved_via": "refs/main",
        "rolling": True,
    }
    assert [w["kind"] for w in rec["warnings"]] == ["rolling_revision"]
    assert f"--model {REPO}@{MAIN}" in rec["warnings"][0]["message"]
    assert out["hub"]["commit"] == MAIN and out["warnings"][0]["kind"] == "rolling_revision"

    # The alias moves: the same spec now loads another commit, and the record says which.
    (cache / "models--Qwen--Qwen2.5-pin-test" / "refs" / "main").write_text(TAGGED)
    moved, rec2 = record(REPO)
    assert rec2["model"]["hub"]["commit"] == TAGGED and moved["text"] == "tagged: hi"

    _, pinned = record(f"{REPO}@{MAIN}")
    assert pinned["model"]["hub"]["rolling"] is False and pinned["model"]["hub"]["commit"] == MAIN
    assert pinned["warnings"] == []

    human = ctxlock("render", "-", "-m", REPO, stdin=json.dumps(REQUEST))
    assert "warning" in human.stdout and "rolling reference" in human.stdout
    assert f"{REPO}@main -> {TAGGED} (via refs/main)" in human.stdout
    shown = ctxlock("inspect", "-m", f"{REPO}@v1.0")
    assert shown.returncode == 0, shown.stderr
    assert f"revision   {REPO}@v1.0 -> {TAGGED} (via refs/v1.0, a rolling reference" in shown.stdout


def test_a_copied_snapshot_dir_is_not_a_hub_model(cache: Path, tmp_path: Path) -> None:
    # A plain directory keeps loading as before: no hub section, no warning.
    plain = tmp_path / "plain"
    shutil.copytree(cache / "models--Qwen--Qwen2.5-pin-test" / "snapshots" / MAIN, plain)
    model = cl.load(str(plain))
    assert model.hub is None
    from ctxlock.records import RunOptions
    from ctxlock.records._replay import run_and_record

    _, rec, _ = run_and_record(model, json.dumps(REQUEST).encode(), RunOptions())
    assert rec.data["model"]["hub"] is None and rec.data["warnings"] == []
