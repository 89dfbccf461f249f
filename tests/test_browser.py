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
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from jacap_lib.viz.style import METHOD_STYLES

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
  var STYLES = METHOD_COLOURS, RESULT_ID = 'RESULT_ID_HERE';
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
  function scroller(el) {  // the nearest ancestor (inside the column) that scrolls horizontally
    for (var a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      var ox = getComputedStyle(a).overflowX;
      if (ox === 'auto' || ox === 'scroll') return a;
      if (a.matches && a.matches('article, main')) return null;
    }
    return null;
  }
  var colourCache = {};
  function canon(c) {  // any CSS colour -> 'rgb(r, g, b)'
    if (typeof c !== 'string') return null;
    if (colourCache[c]) return colourCache[c];
    var d = document.createElement('div'); d.style.color = c; document.body.appendChild(d);
    var v = getComputedStyle(d).color; d.remove(); colourCache[c] = v; return v;
  }
  function traceColour(t) {
    var mode = t.mode || '';
    var c = (t.type === 'scatter' || t.type === 'scattergl') && mode.indexOf('lines') >= 0 && t.line ? t.line.color
            : (t.marker ? t.marker.color : null);
    return Array.isArray(c) ? null : c;
  }
  function tickValue(text) {  // the number a tick label states, or NaN
    var s = String(text).replace(/\\u2212/g, '-').replace(/[\\s,\\u2009\\u202f]/g, '');
    var m = /^(-?[\\d.]*)(?:\\u00d7|x)?10<sup>(-?\\d+)<\\/sup>$/.exec(s);
    if (m) return (m[1] === '' ? 1 : Number(m[1])) * Math.pow(10, Number(m[2]));
    if (!/^[-+]?(\\d+\\.?\\d*|\\.\\d+)(e[-+]?\\d+)?$/i.test(s)) return NaN;
    return Number(s);
  }
  function titleOf(gd, ax) {  // the title the figure gave an axis ('' if none; not plotly's placeholder)
    var t = gd.layout && gd.layout[ax._name] && gd.layout[ax._name].title;
    return typeof t === 'string' ? t : (t && t.text) || '';
  }
  function matchOf(gd, ax) {  // the axis this one was linked to (plotly drops the link when the types differ)
    return ax.matches || (gd.layout && gd.layout[ax._name] && gd.layout[ax._name].matches) || '';
  }
  function overlap(a, b) {
    var w = Math.min(a.right, b.right) - Math.max(a.left, b.left), h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
    return w > 1 && h > 1;
  }
  function figureChecks(figs, out) {
    out.colours = []; out.axis_types = []; out.log_ticks = []; out.legend_slider = []; out.clipped = []; out.outliers = [];
    figs.forEach(function (gd, k) {
      var L = gd._fullLayout, data = gd._fullData || [];
      if (!L) return;
      var given = gd.layout && gd.layout.title, text = typeof given === 'string' ? given : (given && given.text) || '';
      var tag = 'figure ' + k + (text ? ' ("' + String(text).replace(/<[^>]+>/g, ' ').slice(0, 40) + '")' : '');
      // one colour per method: the book's colour, and no two methods in one colour
      var owner = {};
      data.forEach(function (t) {
        var m = STYLES[t.legendgroup] ? t.legendgroup : (STYLES[t.name] ? t.name : null);
        if (!m) return;
        var c = canon(traceColour(t));
        if (c && c !== canon(STYLES[m])) out.colours.push(tag + ': ' + m + ' drawn in ' + c + ', the book gives it ' + canon(STYLES[m]));
        if (c && owner[c] && owner[c] !== m && canon(STYLES[owner[c]]) !== canon(STYLES[m]))
          out.colours.push(tag + ': ' + owner[c] + ' and ' + m + ' share the colour ' + c);
        if (c) owner[c] = owner[c] || m;
      });
      // axes that compare the same quantity (linked by `matches`, or the same title) share a type
      var axes = [];
      Object.keys(L).forEach(function (key) { if (/^[xy]axis\\d*$/.test(key) && L[key] && L[key]._id) axes.push(L[key]); });
      axes.forEach(function (a) {
        axes.forEach(function (b) {
          if (a._id >= b._id || a._id.charAt(0) !== b._id.charAt(0)) return;
          var ta = titleOf(gd, a), tb = titleOf(gd, b);
          var ma = matchOf(gd, a), mb = matchOf(gd, b);
          var same = ma === b._id || mb === a._id || (ma && ma === mb) || (ta && ta === tb);
          if (same && a.type !== b.type) out.axis_types.push(tag + ': ' + a._id + ' is ' + a.type + ', ' + b._id + ' is ' + b.type);
        });
        // tick labels state their value: on a log axis every label parses to the tick's value (no bare
        // "2 3 ... 9" digits, no SI suffixes); on any axis no small SI prefixes such as 1f, 1p, 100μ, 2m
        if (a.showticklabels === false) return;
        (a._vals || []).forEach(function (v) {
          var text = v.text == null ? '' : String(v.text);
          if (!text || v.minor) return;
          if (a.type === 'log') {
            var want = Math.pow(10, v.x), got = tickValue(text);
            if (!(Math.abs(got / want - 1) < 0.02)) out.log_ticks.push(tag + ': ' + a._id + ' label "' + text + '" at ' + want.toPrecision(3));
          } else if (a.type === 'linear' && /^[-\\u2212]?[\\d.]+\\s?[fpnμµum]$/.test(text)) {
            out.log_ticks.push(tag + ': ' + a._id + ' SI label "' + text + '"');
          }
        });
        // no few values flatten a panel: the middle 90% of the values must use more than 2% of the range
        if (a.type !== 'linear' && a.type !== 'log') return;
        var letter = a._id.charAt(0), vals = [];
        data.forEach(function (t) {
          if (t.visible !== true || (t[letter + 'axis'] || letter) !== a._id || !Array.isArray(t[letter])) return;
          if (t.type === 'heatmap' || t.type === 'table') return;
          t[letter].forEach(function (v) {
            if (typeof v === 'number' && isFinite(v) && (a.type === 'linear' || v > 0)) vals.push(a.type === 'log' ? Math.log10(v) : v);
          });
        });
        if (vals.length < 10 || !a.range) return;
        vals.sort(function (p, q) { return p - q; });
        var q05 = vals[Math.floor(0.05 * (vals.length - 1))], q95 = vals[Math.ceil(0.95 * (vals.length - 1))];
        var span = Math.abs(Number(a.range[1]) - Number(a.range[0]));
        if (span > 0 && (q95 - q05) < 0.02 * span && (vals[vals.length - 1] - q95 > 0.5 * span || q05 - vals[0] > 0.5 * span))
          out.outliers.push(tag + ': ' + a._id + ' range ' + span.toPrecision(3) + ' for the middle 90% spread ' + (q95 - q05).toPrecision(3));
      });
      // a legend clear of sliders and menus
      var legend = gd.querySelector('g.legend');
      if (legend) {
        var lr = legend.getBoundingClientRect();
        gd.querySelectorAll('g.slider-container, g.updatemenu-container').forEach(function (s) {
          if (lr.width > 0 && overlap(lr, s.getBoundingClientRect())) out.legend_slider.push(tag + ': the legend overlaps ' + s.getAttribute('class'));
        });
      }
      // titles (figure, subplot, axes) inside the figure, not clipped at its edge
      var svg = gd.querySelector('svg.main-svg');
      if (svg) {
        var sr = svg.getBoundingClientRect();
        gd.querySelectorAll('g.g-gtitle text, g.annotation text, g.g-xtitle text, g.g-ytitle text').forEach(function (t) {
          var r = t.getBoundingClientRect();
          if (!t.textContent || r.width === 0) return;
          if (r.left < sr.left - 1 || r.right > sr.right + 1 || r.top < sr.top - 1 || r.bottom > sr.bottom + 1)
            out.clipped.push(tag + ': "' + t.textContent.slice(0, 50) + '" runs past the figure\\'s edge');
        });
        var title = gd.querySelector('g.g-gtitle text');
        if (title && title.textContent) {
          var tr = title.getBoundingClientRect();
          gd.querySelectorAll('g.annotation text, g.legend, g.slider-container').forEach(function (a) {
            if (a.textContent && overlap(tr, a.getBoundingClientRect()))
              out.clipped.push(tag + ': the title overlaps "' + a.textContent.slice(0, 30) + '"');
          });
        }
      }
    });
  }
  function tokenWraps(column) {  // a table cell whose text breaks inside a token (a number or a word)
    var found = [];
    column.querySelectorAll('table td, table th').forEach(function (cell) {
      var walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (var node = walker.nextNode(); node; node = walker.nextNode()) {
        var re = /\\S+/g, m;
        while ((m = re.exec(node.data))) {
          // a number stays on one line; words may break only after a dash or slash ("quality–compression")
          var parts = /\\d/.test(m[0]) ? [m[0]] : m[0].match(/[^\\/\u2013\u2014-]+[\\/\u2013\u2014-]*|[\\/\u2013\u2014-]+/g);
          var at = m.index;
          for (var q = 0; q < parts.length; q++) {
            var r = document.createRange(); r.setStart(node, at); r.setEnd(node, at + parts[q].length);
            at += parts[q].length;
            var tops = {};
            Array.prototype.forEach.call(r.getClientRects(), function (b) { if (b.width > 0) tops[Math.round(b.top)] = 1; });
            if (Object.keys(tops).length > 1) { found.push(m[0].slice(0, 40)); break; }
          }
        }
      }
    });
    return found;
  }
  function localPaths() {  // absolute local paths anywhere in the page's text (figures included)
    var found = [], walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
    for (var node = walker.nextNode(); node; node = walker.nextNode()) {
      var p = node.parentElement;
      if (p && p.closest('script, style, noscript, #' + RESULT_ID)) continue;
      var m = /\\/(work|root|tmp|home)\\/[^\\s"']*/.exec(node.data);
      if (m) found.push(m[0].slice(0, 60));
    }
    return found;
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
      var box = el.tagName.toLowerCase() === 'table' ? scroller(el) : null;  // a wide table may scroll as a whole
      if (box) { el = box; inner = box; }
      var over = Math.max(el.scrollWidth - el.clientWidth, inner.getBoundingClientRect().right - right);
      if (box) over = box.getBoundingClientRect().right - right;
      if (over > 2) out.overflow.push(el.tagName.toLowerCase() + ' +' + Math.round(over) + 'px: ' +
                                      (el.textContent || '').replace(/\\s+/g, ' ').slice(0, 60));
    }
    out.nulls = [];
    figs.forEach(function (f, k) {
      f.querySelectorAll('svg text').forEach(function (t) {
        if (/\\bnull\\b/.test(t.textContent || '')) out.nulls.push('figure ' + k + ': ' + t.textContent.slice(0, 60));
      });
    });
    figureChecks(figs, out);
    out.token_wraps = tokenWraps(column);
    out.paths = localPaths();
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


# what each figure/table/text check of the probe reports (key of its JSON -> what it means)
CHECKS = {
    "colours": "a method drawn in a colour other than the book's (viz.style.METHOD_STYLES) or two methods in one colour",
    "axis_types": "panels comparing the same quantity on different axis types",
    "log_ticks": "tick labels that do not state their value (log '2 3 ... 9' digits, SI suffixes such as 1f, 100μ)",
    "outliers": "a panel flattened by a few extreme values",
    "legend_slider": "a legend overlapping a slider or menu",
    "clipped": "a title or label cut at the figure's edge, or a figure title over another label",
    "token_wraps": "a table cell that breaks a number or a word across lines",
    "paths": "an absolute local path in the page text",
}


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
    probe = (PROBE.replace("DEADLINE_MS", str(int((timeout - 10) * 1000)))
             .replace("METHOD_COLOURS", json.dumps({k: v[0] for k, v in METHOD_STYLES.items()}))
             .replace("RESULT_ID_HERE", RESULT_ID))
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
        for key, what in CHECKS.items():
            if r.get(key):
                failures.append(f"{page.name}: {what}: {r[key][:4]}")
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


def test_probe_finds_misleading_figures_tables_and_paths(tmp_path):
    """Each figure, table and text check can fail: a synthetic page with one fault per figure (a method in
    another method's colour, a log panel beside a linear one, unreadable log and SI ticks, an outlier that
    flattens a panel, a legend over a slider, a clipped title), a table cell that breaks a number, and a
    local path, plus figures made by the book's styling helper that must pass."""
    if _chromium() is None:
        pytest.skip("no chromium binary on PATH (Debian: apt-get install -y chromium); browser test skipped")
    import plotly
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    from jacap_lib.viz.style import finish

    blue = METHOD_STYLES["capkv"][0]
    figs = {}
    figs["colour"] = go.Figure([go.Scatter(x=[0, 1], y=[1, 2], name="jacap", line={"color": blue}),
                                go.Scatter(x=[0, 1], y=[2, 3], name="capkv", line={"color": blue}),
                                go.Scatter(x=[0, 1], y=[3, 4], name="tova", line={"color": METHOD_STYLES["tova"][0]})])
    mixed = make_subplots(rows=1, cols=2, shared_yaxes=True)
    mixed.add_trace(go.Scatter(x=[1, 2], y=[2, 8]), row=1, col=1)
    mixed.add_trace(go.Scatter(x=[1, 2], y=[3, 6]), row=1, col=2)
    mixed.update_yaxes(type="log", row=1, col=1).update_yaxes(type="linear", row=1, col=2)
    figs["axis types"] = mixed
    figs["digits"] = go.Figure(go.Scatter(x=[0, 1, 2, 3], y=[0.02, 0.05, 0.3, 0.9])).update_yaxes(type="log")
    figs["SI log"] = go.Figure(go.Scatter(x=[1e-15, 1e-12], y=[1, 2])).update_xaxes(type="log", exponentformat="SI")
    figs["SI linear"] = go.Figure(go.Scatter(x=[0, 1, 2], y=[1e-4, 3e-4, 5e-4]))
    figs["outlier"] = go.Figure(go.Box(y=[1 + 0.01 * i for i in range(50)] + [6300.0]))
    slid = go.Figure([go.Scatter(x=[0, 1], y=[0, 1], name=f"series {i}") for i in range(6)])
    slid.update_layout(legend={"orientation": "h", "y": -0.25, "x": 0}, height=380,
                       sliders=[{"steps": [{"label": str(i), "method": "restyle", "args": [{"y": [[0, i]]}]}
                                           for i in range(4)]}])
    figs["legend over slider"] = slid
    figs["clipped title"] = go.Figure(go.Scatter(x=[0, 1], y=[0, 1])).update_layout(
        title="a very long title " * 12, width=500)
    good = make_subplots(rows=1, cols=2, shared_yaxes=True, subplot_titles=["one panel", "another"])
    for col in (1, 2):
        for m, ys in (("jacap", [1e-3, 0.02, 4.0]), ("tova", [2e-3, 0.05, 9.0])):
            good.add_trace(go.Scatter(x=[0.5, 0.75, 0.9], y=ys, name=m, legendgroup=m, showlegend=col == 1), row=1, col=col)
    good.update_yaxes(type="log", row=1, col=1)  # finish() makes the matched panel log too
    good.update_layout(title="A figure made by the book's helper: it passes every check " * 2,
                       sliders=[{"steps": [{"label": str(i), "method": "restyle", "args": [{"visible": True}]}
                                           for i in range(2)]}],
                       legend={"orientation": "h", "y": -0.3})
    figs["good"] = finish(good)
    figs["good small"] = finish(go.Figure(go.Scatter(x=[1, 2, 3], y=[0.021, 0.05, 0.089], name="knorm"))
                                .update_yaxes(type="log"))
    names = list(figs)
    html = "".join(pio.to_html(f, include_plotlyjs=False, full_html=False) for f in figs.values())
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", tmp_path / "plotly.min.js")
    page = tmp_path / "figures.html"
    page.write_text(
        "<html><head><script src='plotly.min.js'></script></head><body><article class='bd-article' style='width:760px'>"
        + html + "<div class='cell_output'><div class='output text_html'><table>"
        "<tr><td style='width:40px;max-width:40px;overflow-wrap:anywhere'>0.1339/39127</td>"
        "<td style='width:40px;max-width:40px'>12 34 56 78 90</td>"
        "<td style='width:60px;max-width:60px'>quality\u2013compression</td></tr></table></div></div>"
        "<p>written to /work/runs/seed0/out.json</p></article></body></html>", encoding="utf-8")
    r = _probe_page(page, timeout=90.0)
    assert r["drawn"] == r["figures"] == len(figs), r
    assert not r["errors"] and not r["exception"], r

    def where(key):  # the synthetic figures each check reported
        return {names[int(re.match(r"figure (\d+)", msg).group(1))] for msg in r[key]}

    assert where("colours") == {"colour"}, r["colours"]
    assert any("jacap drawn in" in m for m in r["colours"]) and any("share the colour" in m for m in r["colours"])
    assert not any("tova" in m for m in r["colours"]), r["colours"]
    assert where("axis_types") == {"axis types"}, r["axis_types"]
    assert where("log_ticks") == {"digits", "SI log", "SI linear"}, r["log_ticks"]
    assert any('"1f"' in m for m in r["log_ticks"]) and any('"100μ"' in m for m in r["log_ticks"]), r["log_ticks"]
    assert where("outliers") == {"outlier"}, r["outliers"]
    assert where("legend_slider") == {"legend over slider"}, r["legend_slider"]
    assert where("clipped") == {"clipped title"}, r["clipped"]
    assert r["token_wraps"] == ["0.1339/39127"], r["token_wraps"]
    assert r["paths"] == ["/work/runs/seed0/out.json"], r["paths"]
