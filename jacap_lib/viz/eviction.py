"""One eviction of the whole model as a self-contained HTML page (plain HTML, CSS and a little JavaScript;
no network, no plotly.js: the file opens offline in any browser).

:func:`to_html` writes what an :class:`~jacap_lib.measure.eviction.EvictionInspection` recorded:

* a layer x KV-head grid. With no tokens selected, each cell is the overlap (Jaccard index) of that head's
  kept-by-score tokens with the shown head's, so heads that agree stand out; with tokens selected (click a
  token, shift-click another to select the range between), each cell is the fraction of the selection that
  head keeps (by score or protected). Click a cell to show that head;
* the prompt as the shown head sees it: every token coloured by its status - kept by score, protected (kept
  whatever its score: sinks and recent window) or evicted - with its position, status and score on hover;
* a status map: one row per (layer, head), one column per token, the same colours, for the whole model
  at once (click a row to show that head).

The page also works without JavaScript for the first shown head (the grid, legend and its text are
written out; only the interaction needs a script).

:data:`INSPECT` is the job ``jacap inspect`` (:class:`jacap_lib.experiments.job.Job`): one inspection printed
(``--layer``/``--head``: the marked text of :meth:`~jacap_lib.measure.eviction.EvictionInspection.view`)
and drawn (``--html``: :func:`to_html`); ``--kl-table`` runs :func:`jacap_lib.experiments.live.write_kl_table`.
It lives here, with the drawing, because a job of :mod:`jacap_lib.results` may not import this layer.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from jacap_lib.experiments import job as J

__all__ = ["STATUS_COLOURS", "eviction_html", "to_html", "INSPECT"]

# background colour per status (text view and status map); evicted text is drawn in grey on no background
STATUS_COLOURS = {"kept": "#a1d99b", "protected": "#9ecae1", "evicted": "#eeeeee"}
_STATUSES = ("evicted", "kept", "protected")  # the codes of EvictionInspection.status

_CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.05em; margin-top: 1.4em; }
pre.summary { background: #f6f6f6; padding: .6em; white-space: pre-wrap; }
.legend span { padding: 1px 6px; margin-right: 1em; border-radius: 3px; }
table.grid { border-collapse: collapse; font-size: 12px; }
table.grid td, table.grid th { border: 1px solid #ddd; padding: 2px 5px; text-align: right; min-width: 2.6em; }
table.grid td { cursor: pointer; } table.grid td.shown { outline: 2px solid #d62728; }
.tokens { line-height: 1.9; white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px; }
.tokens span { border-radius: 2px; cursor: pointer; }
.tokens .s0 { color: #8a8a8a; } .tokens .s1 { background: %(kept)s; } .tokens .s2 { background: %(protected)s; }
.tokens span.sel { outline: 2px solid #d62728; }
canvas { border: 1px solid #ddd; cursor: pointer; image-rendering: pixelated; }
""" % STATUS_COLOURS

