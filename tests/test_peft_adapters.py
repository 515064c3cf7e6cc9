"""PEFT LoRA adapter-only folders, made with PEFT itself, read through their base (scanner.reading.formats.lora)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import hf_hub_download
from peft import IA3Config, LoraConfig, get_peft_model
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
)

from scanner.errors import CheckpointError, MissingBaseError, UnsafeCheckpointError, UnsupportedAdapterError
from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.formats.lora import LoraCheckpoint
from scanner.reading.formats.lora_base import BaseLocator, adapter_base
from scanner.reading.validate import validate_checkpoint
from scanner.sources import ModelRecord, RetryPolicy, discover_hf_cache, discover_local, materialize
from tests.fixtures.fake_hub import FakeHub
from tests.peft_support import LLAMA, lora_finetune, save_adapter, save_merged, tiny_llama

DEPENDENT = -20.0
INDEPENDENT = -3.0  # one valid test falls below once in a thousand
FAST = RetryPolicy(attempts=3, base_wait=0.01, max_wait=0.05)


def _same_activations(a: Fingerprint, b: Fingerprint) -> float:
    """Largest difference between two fingerprints' activations (float32 storage)."""
    return max(float(np.abs(x.gate - y.gate).max() + np.abs(x.up - y.up).max())
               for block_a, block_b in zip(a.blocks, b.blocks, strict=True)
               for x, y in zip(block_a, block_b, strict=True))


def _fingerprint(folder: Path) -> Fingerprint:
    return fingerprint_model(folder, storage_dtype="float32")


@pytest.mark.parametrize("options", [
    {},  # the usual attention and MLP projections
    {"use_rslora": True, "alpha_pattern": {"down_proj": 64}, "target_modules": ["gate_proj", "up_proj", "down_proj"]},
    {"target_modules": ["embed_tokens", "q_proj", "v_proj"], "modules_to_save": ["lm_head"]},
], ids=["attention-and-mlp", "rslora-alpha-pattern", "embedding-and-saved-head"])
def test_an_adapter_reads_as_exactly_its_merged_form(tmp_path: Path, options: dict) -> None:
    """An adapter folder fingerprints as the model PEFT's own merge_and_unload makes of it, to float32 rounding:
    the update s * B @ A lands on the right tensors with the right scale (rsLoRA, per-module alpha), an adapted
    embedding's rows are updated, a saved head replaces the base's. Random (not zero) B makes every update count."""
    base = tiny_llama(tmp_path / "hub" / "org" / "base", seed=0)
    model = get_peft_model(base, LoraConfig(**{"r": 4, "lora_alpha": 8, "init_lora_weights": False,
                                               "target_modules": ["q_proj", "v_proj", "gate_proj", "down_proj"],
                                               **options}))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.mul_(0.1)  # a small update, as training makes
            if "modules_to_save" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))
    save_adapter(model, tmp_path / "hub" / "org" / "adapter", "org/base")
    save_merged(model, tmp_path / "merged")
    adapter, merged = _fingerprint(tmp_path / "hub" / "org" / "adapter"), _fingerprint(tmp_path / "merged")
    assert _same_activations(adapter, merged) < 1e-4
    assert adapter.meta.tensor_hashes.keys() == merged.meta.tensor_hashes.keys()
    notes = validate_checkpoint(tmp_path / "hub" / "org" / "adapter").checkpoint.notes
    assert any("LoRA adapter" in note and "no merged copy" in note for note in notes)


def test_a_gpt2_adapter_updates_its_conv1d_weights_transposed(tmp_path: Path) -> None:
    """GPT-2 stores its linear maps as Conv1D (in, out); c_proj of attention is square, so only the model's own
    module says the update goes on transposed. PEFT's config says fan_in_fan_out false (it fixes it per layer with a
    warning), as most GPT-2 adapters on the Hub do."""
    torch.manual_seed(0)
    base = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=128)).eval()
    base.save_pretrained(tmp_path / "hub" / "org" / "gpt2")
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["c_attn", "c_proj", "c_fc"], init_lora_weights=False))
    save_adapter(model, tmp_path / "hub" / "org" / "adapter", "org/gpt2")
    config = json.loads((tmp_path / "hub" / "org" / "adapter" / "adapter_config.json").read_text())
    config["fan_in_fan_out"] = False
    (tmp_path / "hub" / "org" / "adapter" / "adapter_config.json").write_text(json.dumps(config))
    save_merged(model, tmp_path / "merged")
    adapter, merged = _fingerprint(tmp_path / "hub" / "org" / "adapter"), _fingerprint(tmp_path / "merged")
    assert adapter.meta.mlp_kind == "plain" and _same_activations(adapter, merged) < 1e-4


