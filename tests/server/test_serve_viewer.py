"""The record viewer in a real browser: headless Chromium (Debian's `chromium` package, which `make test` installs)
through Playwright, on the page the real server serves. Asserts on the DOM and saves a screenshot (to the test's
temporary directory; with CTXLOCK_UPDATE_SCREENSHOT=1 to docs/serve-viewer.png, the one the README shows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from ctxlock.records import LAYERS
from serve_server import SRC, TOKEN, client, running, write_config

CHROMIUM = "/usr/bin/chromium"
SEED = Path(__file__).resolve().parents[2] / "examples" / "seed-sky-injection.json"
# The README's screenshot (docs/serve-viewer.png) is rewritten only on request (CTXLOCK_UPDATE_SCREENSHOT=1): the
# record id in its heading changes from run to run, and `make test` must leave the checkout clean.
DOCS_SHOT = Path(__file__).resolve().parents[2] / "docs" / "serve-viewer.png"
DOCS_DIFF_SHOT = DOCS_SHOT.with_name("serve-diff.png")


STORES: dict[str, Path] = {}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    root = tmp_path_factory.mktemp("viewer")
    with running(write_config(root, store=root / "store")) as url, client(url) as c:
        STORES[url] = root / "store"
        rendered = c.post("/v1/render?model=nemo&record=1", content=SEED.read_bytes()).json()
        yield url, rendered


def _changed_seed() -> bytes:
    """The seed with one word of its second user turn changed: the records diverge at the request."""
    body = json.loads(SEED.read_bytes())
    body["messages"][1]["content"] = body["messages"][1]["content"].replace("蓝色", "红色")
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


def test_the_viewer_in_headless_chromium(served: tuple[str, dict], tmp_path: Path) -> None:
    url, rendered = served
    shot = DOCS_SHOT if os.environ.get("CTXLOCK_UPDATE_SCREENSHOT") == "1" else tmp_path / "serve-viewer.png"
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(
                extra_http_headers={"Authorization": f"Bearer {TOKEN}"}, viewport={"width": 900, "height": 700}
            )
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.goto(f"{url}/records/{rendered['record_id']}/view")
            chips = page.locator("#tokens .chip")
            assert chips.count() == len(rendered["input_ids"])  # one chip per token
            ids = [int(x) for x in chips.evaluate_all("els => els.map(e => e.dataset.id)")]
            assert ids == rendered["input_ids"]
            marked = page.locator("#tokens .chip.neutralized")
            assert marked.count() > 0
            # Every marked chip lies inside a neutralized span of the request, and shows red.
            for path in marked.evaluate_all("els => els.map(e => e.dataset.path)"):
                assert path.startswith("messages[")
            colour = marked.first.evaluate("e => getComputedStyle(e).outlineColor")
            assert colour == "rgb(221, 0, 0)"
            title = chips.nth(2).get_attribute("title")
            assert title is not None and title.startswith(f"id {ids[2]} | bytes ")
            # The layer summary: one row per layer of the record, in the pipeline's order, with its digests.
            layers = page.locator("#layers tr").evaluate_all("els => els.map(e => e.dataset.layer)")
            assert layers == list(LAYERS)
            rendered_row = page.locator('#layers tr[data-layer="rendered"]').inner_text()
            assert "sha256 " in rendered_row
            controls = page.locator("#tokens .chip.k-control")
            assert controls.count() == len(rendered["control_tokens"])
            page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 900, "height": 420})
        finally:
            browser.close()
    assert requests == [f"{url}/records/{rendered['record_id']}/view"]  # the page loads nothing else
    assert 1_000 < shot.stat().st_size < 200_000


def test_the_diff_view_in_headless_chromium(served: tuple[str, dict], tmp_path: Path) -> None:
    url, a = served
    with client(url) as c:
        b = c.post("/v1/render?model=nemo&record=1", content=_changed_seed()).json()
        expected = c.post("/v1/diff", json={"a": a["record_id"], "b": b["record_id"]}).json()
    div, first = expected["first_divergence"], expected["ids"]["first_difference"]
    assert div is not None and first is not None
    page_url = f"{url}/diff/{a['record_id']}/{b['record_id']}/view"
    shot = DOCS_DIFF_SHOT if os.environ.get("CTXLOCK_UPDATE_SCREENSHOT") == "1" else tmp_path / "serve-diff.png"
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(
                extra_http_headers={"Authorization": f"Bearer {TOKEN}"}, viewport={"width": 1200, "height": 800}
            )
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.goto(page_url)
            banner = page.locator("#divergence")
            # The diff module's first divergence: its layer named, its cause shown.
            assert banner.get_attribute("data-layer") == div["layer"]
            assert banner.locator(".layer").inner_text() == div["layer"]
            assert banner.locator(".cause").inner_text() == div["cause"]
            assert f"first differing token: index {first}" in banner.inner_text()
            for side, rec in (("a", a), ("b", b)):
                column = page.locator(f"#side-{side} .chip")
                assert column.count() == len(rec["input_ids"])
                marked = page.locator(f"#side-{side} .chip.diverge")
                assert marked.count() == 1  # the first differing token, highlighted in both columns
                assert int(marked.get_attribute("data-id") or -1) == rec["input_ids"][first]
                assert column.nth(first).evaluate("e => e.classList.contains('diverge')")
                assert marked.evaluate("e => getComputedStyle(e).outlineColor") == "rgb(255, 102, 0)"
            assert a["input_ids"][:first] == b["input_ids"][:first] and a["input_ids"][first] != b["input_ids"][first]
            page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 1200, "height": 440})
        finally:
            browser.close()
    assert requests == [page_url]  # self-contained: nothing else is loaded
    assert 1_000 < shot.stat().st_size < 400_000
    # Without a token the page is 401, as every other view.
    with client(url, token=None) as anonymous:
        assert anonymous.get(f"/diff/{a['record_id']}/{b['record_id']}/view").status_code == 401

    # `ctxlock view A B -o page.html` writes the same page from the store.
    out, store = tmp_path / "diff.html", str(STORES[url])
    run = subprocess.run(
        [sys.executable, "-m", "ctxlock", "view", a["record_id"], b["record_id"], "-o", str(out), "--store", store],
        env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    text = out.read_text("utf-8")
    assert f'data-layer="{div["layer"]}"' in text and text.count("chip k-") >= len(a["input_ids"])
    assert "http://" not in text and "https://" not in text
