"""Load every page of the built book in headless Chromium, offline, and check what a reader sees.

For each page: every plotly figure drew (``svg.main-svg`` inside each ``.plotly-graph-div``), math
was typeset by the vendored MathJax (``mjx-container``, no ``mjx-merror``), a slider step
changes its figure, and nothing reported an error (``window.onerror``, unhandled rejections,
``console.error``, failed script/style/image loads). A screenshot per page goes to
``_build/screenshots/``.

Every wait is for a condition (MathJax done, every figure drawn, the moved slider's figure changed) under one
overall deadline per page; there are no fixed sleeps. The site is built with ``python -m jacap_lib.book build`` unless ``JACAP_BOOK_SITE`` names an
already built ``_build/html``. DNS is mapped to nothing, so any CDN request fails and is caught.
Skipped, with a message, only where no chromium binary exists (CI installs it: ``apt-get install chromium``).
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
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

# Injected at the end of <body>: wait for conditions (MathJax done, every figure drawn, the moved slider's
# figure changed), each bounded by one overall deadline, then report as JSON. No fixed sleeps: every wait
# polls its condition (every 50 ms) and ends as soon as it holds.
PROBE = """<script>
(function () {
  var deadline = Date.now() + DEADLINE_MS;
  function until(cond) {  // true as soon as cond() holds, false at the overall deadline
    return new Promise(function (resolve) {
      (function check() {
        var ok = false;
        try { ok = cond(); } catch (e) { ok = false; }
        if (ok) { resolve(true); } else if (Date.now() >= deadline) { resolve(false); } else { setTimeout(check, 50); }
      })();
    });
  }
  function figures() { return document.querySelectorAll('.plotly-graph-div'); }
  function allDrawn() {
    var f = figures();
    for (var i = 0; i < f.length; i++) { if (!f[i].querySelector('svg.main-svg')) return false; }
    return true;
  }
  async function probe() {
    var out = {errors: null, figures: 0, drawn: 0, math_nodes: 0, mjx: 0, mjx_errors: 0, slider: null, exception: null,
               waited: {}};
    try {
    var t0 = Date.now();
    if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
      var done = false;
      MathJax.startup.promise.then(function () { done = true; }, function () { done = true; });
      out.waited.mathjax = await until(function () { return done; });
    }
    out.math_nodes = document.querySelectorAll('.math').length;
    if (out.math_nodes) {
      out.waited.math_typeset = await until(function () { return document.querySelectorAll('mjx-container').length > 0; });
    }
    out.waited.figures = await until(allDrawn);
    var figs = figures();
    out.figures = figs.length;
    figs.forEach(function (f) { if (f.querySelector('svg.main-svg')) out.drawn += 1; });
    out.mjx = document.querySelectorAll('mjx-container').length;
    out.mjx_errors = document.querySelectorAll('mjx-merror').length;
    for (var i = 0; i < figs.length; i++) {
      var rail = figs[i].querySelector('rect.slider-rail-touch-rect');
      if (!rail) continue;
      var fig = figs[i];
      var before = fig.querySelector('svg.main-svg').innerHTML;
      var box = rail.getBoundingClientRect();
      var opts = {bubbles: true, cancelable: true, view: window, button: 0,
                  clientX: box.left + box.width - 3, clientY: box.top + box.height / 2};
      rail.dispatchEvent(new MouseEvent('mousedown', opts));
      window.dispatchEvent(new MouseEvent('mouseup', opts));
      document.dispatchEvent(new MouseEvent('mouseup', opts));
      var changed = await until(function () { return fig.querySelector('svg.main-svg').innerHTML !== before; });
      out.slider = {figure: i, changed: changed};
      break;
    }
    // readable: no output, table or display equation wider than the text column (code *inputs* may
    // scroll), and no literal "null" in any figure's text (a None in a label or a padding cell)
    var column = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
    var right = column.getBoundingClientRect().right;
    out.overflow = [];
    var wide = document.querySelectorAll('div.cell_output pre, div.cell_output table, div.output pre, ' +
                                         'div.output table, mjx-container[display="true"]');
    for (var j = 0; j < wide.length; j++) {
      var el = wide[j];
      var inner = el.tagName.toLowerCase() === 'mjx-container' && el.firstElementChild ? el.firstElementChild : el;
      var over = Math.max(el.scrollWidth - el.clientWidth, inner.getBoundingClientRect().right - right);
      if (over > 2) out.overflow.push(el.tagName.toLowerCase() + ' +' + Math.round(over) + 'px: ' +
                                      (el.textContent || '').replace(/\\s+/g, ' ').slice(0, 60));
    }
    out.nulls = [];
    figs.forEach(function (f, k) {
      f.querySelectorAll('svg text').forEach(function (t) {
        if (/\\bnull\\b/.test(t.textContent || '')) out.nulls.push('figure ' + k + ': ' + t.textContent.slice(0, 60));
      });
    });
    out.waited.ms = Date.now() - t0;
    } catch (e) { out.exception = String(e && e.stack || e); }
    out.errors = window.__jacapErrors;
    var pre = document.createElement('pre'); pre.id = '""" + RESULT_ID + """';
    pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
  }
  if (document.readyState === 'complete') { probe(); } else { window.addEventListener('load', function () { probe(); }); }
})();
</script>"""

# What the test waits for on the Python side: the probe's report, read by a promise that resolves when it
# appears (the DevTools call itself waits; no polling loop with sleeps here).
AWAIT_RESULT = """new Promise(function (resolve) {
  (function check() {
    var e = document.getElementById('""" + RESULT_ID + """');
    if (e && location.href === HREF) { resolve(e.textContent); } else { setTimeout(check, 50); }
  })();
})"""


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


class _DevTools:
    """Headless chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    the browser reads NUL-terminated JSON commands on fd 3 and answers on fd 4), so the test waits
    in real time for the page's probe instead of guessing a virtual-time budget."""

    def __init__(self, profile: str):
        cmd_r, self._cmd_w = os.pipe()
        self._evt_r, evt_w = os.pipe()

        def wire_fds():  # runs in the child between fork and exec
            a, b = os.dup(cmd_r), os.dup(evt_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([_chromium(), *_flags(profile), "--remote-debugging-pipe", "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     close_fds=False, preexec_fn=wire_fds)
        os.close(cmd_r)
        os.close(evt_w)
        self._buf, self._next_id = b"", 0
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": 1280, "height": 1800, "deviceScaleFactor": 1, "mobile": False}, session=True)

    def call(self, method: str, params: dict | None = None, *, session: bool = False, timeout: float = 60.0) -> dict:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._evt_r], [], [], left)[0]:
                raise TimeoutError(f"chromium did not answer {method} within {timeout:.0f} s")
            chunk = os.read(self._evt_r, 1 << 20)
            if not chunk:
                err = self.proc.stderr.read().decode(errors="replace")[-800:] if self.proc.poll() is not None else ""
                raise RuntimeError(f"chromium closed the DevTools pipe during {method} ({err})")
            self._buf += chunk

    def evaluate(self, expression: str):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        return r.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._evt_r)
        self.proc.stderr.close()


