"""Model loading: the GGUF cache folder, plain-transformers compatibility, one-line errors."""

import json

import gguf
import numpy as np
import pytest

from llmattr.errors import LlmattrError
from llmattr.models import loading


def _write_gguf(path, arch):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("spec, fragment", [
    ("/nonexistent/model.gguf", "model file not found"),
    ("./no/such/folder", "model path not found"),
    ("", "empty model name"),
])
def test_bad_specs_fail_with_one_line(spec, fragment):
    with pytest.raises(LlmattrError, match=fragment) as info:
        loading.load_model(spec)
    assert "\n" not in str(info.value)


def test_folder_without_config(tmp_path):
    with pytest.raises(LlmattrError, match="not a model folder"):
        loading.load_model(str(tmp_path))


def test_unknown_hub_id_offline_fails_fast(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LlmattrError, match="not reachable on the hub"):
        loading.load_model("nonexistent-org/nonexistent-model-xyz")


def test_architecture_without_gguf_support(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMATTR_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "odd.gguf"
    _write_gguf(path, "rwkv6")
    with pytest.raises(LlmattrError, match="no GGUF support") as info:
        loading.load_model(str(path))
    assert "\n" not in str(info.value)
    assert not list((tmp_path / "cache" / "models").glob("odd-*"))  # nothing half-written is left


def test_cache_dir_honours_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LLMATTR_CACHE", str(tmp_path))
    assert loading.cache_dir() == tmp_path


@pytest.mark.slow
def test_default_model_folder_is_a_plain_hf_folder(smollm):
    from transformers import AutoModelForCausalLM

    folder = loading.converted_folder(loading.default_gguf())
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    plain = AutoModelForCausalLM.from_pretrained(str(folder))
    sd_plain, sd_ours = plain.state_dict(), smollm.model.state_dict()
    assert sd_plain.keys() == sd_ours.keys()
    assert all(bool((sd_plain[k] == sd_ours[k]).all()) for k in sd_plain)


def test_concurrent_conversion_keeps_the_winners_folder(tmp_path, monkeypatch, tiny_llama):
    """Two processes converting the same GGUF: the one that renames second uses the first one's folder."""
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tiny_llama.tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: tiny_llama.model)
    folder = tmp_path / "model-0123"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"written by the other process")
    loading._convert_gguf(tmp_path / "model.gguf", folder)
    assert (folder / "model.safetensors").read_bytes() == b"written by the other process"
    assert [p.name for p in tmp_path.iterdir()] == ["model-0123"]  # our temporary folder is gone
