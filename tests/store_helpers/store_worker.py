"""A separate process that writes to a ctxlock Store, for tests/records/test_store.py's concurrency and kill -9 tests.

    store_worker.py batch ROOT TAG N [PAUSE]
                                          print "ready", wait for "go" on stdin, write N records (sleeping PAUSE s
                                          after each, like a caller that records once per model call), print "done N"
    store_worker.py loop ROOT TAG         write records forever; after each commit returns print "R <id> <n>"
                                          (and after every 5th, an artifact: "A <sha256> <n>"); killed by the test
    store_worker.py artifact ROOT FILE K  print "ready", wait for "go" on stdin, put FILE K times, print "A <sha256>"

Every line is flushed as soon as it is printed, so the parent sees exactly what was committed before a kill.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

RECORD_FORMAT = "ctxlock.record/1"


def make_record(tag: str, n: int) -> bytes:
    """The canonical bytes of test record `n` of writer `tag`: one line of sorted-key JSON ending in a newline."""
    obj = {"format": RECORD_FORMAT, "model": f"model-{tag}", "n": n, "input_tokens": n % 97, "writer": tag}
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def record_index(body: bytes) -> dict[str, str | int | None]:
    obj = json.loads(body)
    return {"format": obj["format"], "model": obj.get("model"), "input_tokens": obj.get("input_tokens")}


def make_artifact(tag: str, n: int) -> bytes:
    """64 KiB of bytes that depend on (tag, n)."""
    seed = hashlib.sha256(f"{tag}/{n}".encode()).digest()
    return seed * (65536 // len(seed))


def main(argv: list[str]) -> int:
    from ctxlock.records._store import Store

    mode, root = argv[0], Path(argv[1])
    store = Store(root)
    if mode == "batch":
        tag, count = argv[2], int(argv[3])
        pause = float(argv[4]) if len(argv) > 4 else 0.0
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        for n in range(count):
            body = make_record(tag, n)
            store.put_record(body, index=record_index(body))
            if pause:
                time.sleep(pause)
        print(f"done {count}", flush=True)
    elif mode == "loop":
        tag = argv[2]
        store.list_records(limit=1)  # open the store (and migrate) before the parent starts its kill timer
        print("ready", flush=True)
        n = 0
        while True:
            body = make_record(tag, n)
            record_id = store.put_record(body, index=record_index(body))
            print(f"R {record_id} {n}", flush=True)
            if n % 5 == 0:
                print(f"A {store.put_artifact(make_artifact(tag, n))} {n}", flush=True)
            n += 1
    elif mode == "artifact":
        path, times = Path(argv[2]), int(argv[3])
        print("ready", flush=True)
        if sys.stdin.readline().strip() != "go":
            return 2
        shas = {store.put_artifact_file(path) for _ in range(times)}
        print("A " + " ".join(sorted(shas)), flush=True)
    else:
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
