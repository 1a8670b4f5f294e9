"""A real headless Chromium for the HTML reports: load a page, read its console, measure its
figures, sort a table, take full-page screenshots.

Driven by selenium (PyPI) through Debian's chromedriver and chromium (``apt-get install chromium
chromium-driver``; ``.ci/run`` installs them). Tests that use it carry
``needs(tool="chromium")`` and ``needs(tool="chromedriver")`` (tests/prereqs.py): skipped on a
machine without them, failed under CI.
"""

from __future__ import annotations

import base64
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PAGE_WIDTH_PX = 1200
"""Window width of the screenshots."""
MAX_SHOT_HEIGHT_PX = 16000
"""Tallest full-page screenshot (Chromium's texture limit is about 16k pixels)."""


@dataclass(kw_only=True)
class PageCheck:
    """What the browser saw of one page."""

    title: str
    """The document's title."""
    console: list[dict[str, Any]]
    """Console entries of level WARNING or SEVERE (errors, failed loads, script exceptions)."""
    images: list[dict[str, Any]]
    """Per ``<img>``: ``alt``, ``naturalWidth``, ``naturalHeight``, ``complete``."""
    resources: list[str]
    """URLs the page fetched (``performance`` resource entries): none for a self-contained
    page (data URIs are not fetched)."""
    tables: dict[str, list[list[str]]] = field(default_factory=dict)
    """Per table id: its rows as the reader sees them (header rows first), cell texts."""
    sorted_ok: bool = True
    """Clicking a numeric column's name sorted that table's body by it, ascending."""


def chrome() -> Any:
    """A headless Chromium driven through chromedriver."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        f"--window-size={PAGE_WIDTH_PX},900",
        "--hide-scrollbars",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=shutil.which("chromedriver") or "chromedriver")
    return webdriver.Chrome(options=options, service=service)


_TABLES_JS = """
var out = {};
document.querySelectorAll('table').forEach(function (t, i) {
  var rows = [];
  Array.prototype.forEach.call(t.rows, function (r) {
    rows.push(Array.prototype.map.call(r.cells, function (c) { return c.textContent.trim(); }));
  });
  out[t.id || ('table' + i)] = rows;
});
return out;
"""
_SORT_JS = """
var table = document.querySelector('table.booktabs');
if (!table || !table.tHead) { return true; }
var names = table.tHead.rows[table.tHead.rows.length - 1];
var th = null, column = -1;
Array.prototype.forEach.call(names.cells, function (c, i) {
  if (th === null && c.classList.contains('num') && c.classList.contains('sortable')) {
    th = c; column = i;
  }
});
if (th === null) { return true; }
th.click();
var values = Array.prototype.map.call(table.tBodies[0].rows, function (r) {
  return parseFloat(r.cells[column].textContent.replace(/,/g, ''));
}).filter(function (v) { return !isNaN(v); });
for (var i = 1; i < values.length; i++) { if (values[i] < values[i - 1]) { return false; } }
return th.getAttribute('aria-sort') === 'ascending';
"""


def check_page(driver: Any, page: Path, shot: Path | None = None) -> PageCheck:
    """Load ``page`` from disk and read what a reader would see.

    Args:
        driver: :func:`chrome`.
        page: the HTML file.
        shot: where to save a full-page PNG screenshot (None: none).

    Returns:
        What the browser saw.
    """
    driver.get_log("browser")  # drop entries of earlier pages
    driver.get(page.resolve().as_uri())
    driver.execute_script("return document.readyState")
    images = driver.execute_script(
        "return Array.prototype.map.call(document.images, function (im) { return {alt: im.alt, "
        "naturalWidth: im.naturalWidth, naturalHeight: im.naturalHeight, "
        "complete: im.complete}; });"
    )
    resources = driver.execute_script(
        "return performance.getEntriesByType('resource').map(function (e) { return e.name; });"
    )
    tables = driver.execute_script(_TABLES_JS)
    if shot is not None:
        save_screenshot(driver, shot)
    sorted_ok = bool(driver.execute_script(_SORT_JS))
    console = [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "WARNING")]
    return PageCheck(
        title=driver.title,
        console=console,
        images=images,
        resources=resources,
        tables=tables,
        sorted_ok=sorted_ok,
    )


def save_screenshot(driver: Any, path: Path) -> Path:
    """A full-page PNG (Chromium's DevTools ``Page.captureScreenshot`` beyond the viewport)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    height = min(height, MAX_SHOT_HEIGHT_PX)
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": PAGE_WIDTH_PX, "height": height, "deviceScaleFactor": 1, "mobile": False},
    )
    shot = driver.execute_cdp_cmd(
        "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}
    )
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))
    return path
