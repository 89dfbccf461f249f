"""Every chapter runs on Colab — checked without Colab.

The test plays Colab's part: a fresh virtual environment outside the checkout that sees the packages
of the environment running the test (a ``.pth`` file adds that environment's site directories, so
``pip install`` resolves from the packages already installed and downloads nothing; this works whether
the test runs in a virtual environment or with a system Python, where ``--system-site-packages`` would
see only the base interpreter's packages, not the running venv's), the repository served from a local ``file://`` git URL with the committed HEAD on
the branch ``_config.yml`` names, and ``JACAP_COLAB=1``, which the generated install cell treats as
Colab. Each notebook ``book/*.ipynb`` is then executed top to bottom by a kernel of that environment:
the first one clones the repository and installs the requirements, the bundled model and the library;
every chapter must run without an error, import ``jacap_lib`` from the clone and find the clone's
``data/``.

What it cannot check: Colab's own preinstalled versions (the venv sees the running environment's) and a GPU.
It tests the committed HEAD, not uncommitted edits. The chapters are shared between two such
"machines" (each its own venv and clone, one chapter at a time, one thread each, taking the next
unclaimed chapter from a shared queue) to use CI's two cores.
Marked ``colab`` (CI runs it; ``pytest -m "not colab"`` skips it).
"""
from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

RUNNER = textwrap.dedent('''
    """Execute notebooks with nbclient in this interpreter's kernel; print one JSON line per notebook run."""
    import json, os, re, sys, time
    import nbformat
    from nbclient import NotebookClient

    repo = os.environ["JACAP_REPO_DIR"]
    probe = nbformat.v4.new_code_cell(
        "import json, os, sys, jacap_lib\\n"
        "try:\\n"
        "    from jacap_lib.results.paths import data_dir\\n"
        "    data = str(data_dir())\\n"
        "except ImportError:  # before results/paths.py existed\\n"
        "    data = os.environ['JACAP_DATA']\\n"
        "print('PROBE' + json.dumps({'lib': jacap_lib.__file__, 'data': data, 'prefix': sys.prefix}))")
    claims = os.environ["CLAIMS_DIR"]
    for path in sys.argv[1:]:
        try:  # machines share one queue: the first to claim a chapter runs it
            os.mkdir(os.path.join(claims, os.path.basename(path)))
        except FileExistsError:
            continue
        start = time.time()
        for attempt in range(2):  # a kernel that dies while starting (before any cell ran) is started once more
            nb = nbformat.read(path, as_version=4)
            nb.cells.append(probe)
            error = None
            try:
                NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=False,
                               resources={"metadata": {"path": os.getcwd()}}).execute()
            except Exception as exc:  # report and go on with the next chapter
                text = re.sub(r"\x1b\\[[0-9;]*m", "", str(exc))
                error = f"{type(exc).__name__}: {text[-1500:]}"
                if "before replying to kernel_info" in text and attempt == 0:
                    continue
            break
        out = "".join(o.get("text", "") for o in nb.cells[-1].get("outputs", []) if o.get("name") == "stdout")
        probe_out = json.loads(out.split("PROBE", 1)[1]) if "PROBE" in out else None
        print(json.dumps({"notebook": os.path.basename(path), "seconds": round(time.time() - start, 1),
                          "error": error, "probe": probe_out}), flush=True)
''')


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


WORKERS = 2  # two "Colab machines" side by side (each its own venv and clone): CI has two cores


