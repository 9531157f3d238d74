"""Issue 14 item 1: a record is data. Replaying or importing a tampered record writes nothing outside the store and
replay's own temporary directory, whatever file names its `replay` section holds.

Every hostile name (relative, absolute, dotted, drive and UNC forms, NUL and control characters, Unicode look-alikes
of dots and slashes, overlong, Windows devices, the two names replay writes itself) is a RecordFormatError naming the
field, through the three routes a record comes in by: the Python API (`ExecutionRecord.from_bytes`, `load_record`,
`replay`, `materialized`), `ctxlock replay FILE` and `ctxlock records import`. The sandbox a test runs in is
snapshotted before and after: a victim file keeps its bytes and inode, and the temporary root is left empty.
"""

from __future__ import annotations

import copy
import errno
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import ctxlock
import ctxlock.records as record_module
import ctxlock.records._replay as replay_module
import ctxlock.records._store as store_module
import fetched
from ctxlock.errors import CtxlockError, RecordError, RecordFormatError
from ctxlock.records import ExecutionRecord, RunOptions, canonical_bytes
from ctxlock.records._replay import load_record, materialized, replay, run_and_record, save
from ctxlock.records._store import Store
from ctxlock.template._render import ChatTemplate
from hypothesis_profiles import examples

NOW = "2024-01-01T00:00:00"
REQUEST = {"messages": [{"role": "user", "content": "天空"}]}
GGUF = "ggml-vocab-llama-spm.gguf"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # GGUF conversions are cached; keep that cache out of the user's home and shared across this file's tests.
    monkeypatch.setenv("CTXLOCK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "ctxlock-cache"))
    monkeypatch.delenv("CTXLOCK_MAX_RECORD_BYTES", raising=False)


class Sandbox:
    """A directory holding everything a test may touch: the store, a temporary root, a working directory and a
    victim file. `changes()` lists every path outside the store that differs from the snapshot taken at creation."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store_dir = root / "store"
        self.tmp = root / "tmp"
        self.work = root / "work"
        self.victim = root / "victim.txt"
        for d in (self.tmp, self.work):
            d.mkdir(parents=True)
        self.victim.write_text("original\n")
        self.victim_inode = self.victim.stat().st_ino
        self.store = Store(self.store_dir)
        self.before: dict[str, tuple] = {}

    def snapshot(self) -> None:
        self.before = self.tree()

    def tree(self) -> dict[str, tuple]:
        out: dict[str, tuple] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):  # os.walk does not follow symlinks
            if Path(dirpath) == self.root and "store" in dirnames:
                dirnames.remove("store")
            for name in dirnames + filenames:
                p = Path(dirpath) / name
                st_ = os.lstat(p)
                if stat.S_ISLNK(st_.st_mode):
                    entry: tuple = ("link", os.readlink(p))
                elif stat.S_ISDIR(st_.st_mode):
                    entry = ("dir",)
                else:
                    entry = ("file", st_.st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
                out[str(p.relative_to(self.root))] = entry
        return out

    def assert_untouched(self) -> None:
        after = self.tree()
        changed = sorted(k for k in set(self.before) | set(after) if self.before.get(k) != after.get(k))
        assert changed == [], f"paths outside the store changed: {changed}"
        assert self.victim.read_text() == "original\n" and self.victim.stat().st_ino == self.victim_inode
        assert list(self.tmp.iterdir()) == [], "replay left its temporary directory behind"


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    box = Sandbox(tmp_path / "sandbox")
    monkeypatch.setattr(tempfile, "tempdir", str(box.tmp))  # mkdtemp (replay's private directory) goes here
    monkeypatch.chdir(box.work)
    return box


def _recorded(store: Store, spec: str | None) -> ExecutionRecord:
    """A real record, saved with its artifacts: the book model (no tokenizer file) or a GGUF (one file)."""
    model = ctxlock.load(spec)
    template = model.templates.select(None) if model.templates is not None else None
    if template is None:
        template = ChatTemplate("{{ messages[0].content }}", id="plain")
    raw = json.dumps(REQUEST, ensure_ascii=False).encode()
    _, rec, exc = run_and_record(model, raw, RunOptions(now=NOW), template=template)
    assert exc is None
    save(store, model, rec, template)
    return rec


@pytest.fixture
def book(sandbox: Sandbox) -> ExecutionRecord:
    return _recorded(sandbox.store, "book")


@pytest.fixture
def gguf(sandbox: Sandbox) -> ExecutionRecord:
    return _recorded(sandbox.store, str(fetched.gguf_path("llama-spm")))


def _with_file(rec: ExecutionRecord, name: str) -> dict:
    """The issue's tampering: one more `replay.files` entry, pointing at a blob the store holds (the template)."""
    data = copy.deepcopy(rec.data)
    data["replay"]["files"][name] = data["replay"]["template_sha256"]
    return data


def _renamed(rec: ExecutionRecord, name: str) -> dict:
    """A consistent tampering: the tokenizer's own file renamed, in both the manifest and `replay.files`."""
    data = copy.deepcopy(rec.data)
    rp = data["replay"]
    ((old, sha),) = rp["files"].items()
    rp["files"] = {name: sha}
    assert rp["tokenizer"]["file"] == old
    rp["tokenizer"]["file"] = name
    return data


def _raw(data: dict) -> bytes:
    """Bytes of a record that bypass every check ctxlock makes when it builds one (as a hand-edited file would)."""
    # ASCII escapes, so that a lone surrogate (which no UTF-8 file holds raw) still reaches the parser.
    return (json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n").encode("ascii")


def _validate(line: bytes):
    """What `ctxlock records import` passes to Store.import_records (cli/records.py)."""
    return ExecutionRecord.from_bytes(line).index()


# -- hostile names -------------------------------------------------------------------------------------------------

LOOKALIKES = [
    "\u2024",  # one dot leader
    "\u2025",  # two dot leader
    "\ufe52",  # small full stop
    "\uff0e",  # fullwidth full stop
    "\uff0f",  # fullwidth solidus
    "\u2215",  # division slash
    "\u2044",  # fraction slash
    "\u29f8",  # big solidus
    "\uff3c",  # fullwidth reverse solidus
    "\u2216",  # set minus
    "\u0338",  # combining long solidus overlay
    "\u200b",  # zero width space
    "\u202e",  # right-to-left override
    "\u00a0",  # no-break space
    "\u212a",  # Kelvin sign (case-folds to k)
    "\udc80",  # a lone surrogate (os.fsencode's escape for an undecodable byte)
]

CATALOGUE = [
    "",
    ".",
    "..",
    "...",
    "../victim.txt",
    "../../victim.txt",
    "a/../../victim.txt",
    "./tokenizer.json",
    "sub/tokenizer.json",
    "tokenizer.json/",
    "/tmp/victim.txt",
    "//server/share/x",
    "C:\\victim.txt",
    "C:victim.txt",
    "c:",
    "\\\\server\\share\\x",
    "\\\\?\\C:\\x",
    "..\\..\\victim.txt",
    "tokenizer.json::$DATA",
    "tokenizer.json\x00.gguf",
    "\x00",
    "tok\nenizer.json",
    "tok\x7fenizer.json",
    "\u2024\u2024/x",
    "\u2024\u2024",
    "\uff0e\uff0e/",
    "\uff0e\uff0e\uff0fvictim.txt",
    "..\u2215victim.txt",
    "\u2215tmp\u2215victim.txt",
    "tokenizer\u200b.json",
    "a" * 256,
    "x" * 251 + ".gguf",
    "é" * 128,
    ".hidden",
    ".ctxlock.json",
    "model.gguf.",
    "model.gguf ",
    " model.gguf",
    "-rf",
    "ctxlock.json",
    "CTXLOCK.JSON",
    "chat_template.jinja",
    "Chat_Template.Jinja",
    "CON",
    "nul.gguf",
    "COM1.json",
    "lpt9",
    "conin$",
    "tokenizer*.json",
    "tokenizer?.json",
    'tokenizer".json',
    "<tokenizer>.json",
    "tokenizer|.json",
]

_safe = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,16}[A-Za-z0-9_]", fullmatch=True)
_position = st.integers(0, 20)


def _insert(chars: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.tuples(_safe, chars, _position).map(lambda t: t[0][: t[2]] + t[1] + t[0][t[2] :])


def _random_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda flips: "".join(c.upper() if f else c for c, f in zip(word, flips, strict=True))
    )


hostile_names = st.one_of(
    st.sampled_from(CATALOGUE),
    # paths of several components, with . and .. anywhere, in either separator
    st.tuples(
        st.lists(
            st.sampled_from(["..", ".", "", "a", "tokenizer.json", "\u2024\u2024"]) | _safe, min_size=2, max_size=5
        ),
        st.sampled_from(["/", "\\"]),
    ).map(lambda t: t[1].join(t[0])),
    _safe.map(lambda s: "/" + s),
    _safe.map(lambda s: "/tmp/" + s),
    st.tuples(st.sampled_from("ACDZacz"), st.sampled_from([":", ":\\", ":/"]), _safe).map("".join),
    _safe.map(lambda s: "\\\\server\\share\\" + s),
    _insert(st.sampled_from(["\x00", "/", "\\", ":"])),
    _insert(st.integers(1, 31).map(chr) | st.just("\x7f")),
    _insert(st.sampled_from(LOOKALIKES)),
    _insert(st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF)),
    st.integers(256, 700).map(lambda n: "a" * n),
    st.tuples(_safe, st.integers(256, 400)).map(lambda t: (t[0] * 400)[: t[1] - 5] + ".gguf"),
    _safe.map(lambda s: "." + s),
    _safe.map(lambda s: s + "."),
    _safe.map(lambda s: s + " "),
    _random_case("ctxlock.json"),
    _random_case("chat_template.jinja"),
    st.tuples(
        st.sampled_from(["con", "prn", "aux", "nul", "com1", "com9", "lpt1", "lpt9"]).flatmap(_random_case),
        st.none() | _safe,
    ).map(lambda t: t[0] if t[1] is None else f"{t[0]}.{t[1]}"),
)


