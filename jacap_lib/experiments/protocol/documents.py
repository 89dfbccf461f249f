"""The evaluation's documents and grid: the corpus split into tune and dev documents (sha256-checked), the
documents' length check, and the grid's default prompt lengths, ratios and continuation (``--quick``: the smoke run's)."""
from __future__ import annotations

from jacap_lib.results import files

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_RATIOS", "DEFAULT_CONTINUATION", "TUNE_DOCS_PER_KIND", "QUICK", "load_docs",
           "check_lengths"]

DEFAULT_LENGTHS = (512, 1024, 2048)
DEFAULT_RATIOS = (0.5, 0.75, 0.9, 0.95)
DEFAULT_CONTINUATION = 128
# tune documents used per kind (round robin over source works); 0: every tune document (all 18). The first tune
# rounds used 3 per kind (12), as the CPU hours of the time allowed; the rows of the 6 others were added later.
TUNE_DOCS_PER_KIND = 0
QUICK = {"lengths": (512,), "ratios": (0.75, 0.9), "continuation": 32, "docs_per_split": 2}


def load_docs(manifest=None, *, quick: bool = False, tune_per_kind: int = 0) -> list[dict]:
    """The documents of the evaluation corpus (``manifest``: another manifest of that shape, or of the older
    ``segments`` shape) with their text, sha256-checked, each with ``split`` "tune" or "dev" (``quick``:
    the first two of each split; ``tune_per_kind`` > 0: only that many tune documents of each kind, taken
    round robin over its source works (``group``; the first excerpt of every work, then the second, ...,
    manifest order within a round) — the other tune documents take part in neither job)."""
    from jacap_lib.results.texts import load_corpus, load_segments

    if manifest is not None and "documents" not in files.read_json(manifest):
        docs = load_segments(None, manifest)
    else:
        docs = load_corpus(manifest=manifest)
    bad = sorted({str(d.get("split")) for d in docs} - {"tune", "dev"})
    if bad:
        raise ValueError(f"every document of the manifest needs split 'tune' or 'dev'; found {bad}")
    if tune_per_kind > 0:  # round robin over the source works (groups) of each kind, manifest order within
        rank, seen = {}, {}
        for i, d in enumerate(d for d in docs if d["split"] == "tune"):
            g = (d.get("kind"), d.get("group", d["id"]))
            seen[g] = seen.get(g, 0) + 1
            rank[d["id"]] = (seen[g], i)
        keep = set()
        for kind in dict.fromkeys(d.get("kind") for d in docs if d["split"] == "tune"):
            ids = sorted((rank[d["id"]], d["id"]) for d in docs if d["split"] == "tune" and d.get("kind") == kind)
            keep |= {x for _, x in ids[:tune_per_kind]}
        docs = [d for d in docs if d["split"] == "dev" or d["id"] in keep]
    if quick:
        n = QUICK["docs_per_split"]
        docs = [d for d in docs if d["split"] == "tune"][:n] + [d for d in docs if d["split"] == "dev"][:n]
    for split in ("tune", "dev"):
        if not any(d["split"] == split for d in docs):
            raise ValueError(f"the manifest has no {split} documents; the protocol needs both splits")
    return docs


def check_lengths(tokenizer, docs, lengths, continuation) -> dict:
    """``{doc id: token count}``; ``ValueError`` naming every document too short for the longest prompt."""
    counts = {d["id"]: int(tokenizer(d["text"], return_tensors="pt", add_special_tokens=False).input_ids.shape[1])
              for d in docs}
    need = max(lengths) + continuation
    short = {k: v for k, v in counts.items() if v < need}
    if short:
        raise ValueError(f"{len(short)} document(s) have fewer than {need} tokens (longest prompt {max(lengths)} + "
                         f"continuation {continuation}): {dict(list(short.items())[:5])}; use shorter --lengths or "
                         "longer documents")
    return counts
