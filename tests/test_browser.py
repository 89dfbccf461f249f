"""Load every page of the built book in headless Chromium, offline, and check what a reader sees.

For each page: every plotly figure drew (``svg.main-svg`` inside each ``.plotly-graph-div``), math
was typeset by the vendored MathJax (``mjx-container``, no ``mjx-merror``), a slider step
changes its figure, and nothing reported an error (``window.onerror``, unhandled rejections,
``console.error``, failed script/style/image loads). A screenshot per page goes to
``_build/screenshots/``.

The site is built with ``python -m jacap_lib.book build`` unless ``JACAP_BOOK_SITE`` names an
already built ``_build/html``. DNS is mapped to nothing, so any CDN request fails and is caught.
Skipped, with a message, only where no chromium binary exists (CI installs it: ``apt-get install chromium``).
"""
from __future__ import annotations

import html as html_lib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.book]

ROOT = Path(__file__).resolve().parents[1]
THEORY_PAGES = ["00_preface_kv_memory", "01_softmax_jacobian", "02_capacity", "03_leverage_2d"]
RESULT_ID = "jacap-browser-result"

# Injected first in <head>: record every error before any page script runs.
RECORDER = """<script>
window.__jacapErrors = [];
window.addEventListener('error', function (e) {
  var t = e.target;
  if (t && t !== window && (t.src || t.href)) { window.__jacapErrors.push('failed to load ' + (t.src || t.href)); }
  else { window.__jacapErrors.push('error: ' + (e.message || e)); }
}, true);
window.addEventListener('unhandledrejection', function (e) { window.__jacapErrors.push('unhandled rejection: ' + e.reason); });
(function () { var orig = console.error; console.error = function () {
  window.__jacapErrors.push('console.error: ' + Array.prototype.join.call(arguments, ' ')); return orig.apply(console, arguments); }; })();
</script>"""

# Injected at the end of <body>: wait for MathJax and plotly, move one slider, report as JSON.
PROBE = """<script>
(function () {
  function sleep(ms) { return new Promise(function (r) { setTimeout(r, ms); }); }
  async function probe() {
    var out = {errors: null, figures: 0, drawn: 0, math_nodes: 0, mjx: 0, mjx_errors: 0, slider: null, exception: null};
    try {
    await sleep(1500);
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) { try { await MathJax.startup.promise; } catch (e) {} }
    await sleep(1500);
    var figs = document.querySelectorAll('.plotly-graph-div');
    out.figures = figs.length;
    figs.forEach(function (f) { if (f.querySelector('svg.main-svg')) out.drawn += 1; });
    out.math_nodes = document.querySelectorAll('.math').length;
    out.mjx = document.querySelectorAll('mjx-container').length;
    out.mjx_errors = document.querySelectorAll('mjx-merror').length;
    for (var i = 0; i < figs.length; i++) {
      var rail = figs[i].querySelector('rect.slider-rail-touch-rect');
      if (!rail) continue;
      var before = figs[i].querySelector('svg.main-svg').innerHTML;
      var box = rail.getBoundingClientRect();
      var opts = {bubbles: true, cancelable: true, view: window, button: 0,
                  clientX: box.left + box.width - 3, clientY: box.top + box.height / 2};
      rail.dispatchEvent(new MouseEvent('mousedown', opts));
      window.dispatchEvent(new MouseEvent('mouseup', opts));
      document.dispatchEvent(new MouseEvent('mouseup', opts));
      await sleep(1500);
      out.slider = {figure: i, changed: figs[i].querySelector('svg.main-svg').innerHTML !== before};
      break;
    }
    } catch (e) { out.exception = String(e && e.stack || e); }
    out.errors = window.__jacapErrors;
    var pre = document.createElement('pre'); pre.id = '""" + RESULT_ID + """';
    pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
  }
  window.addEventListener('load', function () { probe(); });
})();
</script>"""


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _flags(profile: str) -> list[str]:
    return ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
            "--host-resolver-rules=MAP * ~NOTFOUND", "--allow-file-access-from-files",
            f"--user-data-dir={profile}", "--window-size=1280,1800"]


@pytest.fixture(scope="module")
def site() -> Path:
    if _chromium() is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium); browser test skipped")
    given = os.environ.get("JACAP_BOOK_SITE")
    if given:
        path = Path(given).resolve()
        if not (path / "book" / "index.html").is_file():
            raise ValueError(f"JACAP_BOOK_SITE={given} is not a built site (no book/index.html there)")
        return path
    rc = subprocess.call([sys.executable, "-m", "jacap_lib.book", "build"], cwd=ROOT)
    assert rc == 0, "the book build failed; see its output above"
    return ROOT / "_build" / "html"


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in (site / "book").glob("*.html") if not p.name.startswith(".__"))


def _probe_page(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    text = text.replace("<head>", "<head>" + RECORDER, 1).replace("</body>", PROBE + "</body>", 1)
    probe_file = page.with_name(f".__probe_{page.name}")
    probe_file.write_text(text, encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            proc = subprocess.run([_chromium(), *_flags(profile), "--virtual-time-budget=30000", "--dump-dom",
                                   probe_file.as_uri()], capture_output=True, text=True, timeout=180)
    finally:
        probe_file.unlink(missing_ok=True)
    m = re.search(f'<pre id="{RESULT_ID}">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"{page.name}: the probe never reported (chromium stderr tail: {proc.stderr[-800:]})"
    return json.loads(html_lib.unescape(m.group(1)))


def _screenshot(page: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([_chromium(), *_flags(profile), "--virtual-time-budget=20000", "--hide-scrollbars",
                        f"--screenshot={target}", page.as_uri()], capture_output=True, timeout=180)
    assert target.is_file() and target.stat().st_size > 10_000, f"no screenshot of {page.name}"


def test_every_page_renders_offline(site):
    pages = _pages(site)
    names = {p.stem for p in pages}
    assert set(THEORY_PAGES) <= names, f"theory pages missing from the site: {set(THEORY_PAGES) - names}"
    shots = site.parent / "screenshots"
    failures, sliders_moved = [], 0
    for page in pages:
        r = _probe_page(page)
        if r["exception"]:
            failures.append(f"{page.name}: the probe raised {r['exception']}")
        if r["errors"]:
            failures.append(f"{page.name}: errors {r['errors'][:5]}")
        if r["drawn"] != r["figures"]:
            failures.append(f"{page.name}: {r['drawn']} of {r['figures']} plotly figures drew svg.main-svg")
        if r["math_nodes"] and not r["mjx"]:
            failures.append(f"{page.name}: {r['math_nodes']} math nodes but no MathJax output")
        if r["mjx_errors"]:
            failures.append(f"{page.name}: {r['mjx_errors']} MathJax errors")
        if r["slider"] is not None:
            if r["slider"]["changed"]:
                sliders_moved += 1
            else:
                failures.append(f"{page.name}: moving the slider of figure {r['slider']['figure']} changed nothing")
        if page.stem in THEORY_PAGES:
            if r["figures"] == 0 or r["slider"] is None:
                failures.append(f"{page.name}: a theory page needs a figure with a slider (figures={r['figures']})")
            if r["mjx"] == 0:
                failures.append(f"{page.name}: a theory page without rendered math")
        _screenshot(page, shots / f"{page.stem}.png")
    assert not failures, "\n".join(failures)
    assert sliders_moved >= len(THEORY_PAGES)