def test_an_encoder_adapter_finds_its_weights_under_another_prefix(tmp_path: Path) -> None:
    """A LoRA trained on BertModel (as sentence-transformers loads it) names `encoder.layer.0...`; its base saved as
    BertForMaskedLM stores `bert.encoder.layer.0...`. The update lands on the stored tensor either way."""
    torch.manual_seed(0)
    config = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96,
                        vocab_size=128, max_position_embeddings=128)
    BertForMaskedLM(config).save_pretrained(tmp_path / "hub" / "org" / "bert")
    encoder = BertModel.from_pretrained(tmp_path / "hub" / "org" / "bert").eval()
    model = get_peft_model(encoder, LoraConfig(r=4, target_modules=["query", "value", "dense"],
                                               init_lora_weights=False))
    save_adapter(model, tmp_path / "hub" / "org" / "adapter", "org/bert")
    save_merged(model, tmp_path / "merged")
    adapter, merged = _fingerprint(tmp_path / "hub" / "org" / "adapter"), _fingerprint(tmp_path / "merged")
    assert adapter.meta.attention == "bidirectional" and _same_activations(adapter, merged) < 1e-4


def test_a_trained_adapter_tests_dependent_on_its_base_and_merged_form_and_not_on_an_unrelated_model(
        tmp_path: Path) -> None:
    """40 steps of LoRA fine-tuning (r 8 on every projection): the adapter folder tests dependent on its base and on
    its merged form at the floor of a derived model, and an unrelated model of the same shape gets a valid p-value
    (log10 p >= -3: a false failure once in a thousand seeds; the seed is fixed)."""
    hub = tmp_path / "hub"
    base = tiny_llama(hub / "org" / "base", seed=0)
    model = lora_finetune(base)
    save_adapter(model, hub / "org" / "chat-lora", "org/base")
    save_merged(model, hub / "org" / "chat-merged")
    tiny_llama(hub / "other" / "base", seed=1)
    adapter, base_fp, merged, other = (fingerprint_model(hub / name) for name in
                                       ("org/chat-lora", "org/base", "org/chat-merged", "other/base"))
    assert compare_fingerprints(adapter, base_fp).log10_p <= DEPENDENT
    assert compare_fingerprints(adapter, merged).log10_p <= DEPENDENT
    assert compare_fingerprints(adapter, other).log10_p >= INDEPENDENT
    assert adapter.meta.input_set == base_fp.meta.input_set  # a scan compares them like any other pair


def test_other_peft_methods_and_lora_variants_are_refused_by_name(tmp_path: Path) -> None:
    base = tiny_llama(tmp_path / "hub" / "org" / "base", seed=0)
    get_peft_model(base, IA3Config(target_modules=["k_proj", "v_proj", "down_proj"],
                                   feedforward_modules=["down_proj"])).save_pretrained(tmp_path / "hub" / "org" / "ia3")
    with pytest.raises(UnsupportedAdapterError, match="PEFT method 'IA3' is not supported") as caught:
        validate_checkpoint(tmp_path / "hub" / "org" / "ia3")
    assert "\n" not in str(caught.value)
    base = tiny_llama(tmp_path / "hub" / "org" / "base", seed=0)
    save_adapter(get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], use_dora=True)),
                 tmp_path / "hub" / "org" / "dora", "org/base")
    with pytest.raises(UnsupportedAdapterError, match="use_dora is set, and DoRA"):
        validate_checkpoint(tmp_path / "hub" / "org" / "dora")


def test_a_missing_base_is_one_clear_error_naming_it(tmp_path: Path) -> None:
    base = tiny_llama(tmp_path / "scratch" / "base", seed=0)
    save_adapter(get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"])), tmp_path / "hub" / "org" / "lora",
                 "nowhere-labs/missing-base")
    with pytest.raises(MissingBaseError, match="a LoRA adapter of 'nowhere-labs/missing-base'") as caught:
        validate_checkpoint(tmp_path / "hub" / "org" / "lora", bases=BaseLocator(hub_roots=(tmp_path / "hub",),
                                                                                  hf_caches=(tmp_path / "cache",)))
    assert "\n" not in str(caught.value)
    assert str(tmp_path / "hub" / "nowhere-labs" / "missing-base") in str(caught.value)


def test_pickle_only_and_mismatched_adapters_are_refused(tmp_path: Path) -> None:
    base = tiny_llama(tmp_path / "hub" / "org" / "base", seed=0)
    save_adapter(get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"])), tmp_path / "hub" / "org" / "lora",
                 "org/base")
    pickled = tmp_path / "hub" / "org" / "pickled"
    shutil.copytree(tmp_path / "hub" / "org" / "lora", pickled)
    (pickled / "adapter_model.safetensors").rename(pickled / "adapter_model.bin")
    with pytest.raises(UnsafeCheckpointError, match="never unpickles"):
        validate_checkpoint(pickled)
    LlamaForCausalLM(LlamaConfig(**{**LLAMA, "hidden_size": 32})).save_pretrained(tmp_path / "hub" / "org" / "wider")
    config_file = tmp_path / "hub" / "org" / "lora" / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": "org/wider"}))
    with pytest.raises(CheckpointError, match="LoRA update of model.layers.0.self_attn.q_proj"):
        validate_checkpoint(tmp_path / "hub" / "org" / "lora")