FAST = settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FAST
@given(name=hostile_names)
def test_every_hostile_name_is_refused_by_the_name_rule(name: str) -> None:
    with pytest.raises(RecordFormatError) as info:
        record_module.check_file_name(name, path="replay.files")
    assert info.value.path == "replay.files"
    assert "\n" not in str(info.value) and "\x00" not in str(info.value)  # one printable line, whatever the name


@FAST
@given(name=hostile_names)
@example(name="\udc80")  # a lone surrogate: refused by the strict JSON reader before the name rule
def test_parsing_refuses_a_record_with_a_hostile_name(book: ExecutionRecord, gguf: ExecutionRecord, name: str) -> None:
    """from_bytes and from_data, whether the name is an extra file or the tokenizer's own (manifest and files)."""
    for data, field in ((_with_file(book, name), "replay.files["), (_renamed(gguf, name), "replay.")):
        with pytest.raises(RecordFormatError) as info:
            ExecutionRecord.from_bytes(_raw(data), source="t.json")
        # A name the strict JSON reader refuses already (a lone surrogate) is named by its JSON path in the file.
        assert info.value.path.startswith((f"t.json:{field}", f"t.json $.{field.rstrip('[')}")), info.value.path
        with pytest.raises(RecordFormatError):
            ExecutionRecord.from_data(data)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=hostile_names)
