"""The benchmark's texts as committed under ``data/texts``, loaded sha256-checked: the text segments of the quality
benchmark (:func:`load_segments`), the evaluation corpus split into tune and dev documents and the confirmatory set
(:func:`load_corpus`, :func:`load_corpus_manifest`). A text whose hash differs from its manifest's is refused. The
builder that writes them is :mod:`jacap_lib.experiments.corpus` (``jacap texts``)."""
from __future__ import annotations

import hashlib

from jacap_lib.results import files
from jacap_lib.results.loaders import load_manifest
from jacap_lib.results.paths import data_path, repo_path

__all__ = ["SET_DIRS", "segment_ids", "load_segments", "load_corpus_manifest", "load_corpus"]

#: which set -> its folder under ``data/``: the evaluation corpus and the confirmatory set
SET_DIRS = {"corpus": ("texts", "corpus"), "confirm": ("texts", "confirm")}


def segment_ids() -> list[str]:
    return [s["id"] for s in load_manifest()["segments"]]


def load_segments(ids=None, manifest=None) -> list[dict]:
    """Segments of ``data/texts/manifest.json`` (all, or those whose id is in ``ids``), each with its
    ``text``, sha256-checked against the manifest."""
    meta = load_manifest(manifest)
    known = [s["id"] for s in meta["segments"]]
    if ids:
        missing = sorted(set(ids) - set(known))
        if missing:
            raise ValueError(f"unknown segment id(s) {missing}; valid: {known}")
    segs = []
    for seg in meta["segments"]:
        if ids and seg["id"] not in ids:
            continue
        path = repo_path(seg["file"])
        text = path.read_text()
        if hashlib.sha256(text.encode()).hexdigest() != seg["sha256"]:
            raise ValueError(f"segment {seg['id']} ({path}) does not match its sha256 in the manifest; "
                             "rebuild the texts with: jacap texts")
        segs.append(dict(seg, text=text))
    return segs


def load_corpus_manifest(path=None, which: str = "corpus") -> dict:
    """``data/texts/corpus/manifest.json`` (``which="confirm"``: ``data/texts/confirm/manifest.json``)."""
    if which not in SET_DIRS:
        raise ValueError(f"which must be one of {sorted(SET_DIRS)}, got {which!r}")
    return files.read_json(path or data_path(*SET_DIRS[which], "manifest.json", must_exist=False),
                           require=("documents",), hint=f"jacap texts --{which}")


def load_corpus(split: str | None = None, kinds=None, ids=None, manifest=None, which: str = "corpus") -> list[dict]:
    """Documents of the evaluation corpus (``which="confirm"``: of the confirmatory set), each a manifest
    entry plus its ``text`` (sha256-checked): all, or those of ``split`` ("tune" / "dev"; "confirm"), of
    ``kinds``, or whose id is in ``ids``."""
    meta = load_corpus_manifest(manifest, which)
    docs = meta["documents"]
    splits = ("tune", "dev") if which == "corpus" else ("confirm",)
    if split is not None and split not in splits:
        raise ValueError(f"split must be {' or '.join(map(repr, splits))} or None, got {split!r}")
    known_kinds = sorted({d["kind"] for d in docs})
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        bad = sorted(set(kinds) - set(known_kinds))
        if bad:
            raise ValueError(f"kinds: unknown kind(s) {bad}; valid: {known_kinds}")
    if ids is not None:
        ids = [ids] if isinstance(ids, str) else list(ids)
        bad = sorted(set(ids) - {d["id"] for d in docs})
        if bad:
            raise ValueError(f"ids: unknown document id(s) {bad}; see {SET_DIRS[which][-1]}/manifest.json")
    out = []
    for d in docs:
        if (split and d["split"] != split) or (kinds and d["kind"] not in kinds) or (ids and d["id"] not in ids):
            continue
        path = repo_path(d["file"])
        text = path.read_bytes().decode()
        if hashlib.sha256(text.encode()).hexdigest() != d["sha256"]:
            raise ValueError(f"document {d['id']} ({path}) does not match its sha256 in the manifest; "
                             f"rebuild it with: jacap texts --{which}")
        out.append(dict(d, text=text))
    return out