_JS = r"""
const D = JSON.parse(document.getElementById("eviction-data").textContent);
const N = D.tokens.length;
let shown = [D.layer, D.head], sel = null, anchor = null;
const key = (l, h) => l + "," + h;
function kept(l, h, i) { return D.status[key(l, h)][i] !== "0"; }
function byScore(l, h) { const s = D.status[key(l, h)]; const out = new Set();
  for (let i = 0; i < N; i++) if (s[i] === "1") out.add(i); return out; }
function colour(v) { const a = [255, 255, 255], b = [84, 39, 143];
  return "rgb(" + a.map((x, k) => Math.round(x + (b[k] - x) * v)).join(",") + ")"; }
function drawGrid() {
  const ref = byScore(shown[0], shown[1]);
  document.getElementById("grid-mode").textContent = sel === null
    ? "overlap (Jaccard index) of each head's kept-by-score tokens with layer " + shown[0] + ", head " + shown[1] + "'s"
    : "fraction of the selected tokens (positions " + sel[0] + "-" + sel[1] + ") each head keeps";
  for (let l = 0; l < D.n_layers; l++) for (let h = 0; h < D.n_heads; h++) {
    let v;
    if (sel === null) { const s = byScore(l, h); let inter = 0; s.forEach(i => { if (ref.has(i)) inter++; });
      const union = s.size + ref.size - inter; v = union ? inter / union : 1; }
    else { let k = 0; for (let i = sel[0]; i <= sel[1]; i++) if (kept(l, h, i)) k++; v = k / (sel[1] - sel[0] + 1); }
    const td = document.getElementById("cell-" + l + "-" + h);
    td.textContent = v.toFixed(2); td.style.background = colour(v); td.style.color = v > 0.55 ? "#fff" : "#222";
    td.className = (l === shown[0] && h === shown[1]) ? "shown" : "";
  }
}
function drawText() {
  const [l, h] = shown, s = D.status[key(l, h)], sc = D.score ? D.score[key(l, h)] : null;
  document.getElementById("text-title").textContent = "Layer " + l + ", KV head " + h + ": " + D.counts[key(l, h)];
  const box = document.getElementById("tokens"); box.textContent = "";
  for (let i = 0; i < N; i++) {
    const span = document.createElement("span"); span.className = "s" + s[i];
    if (sel !== null && i >= sel[0] && i <= sel[1]) span.className += " sel";
    span.textContent = D.tokens[i];
    span.title = "#" + i + " " + JSON.stringify(D.tokens[i]) + " - " + D.names[+s[i]] + (sc ? ", score " + sc[i] : "");
    span.onclick = (ev) => { if (ev.shiftKey && anchor !== null) sel = [Math.min(anchor, i), Math.max(anchor, i)];
      else { sel = [i, i]; anchor = i; } drawAll(); };
    box.appendChild(span);
  }
}
function drawMap() {
  const c = document.getElementById("map"), w = Math.max(1, Math.floor(1000 / N)), rh = 4;
  c.width = N * w; c.height = D.n_layers * D.n_heads * rh; const g = c.getContext("2d");
  for (let l = 0; l < D.n_layers; l++) for (let h = 0; h < D.n_heads; h++) {
    const s = D.status[key(l, h)], y = (l * D.n_heads + h) * rh;
    for (let i = 0; i < N; i++) { g.fillStyle = D.colours[+s[i]]; g.fillRect(i * w, y, w, rh); }
  }
  g.strokeStyle = "#d62728"; g.strokeRect(0.5, (shown[0] * D.n_heads + shown[1]) * rh + 0.5, c.width - 1, rh - 1);
  c.onclick = (ev) => { const r = Math.floor(ev.offsetY / rh * (c.height / c.clientHeight));
    shown = [Math.floor(r / D.n_heads), r % D.n_heads]; drawAll(); };
}
function drawAll() { drawGrid(); drawText(); drawMap(); }
for (let l = 0; l < D.n_layers; l++) for (let h = 0; h < D.n_heads; h++)
  document.getElementById("cell-" + l + "-" + h).onclick = () => { shown = [l, h]; drawAll(); };
document.getElementById("clear").onclick = () => { sel = null; anchor = null; drawAll(); };
drawAll();
"""