@example(name="\udc80")
def test_import_and_replay_of_a_hostile_name_write_nothing(
    sandbox: Sandbox, book: ExecutionRecord, gguf: ExecutionRecord, name: str
) -> None:
    """The Python routes end to end: Store.import_records (as `records import` calls it), load_record on a file,
    and materialized on a record built from raw bytes (no parsing at all)."""
    sandbox.snapshot()
    target = Store(sandbox.store_dir / "imported")
    for data in (_with_file(book, name), _renamed(gguf, name)):
        raw = _raw(data)
        with pytest.raises(RecordFormatError) as info:
            target.import_records(io.BytesIO(gguf.body + raw), validate=_validate)
        assert info.value.path.startswith(("line 2, record:replay.", "line 2, record $.replay."))
        assert target.list_records() == []  # all or nothing
        path = sandbox.store_dir / "t.json"
        path.write_bytes(raw)
        with pytest.raises(RecordFormatError):
            load_record(str(path), sandbox.store)
        with pytest.raises(RecordFormatError), materialized(ExecutionRecord(raw), sandbox.store):
            pass
    sandbox.assert_untouched()


@settings(max_examples=examples(150), deadline=None)
@given(name=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.+@=,~ ()\[\]-]{0,250}[A-Za-z0-9_]", fullmatch=True))
def test_an_accepted_name_is_one_file_directly_inside_any_directory(name: str) -> None:
    """The rule's other half: whatever it accepts joins onto a directory as a direct child, on POSIX and Windows."""
    import ntpath
    import posixpath

    try:
        record_module.check_file_name(name, path="name")
    except RecordFormatError as exc:
        assert "device" in exc.message or "replay writes" in exc.message
        return
    for mod, base in ((posixpath, "/d/replay"), (ntpath, "C:\\d\\replay")):
        joined = mod.normpath(mod.join(base, name))
        assert mod.dirname(joined) == base and mod.basename(joined) == name


