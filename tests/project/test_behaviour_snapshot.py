"""scripts/behaviour_snapshot.py's `compare` on two tiny captures (the capture itself runs for minutes: never here)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "behaviour_snapshot.py"


def _script():
    spec = importlib.util.spec_from_file_location("behaviour_snapshot", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


snapshot = _script()

CASES = {
    "cli/models.stdout": b'{\n  "models": ["mistral-nemo"]\n}\n',
    "cli/models.status": b"exit 0\n",
    "serve/tokenize/llamacpp.body": b'{"tokens":[1,22177]}',
}


def _capture(root: Path, cases: dict[str, bytes]) -> Path:
    for name, data in cases.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    index = {name: hashlib.sha256(data).hexdigest() for name, data in cases.items()}
    (root / "index.json").write_text(json.dumps(index), "utf-8")
    return root


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (None, None),
        (("serve/tokenize/llamacpp.body", b'{"tokens":[1,22178]}'), "first difference at byte 17, line 1"),
        (("cli/models.stdout", b'{\n  "models": ["mistral-nemo"]\n}\n\n'), "first difference at byte 33, line 4"),
        (("cli/extra.stdout", b""), "cli/extra.stdout: only in"),
    ],
    ids=["identical", "one-byte", "longer", "added"],
)
def test_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], change: tuple[str, bytes] | None, expected: str | None
) -> None:
    a = _capture(tmp_path / "a", CASES)
    b = _capture(tmp_path / "b", CASES if change is None else {**CASES, change[0]: change[1]})
    code = snapshot.compare(a, b)
    out = capsys.readouterr().out
    if change is None:
        assert code == 0
        assert out == f"identical: {len(CASES)} cases\n"
    else:
        assert code == 1
        assert f"{change[0]}: " in out and expected in out
        assert out.endswith(f"1 of {len(CASES | {change[0]: b''})} cases differ\n")


def test_normalise_keeps_ids_and_digests() -> None:
    """Only paths and clock readings are rewritten; a digest or an id next to them is kept byte for byte."""
    digest = "a7be11c961ea67ce4cf2ed548f19c2bb269d4f813a5fc9149064cd2d31951dd5"
    raw = json.dumps({"created_at": "2031-01-02T03:04:05+00:00", "id": digest, "store": f"{snapshot.WORK}/store"})
    assert (
        snapshot.normalise(raw.encode())
        == json.dumps({"created_at": "<TIME>", "id": digest, "store": "<WORK>/store"}).encode()
    )