def _script_json(obj) -> str:
    """JSON safe inside a ``<script>`` element (no ``</script>``, ``<!--`` or ``&`` can end or bend it)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _counts(insp) -> dict:
    n_scored, n_prot = insp.n_scored, insp.n_protected
    return {f"{l},{h}": f"{int(n_scored[l, h])} kept by score + {int(n_prot[l, h])} protected of "
                        f"{insp.n_tokens} tokens" for l in range(insp.n_layers) for h in range(insp.n_heads)}


def eviction_html(insp, layer: int = 0, head: int = 0, *, title: str | None = None) -> str:
    """The HTML page of :func:`to_html` as a string (``layer``/``head``: the head shown first)."""
    insp.check_head(layer, head)
    L, H = insp.n_layers, insp.n_heads
    status = insp.status
    data = {
        "n_layers": L, "n_heads": H, "layer": layer, "head": head, "tokens": list(insp.tokens),
        "names": list(_STATUSES), "colours": [STATUS_COLOURS[n] for n in _STATUSES],
        "status": {f"{l},{h}": "".join(str(c) for c in status[l, h].tolist()) for l in range(L) for h in range(H)},
        "counts": _counts(insp),
        "score": None if insp.score is None else {
            f"{l},{h}": [float(f"{v:.4g}") for v in insp.score[l, h].tolist()] for l in range(L) for h in range(H)},
    }
    title = title or f"Eviction by {insp.method} at c = {insp.compression_ratio:g}" + (
        f" on {insp.model}" if insp.model else "")
    e = html.escape
    # the grid, written out (the script recolours it); first values: overlap with the first shown head
    kept_by_score = insp.kept_mask & ~insp.protected_mask
    ref = kept_by_score[layer, head]
    inter = (kept_by_score & ref).sum(-1).float()
    union = (kept_by_score | ref).sum(-1).float()
    import torch

    jac = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))
    rows = ["<tr><th>layer \\ head</th>" + "".join(f"<th>{h}</th>" for h in range(H)) + "</tr>"]
    for l in range(L):
        cells = "".join(f'<td id="cell-{l}-{h}" data-layer="{l}" data-head="{h}">{float(jac[l, h]):.2f}</td>'
                        for h in range(H))
        rows.append(f"<tr><th>{l}</th>{cells}</tr>")
    spans = "".join(
        f'<span class="s{c}" title="#{i} {e(repr(tok))} - {_STATUSES[c]}">{e(tok)}</span>'
        for i, (tok, c) in enumerate(zip(insp.tokens, status[layer, head].tolist())))
    legend = "".join(f'<span style="background:{STATUS_COLOURS[n]}">{label}</span>' for n, label in (
        ("kept", "kept by score"), ("protected", "protected (kept whatever its score: sinks, recent window)"),
        ("evicted", "evicted")))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{e(title)}</h1>
<pre class="summary">{e(repr(insp))}</pre>
<p class="legend">{legend}</p>
<h2>Layers x KV heads</h2>
<p>Cell value: <span id="grid-mode">overlap (Jaccard index) of each head's kept-by-score tokens with layer {layer},
head {head}'s</span>. Click a cell to show that head; click a token (shift-click a second one for a range) to see
which heads keep it. <button id="clear">clear the selection</button></p>
<table class="grid">{"".join(rows)}</table>
<h2 id="text-title">Layer {layer}, KV head {head}: {e(_counts(insp)[f"{layer},{head}"])}</h2>
<div class="tokens" id="tokens">{spans}</div>
<h2>Status map: one row per (layer, KV head), top to bottom; one column per token</h2>
<canvas id="map"></canvas>
<noscript><p>The grid's interaction and the status map need JavaScript; the text above is layer {layer},
head {head}.</p></noscript>
<script type="application/json" id="eviction-data">{_script_json(data)}</script>
<script>{_JS}</script>
</body></html>
"""


def to_html(insp, path, layer: int = 0, head: int = 0, *, title: str | None = None) -> Path:
    """Write the whole model's eviction (:func:`eviction_html`) to ``path`` (an ``.html`` file); returns it."""
    path = Path(path)
    if path.suffix.lower() not in {".html", ".htm"}:
        raise ValueError(f"path must end in .html, got {str(path)!r}")
    if path.is_dir():
        raise ValueError(f"path {str(path)!r} is a folder; give a file name ending in .html")
    text = eviction_html(insp, layer, head, title=title)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- the job `jacap inspect`
