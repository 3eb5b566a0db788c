"""Model loading: the GGUF cache folder, plain-transformers compatibility, one-line errors."""

import json
import warnings

import gguf
import numpy as np
import pytest
import torch

from llmattr import methods
from llmattr.api import prepare
from llmattr.errors import LlmattrError
from llmattr.models import loading
from llmattr.models.loading import load_model, parse_max_memory
from llmattr.request import Request


def _write_gguf(path, arch):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("name_or_path, fragment", [
    ("/nonexistent/model.gguf", "model file not found"),
    ("./no/such/folder", "model path not found"),
    ("", "empty model name"),
])
def test_bad_model_names_fail_with_one_line(name_or_path, fragment):
    with pytest.raises(LlmattrError, match=fragment) as info:
        loading.load_model(name_or_path)
    assert "\n" not in str(info.value)


def test_the_model_is_name_or_path_and_its_old_name_spec_keeps_working():
    """``load_model``'s model is ``name_or_path`` (transformers' word); ``spec=``, its name before issue 39, is
    the same argument, and both at once are refused."""
    for call in ({"name_or_path": "./no/such/folder"}, {"spec": "./no/such/folder"}):
        with pytest.raises(LlmattrError, match="model path not found: ./no/such/folder"):
            loading.load_model(**call)
    with pytest.raises(LlmattrError, match="not both"):
        loading.load_model("./a", spec="./b")


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
    assert all(bool((sd_plain[k] == sd_ours[k].cpu()).all()) for k in sd_plain)


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


@pytest.mark.parametrize("dtype, element", [("fp32", 4), ("bf16", 2)])
def test_max_memory_splits_the_model_between_cpu_and_disk(tmp_path, tiny_llama, dtype, element):
    """``max_memory`` below the model's size: accelerate keeps the first blocks on the CPU, offloads the rest to
    disk (the LM head among them: its float32 forward runs inside accelerate's hook), and the attributions equal
    those of the model held whole."""
    tiny_llama.model.save_pretrained(tmp_path)
    tiny_llama.tokenizer.save_pretrained(tmp_path)
    size = sum(p.numel() * element for p in tiny_llama.model.parameters())
    split = load_model(str(tmp_path), device="cpu", dtype=dtype, max_memory=f"cpu={int(0.8 * size)}B")
    assert {"cpu", "disk"} <= set(split.model.hf_device_map.values())
    assert split.model.hf_device_map.get("lm_head") == "disk"
    whole = load_model(str(tmp_path), device="cpu", dtype=dtype)
    target = prepare(whole, "A terrific film.", Request("sentiment", answer="Positive"))
    for name in ("saliency", "attention"):
        torch.testing.assert_close(methods.get(name).attribute(split, target),
                                   methods.get(name).attribute(whole, target), rtol=0, atol=0)


@pytest.mark.parametrize("text", ["cpu", "gpu=2GB", "cpu=lots", ","])
def test_bad_max_memory_fails_with_one_line(text):
    with pytest.raises(LlmattrError, match="max-memory"):
        parse_max_memory(text)
    assert parse_max_memory("cpu=2GB, 0=20.5GiB,disk=512 mb") == {"cpu": 2 * 2**30, 0: int(20.5 * 2**30),
                                                                   "disk": 512 * 2**20}


def test_bf16_on_a_cpu_without_bf16_units_warns(tmp_path, tiny_llama, monkeypatch):
    tiny_llama.model.save_pretrained(tmp_path)
    tiny_llama.tokenizer.save_pretrained(tmp_path)
    for name in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        monkeypatch.setattr(torch.cpu, name, lambda: False)
    with pytest.warns(UserWarning, match="bfloat16 on this CPU"):
        load_model(str(tmp_path), device="cpu", dtype="bf16")
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_model(str(tmp_path), device="cpu", dtype="bf16").model.dtype == torch.bfloat16