def _probe_page(page: Path, screenshot: Path | None = None, timeout: float = 120.0) -> dict:
    """Load the page with the recorder and the probe injected and wait for the probe's report; one
    overall deadline of ``timeout`` s covers loading, MathJax, the figures and the slider (the probe gets
    all but 10 s of it). Optionally save a screenshot of the finished page."""
    deadline = time.monotonic() + timeout
    text = page.read_text(encoding="utf-8")
    probe = PROBE.replace("DEADLINE_MS", str(int((timeout - 10) * 1000)))
    text = text.replace("<head>", "<head>" + RECORDER, 1).replace("</body>", probe + "</body>", 1)
    probe_file = page.with_name(f".__probe_{page.name}")
    probe_file.write_text(text, encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            browser = _DevTools(profile)
            try:
                url = probe_file.as_uri()
                browser.call("Page.navigate", {"url": url}, session=True)
                expression = AWAIT_RESULT.replace("HREF", json.dumps(url))
                result = None
                while result is None:
                    left = deadline - time.monotonic()
                    assert left > 0, f"{page.name}: the probe did not report within {timeout:.0f} s"
                    try:  # the promise resolves when the report is in the page (the call waits for it)
                        r = browser.call("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                              "returnByValue": True}, session=True, timeout=left)
                    except RuntimeError as err:  # evaluated in about:blank and torn down by the navigation
                        if "context" not in str(err).lower():
                            raise
                        continue
                    result = r.get("result", {}).get("value")
                if screenshot is not None:
                    browser.evaluate("window.scrollTo(0, 0)")
                    shot = browser.call("Page.captureScreenshot", {"format": "png"}, session=True)
                    screenshot.parent.mkdir(parents=True, exist_ok=True)
                    screenshot.write_bytes(base64.b64decode(shot["data"]))
            finally:
                browser.close()
    finally:
        probe_file.unlink(missing_ok=True)
    return json.loads(result)


def test_every_page_renders_offline(site):
    pages = _pages(site)
    names = {p.stem for p in pages}
    assert set(THEORY_PAGES) <= names, f"theory pages missing from the site: {set(THEORY_PAGES) - names}"
    shots = site.parent / "screenshots"
    failures, sliders_moved = [], 0
    for page in pages:
        shot = shots / f"{page.stem}.png"
        r = _probe_page(page, screenshot=shot)
        if not (shot.is_file() and shot.stat().st_size > 10_000):
            failures.append(f"{page.name}: no screenshot")
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
        if r.get("overflow"):
            failures.append(f"{page.name}: wider than the column: {r['overflow'][:3]}")
        if r.get("nulls"):
            failures.append(f"{page.name}: 'null' in figure text: {r['nulls'][:3]}")
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
    assert not failures, "\n".join(failures)
    assert sliders_moved >= len(THEORY_PAGES)


def test_probe_finds_overflow_and_null_text(tmp_path):
    """The readability checks can fail: a printed line wider than the column and a figure whose text
    says "null" are both reported (a synthetic page, no book build needed)."""
    if _chromium() is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium); browser test skipped")
    page = tmp_path / "wide.html"
    page.write_text(
        "<html><head></head><body><article class='bd-article' style='width:600px'>"
        "<div class='cell_output'><pre>" + "x" * 400 + "</pre></div>"
        "<div class='cell_output'><pre>short</pre></div>"
        "<div class='plotly-graph-div'><svg class='main-svg'><text>null</text><text>ok</text></svg></div>"
        "</article></body></html>", encoding="utf-8")
    r = _probe_page(page, timeout=60.0)
    assert len(r["overflow"]) == 1 and r["overflow"][0].startswith("pre +"), r["overflow"]
    assert r["nulls"] == ["figure 0: null"], r["nulls"]