def _inspect_arguments(p) -> None:
    from ..config import DEFAULT_RATIO

    J.shared_options(p, seed=True, out="with --kl-table (default data/live/kl_table.json)")
    p.add_argument("--method", default="jacap",
                   help="registry name, optionally name[key=value,...] (default: jacap, the library's default press "
                        "JacapPress: Jacap's score on the queries of KVzip's context-reconstruction pass, its budget "
                        "across layers and heads; jacap_prompt: the one-prefill JacapPromptPress)")
    p.add_argument("--ratio", type=float, default=DEFAULT_RATIO,
                   help=f"compression ratio in [0, 1) (default {DEFAULT_RATIO}, as inspect_eviction: with the default "
                        "sinks + window, most of the budget is chosen by the score)")
    p.add_argument("--text", default=None, help="the prompt itself, any length, never read as a path "
                                                "(default: the live chapter's demo text; a file: --file)")
    p.add_argument("--file", type=Path, default=None, help="a text file to use as the prompt")
    p.add_argument("--layer", type=int, default=None,
                   help="print this layer's KV heads with every token marked: [kept by score] «protected» ·evicted·")
    p.add_argument("--head", type=int, default=None, help="with --layer: only this KV head")
    p.add_argument("--html", type=Path, default=None,
                   help="write the whole model (layer x head grid, every head's text coloured) to this .html file")
    p.add_argument("--top", type=int, default=10, help="tokens listed at each end (without --layer / --html)")
    p.add_argument("--kl-table", action="store_true",
                   help="instead: KL(full || compressed) for every method x --ratios on the demo text, written to --out")
    p.add_argument("--ratios", nargs="+", type=float, default=[0.5, 0.75, 0.9], help="with --kl-table")


def _check_inspect(args) -> str | None:
    """Every argument of ``jacap inspect`` (raises :class:`~jacap_lib.experiments.job.BadArgument`); returns the
    prompt (``None``: the demo text). ``--layer``/``--head`` are checked against the model's configuration
    (layers, KV heads) before its weights load."""
    if args.kl_table:
        used = [f for f in ("text", "file", "layer", "head", "html") if getattr(args, f) is not None]
        J.check(not used, f"--{'/--'.join(used)}: not for --kl-table (it always uses the demo text)")
        J.check_ratios(args.ratios)
        if args.out is not None:
            J.check_out_file(args.out, ".json")
        J.check_model(args.model)
        return None
    J.check_ratios([args.ratio], "--ratio")
    J.check(args.out is None, "--out is only for --kl-table (--html writes the inspection's page)")
    J.check(args.text is None or args.file is None, "--text and --file: give one of them")
    text = args.text
    if text is not None:
        J.check(text.strip() != "", "--text must be a non-empty text (the prompt itself; --file for a file)")
    if args.file is not None:
        J.check(args.file.is_file(), f"--file {args.file} is not a file")
        text = args.file.read_text(encoding="utf-8")
        J.check(text.strip() != "", f"--file {args.file} is empty")
    J.check_positive(args.top, "--top")
    for flag, value in (("--layer", args.layer), ("--head", args.head)):
        J.check(value is None or value >= 0, f"{flag} must be >= 0, got {value}")
    J.check(args.head is None or args.layer is not None, "--head needs --layer (--layer alone shows all its heads)")
    if args.html is not None:
        J.check(args.html.suffix.lower() in (".html", ".htm"), f"--html {args.html} must end in .html")
        J.check(not args.html.is_dir(), f"--html {args.html} is a folder; give a file name")
    J.check_model(args.model)  # needs only huggingface_hub: a wrong id fails before torch/kvpress load
    names = _registry_names()
    name = args.method.split("[", 1)[0].strip()
    if names is not None and name.isidentifier() and name not in names:  # the name, before torch and kvpress load
        jacap = sorted(n for n in names if n.startswith("jacap_"))  # list_methods()'s order
        ordered = [n for n in names if n == "jacap"] + jacap + [n for n in names if not n.startswith("jacap")]
        raise J.BadArgument(f"--method: unknown method {name!r}; valid names: {', '.join(ordered)}")
    if args.layer is not None:  # ranges that depend on the model: from its configuration, before the weights
        n_layers, n_heads = _layers_and_kv_heads(args.model)
        J.check(args.layer < n_layers, f"--layer {args.layer} out of range: the model has {n_layers} layers "
                                       f"(0-{n_layers - 1})")
        J.check(args.head is None or args.head < n_heads,
                f"--head {args.head} out of range: the model has {n_heads} KV heads (0-{n_heads - 1})")
    from ..presses.registry import press_from_spec  # the options: the press is built once (imports kvpress)

    try:
        press_from_spec(args.method, args.ratio)
    except ValueError as e:
        raise J.BadArgument(f"--method: {e}") from None
    return text


