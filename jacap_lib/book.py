"""Build the Jacap book, and the small Sphinx extension the build loads.

Command line (from the repository root)::

    python -m jacap_lib.book build          # sync notebooks, execute (cached), build _build/html
    python -m jacap_lib.book build --all    # also re-render every page (execution stays cached)
    python -m jacap_lib.book build --fresh  # drop the execution cache and _build/html first

``build`` runs ``python book/sync.py`` and then ``jupyter-book build . -W --keep-going``:
any Sphinx warning or cell error fails it (``_config.yml`` sets ``allow_errors: false`` and
``raise_on_error: true``). Execution is cached in ``_build/.jupyter_cache``, so a rebuild of an
unchanged book re-executes nothing.

As a Sphinx extension (``_config.yml``: ``sphinx.extra_extensions: [jacap_lib.book]``) it

* sets ``JACAP_BOOK_BUILD=1`` for the kernels that execute the chapters, so
  :func:`jacap_lib.viz.setup_notebook` emits static HTML figures and
  :func:`jacap_lib.widgets.show` builds no widgets;
* copies the installed plotly's ``plotly.min.js`` into the site's ``_static`` and loads it on
  every page (the figures' HTML calls the global ``Plotly``), so the site needs no CDN;
* has the kernels that execute the chapters started with CurveZMQ keys (:func:`encrypt_kernel_transport`).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from jacap_lib._env import BOOK_BUILD_ENV
from jacap_lib.experiments import job as J

PLOTLY_JS = "plotly.min.js"


def plotly_js_path() -> Path:
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall plotly (pip install plotly)")
    return path


# --------------------------------------------------------------------------- Sphinx extension
def _config_inited(app, config):
    static = Path(app.doctreedir) / "_jacap_static"
    static.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plotly_js_path(), static / PLOTLY_JS)
    config.html_static_path = list(config.html_static_path) + [str(static)]


def _dedupe_inline_scripts(app, pagename, templatename, context, doctree):
    """Drop repeated inline scripts: sphinx-thebe registers its ``const THEBE_JS_URL`` twice under
    JB1, and the second copy is a SyntaxError in the reader's console."""
    files, seen = context.get("script_files"), set()
    if not files:
        return
    kept = []
    for js in files:
        body = getattr(js, "attributes", {}).get("body") if not isinstance(js, str) else None
        if body:
            if body in seen:
                continue
            seen.add(body)
        kept.append(js)
    context["script_files"] = kept


def encrypt_kernel_transport() -> bool:
    """Start this process's Jupyter kernels with manager-provisioned CurveZMQ keys; True if it could.

    The build executes each chapter in a fresh ipykernel over TCP (myst-nb -> jupyter-cache -> nbclient),
    and ipykernel >= 7 logs "Kernel is running over TCP without encryption" once per kernel started
    without keys. jupyter_client provisions keys when the kernel manager's ``transport_encryption`` is
    ``"auto"`` and the kernelspec declares ``supported_encryption: curve`` (ipykernel's does), but
    nbclient builds its manager with an empty traitlets configuration that neither myst-nb nor
    jupyter-cache lets a book set. So the default itself is set, here, in the build process only: the
    kernels' traffic is encrypted instead of the warning hidden. Needs pyzmq with CurveZMQ (libsodium);
    without it nothing changes (and the warning stays)."""
    import zmq
    from jupyter_client.manager import KernelManager

    if not zmq.has("curve") or not hasattr(KernelManager, "transport_encryption"):  # older jupyter_client: no keys
        return False
    KernelManager.transport_encryption.default_value = "auto"  # the trait itself (also AsyncKernelManager's)
    return True


def setup(app):
    os.environ[BOOK_BUILD_ENV] = "1"
    encrypt_kernel_transport()
    app.connect("config-inited", _config_inited)
    app.connect("html-page-context", _dedupe_inline_scripts)
    # plain <script> in <head>: loaded before the figures' inline Plotly.newPlot calls
    app.add_js_file(PLOTLY_JS, priority=200)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}


# --------------------------------------------------------------------------- command line
def find_root(start: Path | None = None) -> Path:
    """The book root: the nearest folder at or above ``start`` holding ``_config.yml``."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "_config.yml").is_file() and (folder / "_toc.yml").is_file():
            return folder
    package_root = Path(__file__).resolve().parents[1]
    if (package_root / "_config.yml").is_file():
        return package_root
    raise ValueError(f"no _config.yml/_toc.yml at or above {start}; pass --root <repository root>")


def build(root: Path, *, all_pages: bool = False, fresh: bool = False) -> int:
    """Sync the notebooks and build the HTML site; returns the process exit status."""
    root = Path(root).resolve()
    t0 = time.perf_counter()
    if fresh:
        for sub in ("_build/html", "_build/.jupyter_cache", "_build/.doctrees"):
            shutil.rmtree(root / sub, ignore_errors=True)
    rc = subprocess.call([sys.executable, str(root / "book" / "sync.py")], cwd=root)
    if rc != 0:
        print("book/sync.py failed", file=sys.stderr)
        return rc
    env = dict(os.environ, **{BOOK_BUILD_ENV: "1"})
    cmd = [sys.executable, "-c", "from jupyter_book.cli.main import main; main()",
           "build", str(root), "-W", "--keep-going"]
    if all_pages:
        cmd.append("--all")
    print("+ jupyter-book", " ".join(cmd[3:]), flush=True)
    rc = subprocess.call(cmd, cwd=root, env=env)
    print(f"book build finished with status {rc} in {time.perf_counter() - t0:.1f} s; "
          f"site: {root / '_build' / 'html' / 'index.html'}", flush=True)
    return rc


def _add_arguments(p) -> None:
    p.add_argument("--root", type=Path, default=None, help="repository root (default: found from the cwd)")
    p.add_argument("--all", action="store_true", help="re-render every page (execution stays cached)")
    p.add_argument("--fresh", action="store_true", help="drop the execution cache and the site first")


def _run(args) -> int:
    try:
        root = args.root if args.root is not None else find_root()
    except ValueError as e:
        raise J.BadArgument(str(e)) from None
    J.check((root / "_config.yml").is_file(), f"--root {root} has no _config.yml")
    rc = build(root, all_pages=args.all, fresh=args.fresh)
    if rc:
        sys.exit(rc)  # the build's own status (a failed page, a Sphinx warning)
    return rc


BUILD = J.Job("sync the notebooks and build _build/html (warnings are errors)", _add_arguments, _run)


def main(argv=None) -> int:
    """``python -m jacap_lib.book build ...`` (= ``jacap book build ...``)."""
    return J.run_table({"build": BUILD}, argv, prog="python -m jacap_lib.book", description="Build the Jacap book.")


if __name__ == "__main__":
    sys.exit(main())