def running_site_dirs() -> list[str]:
    """The site directories of the environment running this test, in import order: a venv's own
    ``site-packages`` (and its base's when it was made with ``--system-site-packages``), or a system
    Python's; the user site where Python uses one."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _machine(tmp_path: Path, name: str, origin: Path):
    """A fresh environment outside the checkout that sees the running environment's packages, and where
    its clone goes."""
    root = tmp_path / name
    venv = root / "venv"
    # Not --system-site-packages: from a venv that would inherit the *base* interpreter's packages, not the
    # venv's. Instead a .pth file in the new venv runs site.addsitedir on each of the running environment's
    # site directories (so their own .pth files apply too), after the venv's own site-packages: the clone's
    # editable install, made into the new venv, comes first. --without-pip: the running environment's pip
    # serves the venv; a venv's own (older) setuptools would shadow the running environment's.
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    purelib = _run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                   env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout.strip()
    Path(purelib).mkdir(parents=True, exist_ok=True)
    (Path(purelib) / "zz_running_environment.pth").write_text(
        "import site; " + "; ".join(f"site.addsitedir({d!r})" for d in running_site_dirs()) + "\n")
    (root / "work").mkdir()
    clone = root / "content" / "jacap-book"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JACAP_DATA", "JACAP_BOOK_BUILD")}
    env.update(JACAP_COLAB="1", JACAP_REPO_URL=origin.as_uri(), JACAP_REPO_DIR=str(clone),
               PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return venv, clone, env, root / "work"


def test_fresh_environment_sees_the_running_one(tmp_path):
    """The simulated Colab machine finds every package the running environment has (in a venv too: the
    test suite run from a venv must not fall back to the base interpreter's packages), and is its own
    environment (``sys.prefix`` is the new venv, so ``pip install`` installs there)."""
    venv, _, env, work = _machine(tmp_path, "machine", tmp_path / "origin.git")
    mods = ["nbformat", "nbclient", "ipykernel", "pip", "torch", "transformers", "kvpress", "plotly", "yaml"]
    probe = ("import importlib.util, json, sys; "
             f"print(json.dumps({{'prefix': sys.prefix, 'missing': [m for m in {mods!r} "
             "if importlib.util.find_spec(m) is None]}))")
    out = json.loads(_run([str(venv / "bin" / "python"), "-c", probe], cwd=work, env=env).stdout)
    assert out["missing"] == [], f"the fresh environment misses {out['missing']} (running: {sys.prefix})"
    assert Path(out["prefix"]).resolve() == venv.resolve(), out


@pytest.mark.colab
def test_every_chapter_runs_as_on_colab(tmp_path):
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    branch = cfg["repository"].get("branch") or "main"
    # the repository, served from a file:// URL, HEAD on the branch the install cell clones
    origin = tmp_path / "origin.git"
    _run(["git", "init", "-q", "--bare", str(origin)])
    _run(["git", "-C", str(ROOT), "push", "-q", str(origin), f"HEAD:refs/heads/{branch}"])
    (tmp_path / "runner.py").write_text(RUNNER)
    notebooks = sorted((ROOT / "book").glob("*.ipynb"))
    assert len(notebooks) >= 12
    # longest first (the chapters that run the model), so neither machine is left with one long chapter
    notebooks.sort(key=lambda p: ("load_model" not in p.read_text(), p.name))
    claims = tmp_path / "claims"
    claims.mkdir()
    jobs = []
    for w in range(WORKERS):
        venv, clone, env, work = _machine(tmp_path, f"machine{w}", origin)
        env["CLAIMS_DIR"] = str(claims)
        log = (tmp_path / f"machine{w}.log").open("w")  # one JSON line per chapter, as it finishes
        proc = subprocess.Popen([str(venv / "bin" / "python"), str(tmp_path / "runner.py"), *map(str, notebooks)],
                                cwd=work, env=env, stdout=log, stderr=subprocess.PIPE, text=True)
        jobs.append((proc, venv, clone, tmp_path / f"machine{w}.log"))
    reports, problems = [], []
    deadline = time.monotonic() + 3600  # a guard against a hung kernel, not a speed check (a loaded 2-core
    for proc, venv, clone, log in jobs:  # machine took 35 min for all chapters; 1500 s per runner killed one)
        try:
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        mine = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        if proc.returncode != 0:
            problems.append(f"runner {log.stem} exited {proc.returncode}: {err[-3000:]}")
        for r in mine:
            r.update(venv=venv, clone=clone)
        reports += mine
    summary = "\n".join(f"{r['notebook']}: {r['seconds']} s {'ok' if not r['error'] else 'FAILED'}" for r in reports)
    print(summary)
    assert not problems, summary + "\n" + "\n".join(problems)
    assert sorted(r["notebook"] for r in reports) == sorted(p.name for p in notebooks), summary
    failed = {r["notebook"]: r["error"] for r in reports if r["error"]}
    assert not failed, (f"{len(failed)} chapters failed as on Colab ({', '.join(failed)}); the first:\n"
                        + "\n\n".join(f"{k}: {v}" for k, v in list(failed.items())[:2]))
    for r in reports:  # the library and the results came from the clone, in the fresh environment
        assert (r["clone"] / ".git").is_dir(), r
        assert Path(r["probe"]["lib"]).resolve().is_relative_to(r["clone"].resolve()), r
        assert Path(r["probe"]["data"]).resolve() == (r["clone"] / "data").resolve(), r
        assert Path(r["probe"]["prefix"]).resolve() == r["venv"].resolve(), r