def _registry_names() -> tuple[str, ...] | None:
    """The method registry's names, the keys of :data:`jacap_lib.presses.registry.METHODS`, read from the registry's
    source without importing it: the registry imports torch and kvpress (5-10 s), and a misspelt ``--method`` fails
    before they load. ``None`` where the source no longer writes ``METHODS`` as one literal table (then the check
    that builds the press names the method; tests/test_cli.py checks these names are :func:`list_methods`'s)."""
    import ast

    source = Path(__file__).resolve().parents[1] / "presses" / "registry.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(target, ast.Name) and target.id == "METHODS" and isinstance(node.value, ast.Dict):
            keys = node.value.keys
            if keys and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in keys):
                return tuple(k.value for k in keys)
    return None


def _layers_and_kv_heads(model) -> tuple[int, int]:
    """(decoder layers, KV heads) of ``--model``: from its ``config.json`` read as JSON where the file is on disk (the
    bundled model's converted copy, a local folder, the Hugging Face cache), so ``--layer``/``--head`` are checked
    without importing transformers; otherwise from :func:`jacap_lib.models.load_config`."""
    from .. import models

    if models._is_bundled(None if model is None else str(model)):
        path = models.bundled_cache_path() / "config.json"
    elif Path(str(model)).expanduser().is_dir():
        path = Path(str(model)).expanduser() / "config.json"
    else:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(str(model), "config.json")
        path = Path(cached) if isinstance(cached, str) else None
    if path is not None and path.is_file():
        cfg = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(cfg.get("num_hidden_layers"), int):
            return cfg["num_hidden_layers"], int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    cfg = models.load_config(model)
    return cfg.num_hidden_layers, cfg.num_key_value_heads


def _run_inspect(args):
    text = _check_inspect(args)
    model, tok = J.load_model(args)
    if args.kl_table:
        from jacap_lib.experiments.live import write_kl_table

        path = write_kl_table(model, tok, out=args.out, ratios=tuple(args.ratios), model_name=args.model,
                              progress=not args.no_progress)
        print(f"wrote {path}")
        return path
    import warnings

    from ..measure.eviction import DEMO_CONTEXT, MARKS, inspect_eviction
    from ..presses.registry import parse_method

    name, opts = parse_method(args.method)
    with warnings.catch_warnings(record=True) as caught:  # the press's warnings, shown below as notes
        warnings.simplefilter("always", RuntimeWarning)
        insp = inspect_eviction(model, tok, DEMO_CONTEXT if text is None else text, name, args.ratio, **opts)
    print(repr(insp))
    for w in caught:
        print(f"note: {w.message}")
    if bool((insp.n_scored == 0).all()):
        print("note: the budget holds only protected tokens, so the score chose nothing; lower --ratio or the "
              "window (e.g. --method 'jacap_prompt[window=8]')")
    if args.layer is not None:
        legend = "  ".join(f"{MARKS[s][0]}{label}{MARKS[s][1]}" for s, label in
                           (("kept", "kept by score"), ("protected", "protected: sink / window"), ("evicted", "evicted")))
        print(f"marks: {legend}")
        for h in [args.head] if args.head is not None else range(insp.n_heads):
            print(f"\nlayer {args.layer}, KV head {h}: {int(insp.n_scored[args.layer, h])} kept by score + "
                  f"{int(insp.n_protected[args.layer, h])} protected of {insp.n_tokens}")
            print(insp.view(args.layer, h))
    elif args.html is None:
        frac = insp.keep_fraction()
        order = frac.argsort(descending=True).tolist()
        for title, idx in (("most kept", order[:args.top]), ("least kept", order[-args.top:][::-1])):
            print(f"\n{title} (fraction of layer x head pairs keeping the token):")
            for i in idx:
                print(f"  {i:5d} {insp.tokens[i]!r:>16} {float(frac[i]):.2f}")
    if args.html is not None:
        print(f"wrote {to_html(insp, args.html, args.layer or 0, args.head or 0)}")
    return insp


INSPECT = J.Job("what one eviction keeps, per layer and KV head (--layer/--head: marked text, --html: the whole "
                "model); --kl-table: the live chapter's KL table", _inspect_arguments, _run_inspect)