def test_every_name_the_backends_record_is_accepted() -> None:
    for name in (
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer.model.v3",
        "tekken.json",
        "tekken_240911.json",
        "qwen.tiktoken",
        "cl100k_base.tiktoken",
        GGUF,
        "Meta-Llama-3-8B-Instruct.Q4_K_M.gguf",
        "Llama 3 8B (1).gguf",
        "a" * 255,
    ):
        assert record_module.check_file_name(name, path="name") == name


# -- the issue's reproduction, and the CLI routes ------------------------------------------------------------------


def _cli(sandbox: Sandbox, *args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess[str]:
    full_env = {
        **os.environ,
        "TMPDIR": str(sandbox.tmp),
        "CTXLOCK_DATA_DIR": str(sandbox.store_dir),
        "COLUMNS": "200",
        "NO_COLOR": "1",
        **(env or {}),
    }
    p = subprocess.run(
        [sys.executable, "-m", "ctxlock", *args],
        cwd=sandbox.work,
        env=full_env,
        capture_output=True,
        timeout=120,
        **kw,
    )
    return subprocess.CompletedProcess(p.args, p.returncode, p.stdout.decode(), p.stderr.decode())


def _refused(p: subprocess.CompletedProcess[str], error: str = "RecordFormatError") -> None:
    assert p.returncode == 1, (p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {error}: "), p.stderr
    assert "identical" not in p.stdout


def test_the_issue_reproduction(sandbox: Sandbox) -> None:
    """Verbatim from issue 14, with the victim inside the sandbox: `replay t.json` used to print "identical" and
    leave the stored template in the victim file."""
    (sandbox.work / "chat.json").write_text(json.dumps(REQUEST, ensure_ascii=False))
    made = _cli(sandbox, "render", "chat.json", "--model", "book", "--record", "--store", "S", "--now", NOW)
    assert made.returncode == 0, made.stderr
    assert _cli(sandbox, "records", "export", "--store", "S", "--out", "rec.jsonl").returncode == 0
    r = json.loads((sandbox.work / "rec.jsonl").read_text())
    r["replay"]["files"][str(sandbox.victim)] = r["replay"]["template_sha256"]
    (sandbox.work / "t.json").write_text(json.dumps(r))
    sandbox.snapshot()
    p = _cli(sandbox, "replay", "t.json", "--store", "S")
    _refused(p)
    assert f"t.json:replay.files[{json.dumps(str(sandbox.victim))}]" in p.stderr
    sandbox.assert_untouched()


# A cross-section of the catalogue (each costs two CLI start-ups); the hypothesis tests above cover the rest.
CLI_NAMES = [
    "ABSOLUTE",
    "../victim.txt",
    "C:\\victim.txt",
    "\uff0e\uff0e\uff0fvictim.txt",
    "ctxlock.json",
    "tokenizer.json\x00",
]


@pytest.mark.parametrize("name", CLI_NAMES, ids=[json.dumps(n)[:30] for n in CLI_NAMES])
def test_cli_replay_and_import_refuse_a_hostile_name(sandbox: Sandbox, gguf: ExecutionRecord, name: str) -> None:
    name = str(sandbox.victim) if name == "ABSOLUTE" else name
    bundle = sandbox.work / "bundle.jsonl"
    bundle.write_bytes(gguf.body + _raw(_renamed(gguf, name)))
    single = sandbox.work / "t.json"
    single.write_bytes(_raw(_with_file(gguf, name)))
    sandbox.snapshot()

    p = _cli(sandbox, "replay", str(single))
    _refused(p)
    assert "replay.files[" in p.stderr

    p = _cli(sandbox, "records", "import", str(bundle), "--store", str(sandbox.store_dir / "imported"))
    _refused(p)
    assert "line 2, record:replay." in p.stderr
    assert Store(sandbox.store_dir / "imported").list_records() == []
    sandbox.assert_untouched()


# -- materializing: a fresh private directory, nothing followed or replaced ----------------------------------------


def test_replay_still_works_by_hard_link_and_by_copy(
    sandbox: Sandbox, gguf: ExecutionRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int]] = []
    real_mkdtemp = tempfile.mkdtemp

    def watching_mkdtemp(*a, **kw):
        path = real_mkdtemp(*a, **kw)
        seen.append((path, stat.S_IMODE(os.stat(path).st_mode)))
        return path

    monkeypatch.setattr(replay_module.tempfile, "mkdtemp", watching_mkdtemp)
    sandbox.snapshot()
    result, _ = replay(load_record(gguf.id, sandbox.store), sandbox.store)
    assert result.identical, result.to_dict()

    def no_link(src, dst, *a, **kw):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(replay_module.os, "link", no_link)
    result, _ = replay(load_record(gguf.id, sandbox.store), sandbox.store)
    assert result.identical, result.to_dict()
    assert len(seen) == 2 and all(mode == 0o700 for _, mode in seen)
    sandbox.assert_untouched()


@pytest.mark.parametrize("link", ["hard link", "copy"])
@pytest.mark.parametrize("planted", [GGUF, "chat_template.jinja", "ctxlock.json"])
def test_a_path_already_in_the_replay_directory_is_never_followed_or_replaced(
    sandbox: Sandbox, gguf: ExecutionRecord, monkeypatch: pytest.MonkeyPatch, planted: str, link: str
) -> None:
    """Someone who could write into the replay directory before ctxlock fills it (it cannot, mkdtemp is 0700 and
    new; this stands in for a racing process) plants a symlink to the victim under a name replay will create."""

    real_mkdtemp = tempfile.mkdtemp

    def planted_mkdtemp(*a, **kw):
        path = Path(real_mkdtemp(dir=sandbox.tmp))
        (path / planted).symlink_to(sandbox.victim)
        return str(path)

    monkeypatch.setattr(replay_module.tempfile, "mkdtemp", planted_mkdtemp)
    if link == "copy":
        monkeypatch.setattr(replay_module.os, "link", lambda *a, **kw: (_ for _ in ()).throw(OSError(errno.EPERM, "")))
    sandbox.snapshot()
    with pytest.raises(RecordError) as info:
        replay(load_record(gguf.id, sandbox.store), sandbox.store)
    assert info.value.path.endswith(planted) and "nothing was overwritten" in info.value.message
    sandbox.assert_untouched()


# -- the rest of the replay section ------------------------------------------------------------------------------

BAD_DIGESTS = ["", "0" * 63, "0" * 65, "A" * 64, "g" * 64, "../" + "0" * 61, 64, None, ["0" * 64]]


def _tweaks(book: ExecutionRecord, gguf: ExecutionRecord):
    """(description, record data, expected path suffix) for every other way a replay section can lie."""
    sha = gguf.data["replay"]["files"][GGUF]

    def edit(rec: ExecutionRecord, fn) -> dict:
        data = copy.deepcopy(rec.data)
        fn(data["replay"])
        return data

    for bad in BAD_DIGESTS:
        yield "file digest", edit(gguf, lambda rp, b=bad: rp["files"].update({GGUF: b})), f'replay.files["{GGUF}"]'
        if bad is not None:
            yield "template digest", edit(book, lambda rp, b=bad: rp.update(template_sha256=b)), "template_sha256"
    yield "package resource", edit(gguf, lambda rp: rp["tokenizer"].update(package="ctxlock", resource="x")), "package"
    yield "tiktoken preset", edit(gguf, lambda rp: rp["tokenizer"].update(preset="qwen")), "tokenizer.preset"
    yield "unknown format", edit(gguf, lambda rp: rp["tokenizer"].update(format="pickle")), "tokenizer.format"
    yield "manifest not an object", edit(gguf, lambda rp: rp.update(tokenizer="tokenizer.json")), "replay.tokenizer"
    yield "file missing", edit(gguf, lambda rp: rp.update(files={})), "tokenizer.file"
    yield "file unread", edit(gguf, lambda rp: rp["files"].update({"extra.json": sha})), "tokenizer.file"
    yield "manifest names another", edit(gguf, lambda rp: rp["tokenizer"].update(file="other.gguf")), "tokenizer.file"
    yield "manifest file hostile", edit(gguf, lambda rp: rp["tokenizer"].update(file="../x.gguf")), "tokenizer.file"
    yield "manifest file absent", edit(gguf, lambda rp: rp["tokenizer"].pop("file")), "tokenizer.file"
    yield "case collision", edit(gguf, lambda rp: rp["files"].update({GGUF.upper(): sha})), f'files["{GGUF}"]'
    yield "too many files", edit(book, lambda rp: rp.update(files={f"f{i}.json": sha for i in range(17)})), "files"
    yield "files a list", edit(gguf, lambda rp: rp.update(files=[[GGUF, sha]])), "replay.files"
    yield "unknown key", edit(gguf, lambda rp: rp.update(run="rm -rf /")), "replay"
    yield "missing key", edit(gguf, lambda rp: rp.pop("files")), "replay"
    yield "model not a string", edit(gguf, lambda rp: rp.update(model={"x": 1})), "replay.model"
    yield "book unk", edit(book, lambda rp: rp["tokenizer"].update(unk="<nope>")), "tokenizer.unk"
    yield "book vocab", edit(book, lambda rp: rp["tokenizer"].update(vocab="abc")), "tokenizer.vocab"
    yield "book control", edit(book, lambda rp: rp["tokenizer"].update(control=["<nope>"])), "tokenizer.control"
    yield "replay not an object", edit(book, lambda rp: None) | {"replay": []}, "replay"
    yield "options not an object", copy.deepcopy(book.data) | {"options": "x"}, "options"


def test_every_other_lie_in_the_replay_section_is_a_typed_error_before_anything_is_written(
    sandbox: Sandbox, book: ExecutionRecord, gguf: ExecutionRecord
) -> None:
    sandbox.snapshot()
    cases = list(_tweaks(book, gguf))
    assert len(cases) > 30
    for what, data, where in cases:
        raw = _raw(data)
        with pytest.raises(RecordFormatError) as info:
            ExecutionRecord.from_bytes(raw, source="t.json")
        assert info.value.path.startswith("t.json:") and info.value.path.endswith(where), (what, info.value.path)
        if what != "options not an object":
            with pytest.raises(RecordFormatError), materialized(ExecutionRecord(raw), sandbox.store):
                pass
    sandbox.assert_untouched()


def test_the_manifest_rule_matches_what_each_backend_records(sandbox: Sandbox) -> None:
    """The per-format key sets are what replay_spec() writes: a SentencePiece and a tiktoken model record, pass the
    check and replay identically (book and GGUF above; HF and Tekken in tests/records/test_record.py)."""
    import mistral_common

    spm = Path(mistral_common.__file__).resolve().parent / "data" / "mistral_instruct_tokenizer_240323.model.v3"
    manifests = {
        "spm": ({"format": "sentencepiece", "file": spm.name}, spm),
        "tik": ({"format": "tiktoken", "file": "qwen.tiktoken", "preset": "qwen"}, fetched.qwen_tiktoken_path()),
    }
    for directory, (tokenizer, source) in manifests.items():
        model_dir = sandbox.root / "models" / directory
        model_dir.mkdir(parents=True)
        shutil.copyfile(source, model_dir / tokenizer["file"])
        (model_dir / "ctxlock.json").write_text(json.dumps({"tokenizer": tokenizer}))
        rec = _recorded(sandbox.store, str(model_dir))
        assert set(rec.data["replay"]["files"]) == {tokenizer["file"]}
        result, _ = replay(load_record(rec.id, sandbox.store), sandbox.store)
        assert result.identical, result.to_dict()


def test_a_tokenizer_file_with_an_unportable_name_is_recorded_under_a_safe_one(sandbox: Sandbox) -> None:
    """So every record ctxlock writes is one it reads back: a GGUF saved as `模型.gguf` is recorded as model.gguf
    (a name with spaces and parentheses is kept), and both replay identically."""
    for name, recorded in (("模型.gguf", "model.gguf"), ("Llama 3 (1).gguf", "Llama 3 (1).gguf")):
        path = sandbox.root / "models" / name
        path.parent.mkdir(exist_ok=True)
        shutil.copyfile(fetched.gguf_path("llama-spm"), path)
        rec = _recorded(sandbox.store, str(path))
        assert set(rec.data["replay"]["files"]) == {recorded} and rec.data["replay"]["tokenizer"]["file"] == recorded
        again = load_record(rec.id, sandbox.store)
        result, _ = replay(again, sandbox.store)
        assert result.identical, result.to_dict()


# -- bounded reads ---------------------------------------------------------------------------------------------


def test_a_record_path_that_is_not_a_regular_file_is_a_typed_error(sandbox: Sandbox) -> None:
    fifo = sandbox.work / "fifo"
    os.mkfifo(fifo)
    folder = sandbox.work / "records"
    folder.mkdir()
    for spec in (str(fifo), str(folder), "/dev/zero", "/dev/null"):
        with pytest.raises(RecordFormatError) as info:
            load_record(spec, sandbox.store)
        assert info.value.path == spec and "not a regular file" in info.value.message


def test_record_size_is_capped_everywhere(
    sandbox: Sandbox, book: ExecutionRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert store_module.max_record_bytes() == store_module.MAX_RECORD_BYTES == 256 << 20
    size = len(book.body)
    monkeypatch.setenv("CTXLOCK_MAX_RECORD_BYTES", str(size - 1))
    path = sandbox.work / "rec.json"
    path.write_bytes(book.body)
    with pytest.raises(RecordFormatError) as info:
        load_record(str(path), sandbox.store)
    assert info.value.path == str(path) and "CTXLOCK_MAX_RECORD_BYTES" in info.value.hint
    with pytest.raises(RecordFormatError) as info:
        Store(sandbox.store_dir / "other").import_records(io.BytesIO(b"\n" + book.body), validate=_validate)
    assert info.value.path == "line 2"
    with pytest.raises(RecordFormatError):
        Store(sandbox.store_dir / "other").put_record(book.body, index=book.index())
    monkeypatch.setenv("CTXLOCK_MAX_RECORD_BYTES", str(size))  # the limit itself is allowed
    assert load_record(str(path), sandbox.store).id == book.id
    assert Store(sandbox.store_dir / "other").import_records(io.BytesIO(book.body), validate=_validate) == [book.id]
    for bad in ("lots", "0", "-5", "1e9"):
        monkeypatch.setenv("CTXLOCK_MAX_RECORD_BYTES", bad)
        with pytest.raises(CtxlockError) as info:
            store_module.max_record_bytes()
        assert info.value.path == "CTXLOCK_MAX_RECORD_BYTES"


def test_importing_an_endless_line_stops_at_the_cap(sandbox: Sandbox) -> None:
    """`records import /dev/zero` used to read until memory ran out; the child runs under a 3 GiB address-space
    limit so that the old behaviour fails quickly instead of exhausting the machine."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    # As a path, /dev/zero is refused at once (a device is not a record file); as stdin, the line cap stops it.
    p = _cli(sandbox, "records", "import", "/dev/zero", env={"CTXLOCK_MAX_RECORD_BYTES": "65536"}, preexec_fn=limit)
    _refused(p, "InputError")
    assert "/dev/zero" in p.stderr
    with open("/dev/zero", "rb") as zero:
        p = _cli(
            sandbox,
            "records",
            "import",
            "-",
            env={"CTXLOCK_MAX_RECORD_BYTES": "65536"},
            preexec_fn=limit,
            stdin=zero,
        )
    _refused(p)
    assert "line 1: the line is longer than the 65,536-byte record limit" in p.stderr


def test_deeply_nested_json_is_a_format_error_not_a_crash() -> None:
    for raw in (b"[" * 200_000, b'{"a":' * 200_000):
        with pytest.raises(RecordFormatError):
            ExecutionRecord.from_bytes(raw, source="t.json")
    with pytest.raises(RecordFormatError):
        canonical_bytes(_nested(5000))


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_materialized_refuses_bytes_that_are_not_a_record_and_odd_sections(
    sandbox: Sandbox, book: ExecutionRecord
) -> None:
    """An ExecutionRecord built straight from bytes (no parsing) still fails typed, and the sections replay only
    reads from (tokenizer.special_tokens, template.id) cannot crash it."""
    sandbox.snapshot()
    for raw in (b"not json\n", b"\xff\n", b"[]\n", b"{}\n"):
        with pytest.raises(RecordFormatError), materialized(ExecutionRecord(raw), sandbox.store):
            pass
    data = copy.deepcopy(book.data)
    data["tokenizer"] = {"special_tokens": ["<bos>"]}
    data["template"] = ["x"]
    with materialized(ExecutionRecord(_raw(data)), sandbox.store) as (model, template):
        assert model.tokenizer.format == "book" and template is not None
    sandbox.assert_untouched()
