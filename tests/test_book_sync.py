"""The generated notebooks match their sources; every chapter has the required first cells."""
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
COLAB_CELL = '''# On Colab, install the library first (a no-op everywhere else).
import sys
if "google.colab" in sys.modules:
    import subprocess
    subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                    "jacap_lib[model,widgets] @ git+https://github.com/jacap-book/jacap-book.git"], check=True)'''
SLUGS = ["00_preface_kv_memory", "01_softmax_jacobian", "02_capacity", "03_leverage_2d", "04_roadmap",
         "05_algorithm1_gpu", "06_live_eviction", "07_serving", "07b_kvpress", "08_error_decomposition", "09_baselines",
         "10_critique", "10b_failure_cases"]


def test_sync_check_passes():
    proc = subprocess.run([sys.executable, "book/sync.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_sync_check_detects_a_stale_notebook(tmp_path, monkeypatch):
    sys.path.insert(0, str(ROOT / "book"))
    import sync

    src = tmp_path / "chapters"
    src.mkdir()
    (src / "99_x.md").write_text((ROOT / "book/chapters/04_roadmap.md").read_text())
    monkeypatch.setattr(sync, "BOOK", tmp_path)
    monkeypatch.setattr(sync, "SOURCES", src)
    assert any("missing" in p for p in sync.sync(check=True))
    assert sync.sync() == []
    assert sync.sync(check=True) == []
    (src / "99_x.md").write_text((src / "99_x.md").read_text() + "\nOne more line.\n")
    assert any("differs" in p for p in sync.sync(check=True))
    (tmp_path / "98_orphan.ipynb").write_text("{}")
    assert any("no source" in p for p in sync.sync(check=True))


def test_toc_lists_every_chapter_in_its_part():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [c["file"] for part in toc["parts"] for c in part["chapters"]]
    notebooks = [f for f in files if (ROOT / f"{f}.ipynb").is_file()]
    assert sorted(notebooks) == sorted(f"book/{s}" for s in SLUGS)
    assert [f for f in files if f not in notebooks] == ["book/reading_note", "book/references"]
    assert files[0] == "book/reading_note" and files[-1] == "book/references"
    assert [p["caption"] for p in toc["parts"]] == ["About this book", "Foundations", "Algorithm and systems",
                                                    "Analysis", "Back matter"]
    assert [p.get("numbered", False) for p in toc["parts"]] == [False, True, True, True, False]
    for slug in SLUGS:
        assert (ROOT / "book" / f"{slug}.ipynb").is_file(), slug


def test_every_chapter_starts_with_the_colab_cell_then_setup():
    import jupytext

    for slug in SLUGS:
        nb = jupytext.read(ROOT / "book/chapters" / f"{slug}.md", fmt="md:myst")
        code = [c.source for c in nb.cells if c.cell_type == "code"]
        assert code[0].strip() == COLAB_CELL, slug
        assert "viz.setup_notebook()" in code[1], slug


def test_config_keeps_the_site_offline_and_strict():
    cfg = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cfg["execute"]["allow_errors"] is False and cfg["execute"]["execute_notebooks"] == "cache"
    assert cfg["launch_buttons"]["colab_url"].startswith("https://colab.research.google.com")
    sph = cfg["sphinx"]["config"]
    assert not sph["mathjax_path"].startswith("http")
    assert (ROOT / "book/_static" / sph["mathjax_path"]).is_file()
    assert sph["nb_ipywidgets_js"] == {}
    assert "jacap_lib.book" in cfg["sphinx"]["extra_extensions"]
