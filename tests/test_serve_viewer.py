"""The record viewer in a real browser: headless Chromium (Debian's `chromium` package, which `make test` installs)
through Playwright, on the page the real server serves. Asserts on the DOM and saves a screenshot (to the test's
temporary directory; with CTXLOCK_UPDATE_SCREENSHOT=1 to docs/serve-viewer.png, the one the README shows)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from serve_server import TOKEN, client, running, write_config

CHROMIUM = "/usr/bin/chromium"
SEED = Path(__file__).resolve().parents[1] / "examples" / "seed-sky-injection.json"
# The README's screenshot (docs/serve-viewer.png) is rewritten only on request (CTXLOCK_UPDATE_SCREENSHOT=1): the
# record id in its heading changes from run to run, and `make test` must leave the checkout clean.
DOCS_SHOT = Path(__file__).resolve().parents[1] / "docs" / "serve-viewer.png"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    root = tmp_path_factory.mktemp("viewer")
    with running(write_config(root, store=root / "store")) as url, client(url) as c:
        rendered = c.post("/v1/render?model=nemo&record=1", content=SEED.read_bytes()).json()
        yield url, rendered


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
            controls = page.locator("#tokens .chip.k-control")
            assert controls.count() == len(rendered["control_tokens"])
            page.screenshot(path=str(shot), clip={"x": 0, "y": 0, "width": 900, "height": 420})
        finally:
            browser.close()
    assert requests == [f"{url}/records/{rendered['record_id']}/view"]  # the page loads nothing else
    assert 1_000 < shot.stat().st_size < 200_000