def test_the_base_is_found_in_the_hub_a_folder_or_the_cache_and_a_downloaded_adapter_names_no_path(
        tmp_path: Path) -> None:
    """Where the base is looked for: the adapter's own hub root, a local folder it names (inside that hub, or
    anywhere when the operator lets links lead out), and a Hugging Face cache (the real client's layout, filled from
    the loopback Hub); a cached adapter that names a local path is never led there."""
    base = tiny_llama(tmp_path / "elsewhere" / "base", seed=0)
    adapter = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"]))
    save_adapter(adapter, tmp_path / "hub" / "org" / "by-path", str(tmp_path / "elsewhere" / "base"))
    with pytest.raises(MissingBaseError, match="a path outside the scanned hub"):
        validate_checkpoint(tmp_path / "hub" / "org" / "by-path")
    checked = validate_checkpoint(tmp_path / "hub" / "org" / "by-path", follow_links=True)
    assert isinstance(checked.checkpoint, LoraCheckpoint)
    assert checked.checkpoint.base_path == (tmp_path / "elsewhere" / "base").resolve()
    shutil.copytree(tmp_path / "elsewhere" / "base", tmp_path / "hub" / "org" / "base")
    save_adapter(adapter, tmp_path / "hub" / "org" / "by-relative-path", "../base")  # inside the hub: followed
    inside = validate_checkpoint(tmp_path / "hub" / "org" / "by-relative-path").checkpoint
    assert inside.base_path == (tmp_path / "hub" / "org" / "base").resolve()

    with FakeHub() as hub:
        hub.add_folder("acme/base", tmp_path / "elsewhere" / "base")
        save_adapter(adapter, tmp_path / "upload", "acme/base")
        lora_sha = hub.add_folder("acme/lora", tmp_path / "upload")
        cache = tmp_path / "cache"
        hf_hub_download("acme/base", "config.json", cache_dir=cache, endpoint=hub.endpoint)
        hf_hub_download("acme/base", "model.safetensors", cache_dir=cache, endpoint=hub.endpoint)
        save_adapter(adapter, tmp_path / "hub" / "org" / "by-id", "acme/base")
        found = validate_checkpoint(tmp_path / "hub" / "org" / "by-id",
                                    bases=BaseLocator(hub_roots=(tmp_path / "hub",), hf_caches=(cache,)))
        assert found.checkpoint.base_path.is_relative_to(cache.resolve())

        # a Hub scan fetches the adapter and its base into the scan's cache, and reads it from there
        record = ModelRecord("acme/lora", lora_sha, "hub", f"{hub.endpoint}/acme/lora", ("acme/base",),
                             "adapter", False, None, (), None, None)
        snapshot = materialize(record, tmp_path / "scratch", retry=FAST)
        assert isinstance(validate_checkpoint(snapshot).checkpoint, LoraCheckpoint)
        cached = {r.model_id: r for r in discover_hf_cache(tmp_path / "scratch")}  # that cache, as a source
        assert set(cached) == {"acme/base", "acme/lora"}
        assert (cached["acme/lora"].base_models, cached["acme/lora"].base_model_relation) == (("acme/base",), "adapter")

        save_adapter(adapter, tmp_path / "upload2", str(tmp_path / "elsewhere" / "base"))
        by_path_sha = hub.add_folder("acme/lora-by-path", tmp_path / "upload2")
        record = ModelRecord("acme/lora-by-path", by_path_sha, "hub",
                             f"{hub.endpoint}/acme/lora-by-path", (), None, False, None, (), None, None)
        snapshot = materialize(record, tmp_path / "scratch", retry=FAST)
        with pytest.raises(MissingBaseError, match="never followed"):
            validate_checkpoint(snapshot)


def test_local_discovery_declares_the_adapter_and_its_base(tmp_path: Path) -> None:
    """A local adapter folder's record names its base (found in the same hub) with relation `adapter`, and its
    revision covers the base: a base added or changed later makes the adapter a new revision."""
    hub = tmp_path / "hub"
    base = tiny_llama(tmp_path / "staging" / "base", seed=0)
    save_adapter(get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"])), hub / "org" / "lora", "org/base")
    (hub / "org" / "lora" / "README.md").unlink()  # no card: the adapter config alone declares the base
    missing = {r.model_id: r for r in discover_local(hub)}["org/lora"]
    assert (missing.base_models, missing.base_model_relation) == (("org/base",), "adapter")
    assert adapter_base(hub / "org" / "lora").folder is None
    shutil.copytree(tmp_path / "staging" / "base", hub / "org" / "base")
    found = {r.model_id: r for r in discover_local(hub)}
    assert found["org/lora"].revision != missing.revision
    assert (found["org/lora"].base_models, found["org/lora"].base_model_relation) == (("org/base",), "adapter")
    assert found["org/base"].base_model_relation is None
