"""One scan of a hub folder holding every kind of upload hubtrace reads (a decoder, a LoRA adapter of it, a VLM built
on it, encoders and an encoder fine-tune) and two it refuses (an IA3 adapter, an adapter whose base is missing):
every model gets a fingerprint or exactly one clear error row, related models test dependent, and models of
different kinds are never paired."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from peft import IA3Config, LoraConfig, get_peft_model
from transformers import AutoModelForMaskedLM, BertConfig, BertForMaskedLM

from jobs.scan_job import run_scan
from scanner.reading.architectures.tiny import tiny_config
from scanner.store import Store, queries
from tests.peft_support import lora_finetune, save_adapter, tiny_llama
from tests.scan_support import query, scan_config
from tests.test_multimodal import vlm_on

DEPENDENT = -20.0


@pytest.fixture(scope="module")
def mixed_hub(tmp_path_factory) -> Path:
    hub = tmp_path_factory.mktemp("mixed") / "hub"
    base = tiny_llama(hub / "meta" / "llama-tiny", seed=0)
    vlm_on(base, "llava", hub / "vision" / "llava-tiny")
    save_adapter(lora_finetune(base), hub / "someone" / "chat-lora", "meta/llama-tiny")
    other = tiny_llama(hub / ".staging" / "other", seed=1)
    ia3 = IA3Config(target_modules=["k_proj", "v_proj", "down_proj"], feedforward_modules=["down_proj"])
    save_adapter(get_peft_model(other, ia3), hub / "someone" / "ia3", "meta/llama-tiny")
    third = tiny_llama(hub / ".staging" / "third", seed=2)
    save_adapter(get_peft_model(third, LoraConfig(r=4, target_modules=["q_proj"])), hub / "someone" / "orphan-lora",
                 "gone/base-model")
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                      intermediate_size=128, vocab_size=256, max_position_embeddings=64)).eval()
    bert.save_pretrained(hub / "enc" / "bert-tiny")
    with torch.no_grad():
        for parameter in bert.parameters():
            parameter.add_(0.02 * float(parameter.std()) * torch.randn_like(parameter))
    bert.bert.save_pretrained(hub / "enc" / "bert-tiny-embeddings")  # the bare encoder, as sentence-transformers saves
    torch.manual_seed(0)
    modernbert = AutoModelForMaskedLM.from_config(tiny_config("modernbert", vocab_size=256))
    modernbert.save_pretrained(hub / "enc" / "modernbert")
    shutil.rmtree(hub / ".staging")
    return hub


def test_a_scan_gives_every_kind_a_fingerprint_or_one_clear_error(mixed_hub: Path, local_ray, tmp_path: Path) -> None:
    config = scan_config(mixed_hub, tmp_path / "out")
    summary = run_scan(config)
    db = config.db_path
    fingerprinted = set(query(db, "SELECT model_id FROM fingerprints")["model_id"])
    errors = query(db, "SELECT model_id, error_type, reason FROM scan_errors WHERE run_id = ?", [summary.run_id])
    assert fingerprinted == {"meta/llama-tiny", "vision/llava-tiny", "someone/chat-lora", "enc/bert-tiny",
                             "enc/bert-tiny-embeddings", "enc/modernbert"}
    by_model = {m: (kind, reason) for m, kind, reason in errors.iter_rows()}
    assert len(by_model) == errors.height == 2 and not fingerprinted & set(by_model)
    assert by_model["someone/ia3"][0] == "UnsupportedAdapterError" and "'IA3'" in by_model["someone/ia3"][1]
    assert by_model["someone/orphan-lora"][0] == "MissingBaseError"
    assert "gone/base-model" in by_model["someone/orphan-lora"][1]

    models = query(db, "SELECT model_id, declared_base_models, declared_relation, mlp_kind, attention "
                       "FROM current_models")
    rows = {m: rest for m, *rest in models.iter_rows()}
    assert rows["someone/chat-lora"] == [["meta/llama-tiny"], "adapter", "gated", "causal"]
    assert rows["enc/bert-tiny"][2:] == ["plain", "bidirectional"] and rows["enc/modernbert"][2:] == [
        "gated", "bidirectional"]

    tests = query(db, "SELECT model_a, model_b, log10_p, reason FROM current_pair_tests")
    pairs = {(a, b): (log10_p, reason) for a, b, log10_p, reason in tests.iter_rows()}
    assert set(pairs) == {("meta/llama-tiny", "someone/chat-lora"), ("meta/llama-tiny", "vision/llava-tiny"),
                          ("someone/chat-lora", "vision/llava-tiny"), ("enc/bert-tiny", "enc/bert-tiny-embeddings")}
    assert pairs[("meta/llama-tiny", "someone/chat-lora")][1] == "declared_base"
    assert all(log10_p <= DEPENDENT for log10_p, _ in pairs.values())  # all four are related
    assert summary.pairs_failed == 0
    assert sum(n for reason, n in summary.pairs["incomparable"].items() if "kinds of units" in reason) == 3 * 2 + 3 + 2

    again = run_scan(config)  # the two refused models keep failing, visibly
    assert (again.fingerprinted, again.not_retried, again.failed) == (0, 2, 2)
    with Store(db, read_only=True) as store:
        assert sorted(queries.run_errors(store, again.run_id)["model_id"]) == ["someone/ia3", "someone/orphan-lora"]
