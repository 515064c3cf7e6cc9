"""scanner.reading.architectures.families against live transformers models: every family's roles must be what the model
computes with.

Each family is a tiny random model saved with save_pretrained and reloaded with from_pretrained, so the test sees
exactly the file layout transformers writes and the modules it builds from it. Norm roles are matched to live
modules by what they do in a forward pass (the norm whose output feeds attention is "attn_norm", ...), not by name,
so a family whose "post_attention_layernorm" means something else cannot pass by accident.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.activations import ACT2FN

from scanner.errors import CheckpointError, UnsupportedArchitectureError
from scanner.reading.architectures.families import FAMILIES as ADAPTER_FAMILIES
from scanner.reading.architectures.families import ArchitectureAdapter, adapter_for
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.checkpoint import open_checkpoint
from tests.tiny_models import FAMILIES, GEMMA_FAMILIES, LAYERS, VOCAB, D, H, gemma3_multimodal, save_random


@dataclass
class Built:
    name: str
    folder: Path
    adapter: ArchitectureAdapter
    live: PreTrainedModel


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Built:
    folder = tmp_path_factory.mktemp(request.param)
    save_random(FAMILIES[request.param].config(), folder)
    live = AutoModelForCausalLM.from_pretrained(folder).eval()
    return Built(request.param, folder, adapter_for(open_checkpoint(folder)), live)


def _glu(weights: GLUWeights, x: torch.Tensor, act: str) -> torch.Tensor:
    return F.linear(ACT2FN[act](F.linear(x, weights.gate)) * F.linear(x, weights.up), weights.down)


def _layer(built: Built, layer: int) -> torch.nn.Module:
    return built.live.get_submodule(built.adapter.mlp_module_path(layer).removesuffix(".mlp"))


# -- shape, embeddings, globals ----------------------------------------------------------------------------------


def test_shape(built: Built) -> None:
    family = FAMILIES[built.name]
    shape = built.adapter.shape
    assert shape.model_type == built.name
    assert shape.architecture == built.live.__class__.__name__
    assert (shape.n_layers, shape.hidden_size, shape.vocab_size) == (LAYERS, D, VOCAB)
    assert shape.intermediate_size == family.intermediate_size
    assert shape.n_experts == family.n_experts
    assert shape.hidden_act == family.act
    assert shape.tie_word_embeddings == family.tied


def test_embedding_rows_and_global_weights(built: Built) -> None:
    ids = [5, 0, VOCAB - 1, 5, 6, 7]
    live_embed = built.live.get_input_embeddings().weight
    rows = built.adapter.embedding_rows(ids)
    assert rows.dtype == torch.float32
    assert torch.equal(rows, live_embed[ids])
    globals_ = built.adapter.global_weights()
    assert torch.equal(globals_["embed"], live_embed)
    assert torch.equal(globals_["lm_head"], built.live.get_output_embeddings().weight)
    assert (globals_["lm_head"] is globals_["embed"]) == built.adapter.shape.tie_word_embeddings
    final_norm = built.live.get_submodule(built.adapter.mlp_module_path(0).split(".layers.")[0] + ".norm")
    if "final_norm" in globals_:
        torch.testing.assert_close(globals_["final_norm"], final_norm(torch.ones(1, D))[0], rtol=1e-5, atol=1e-5)
    else:  # OLMo: the final LayerNorm has no weight at all
        assert not list(final_norm.parameters())


def test_block_prefix_names_that_blocks_tensors(built: Built) -> None:
    names = built.adapter.checkpoint.tensor_names()
    for layer in range(LAYERS):
        prefix = built.adapter.block_prefix(layer)
        assert prefix.endswith(f"layers.{layer}.")
        assert sum(name.startswith(prefix) for name in names) >= 5


# -- MLPs --------------------------------------------------------------------------------------------------------


def test_mlp_matches_what_the_live_module_computes(built: Built) -> None:
    act = built.adapter.shape.hidden_act
    torch.manual_seed(1)
    x = torch.randn(5, D)
    for layer in range(LAYERS):
        module = built.live.get_submodule(built.adapter.mlp_module_path(layer))
        glus = built.adapter.mlp(layer)
        assert all(w.gate.dtype == torch.float32 for w in glus)
        with torch.no_grad():
            if not hasattr(module, "experts"):
                assert len(glus) == 1
                torch.testing.assert_close(_glu(glus[0], x, act), module(x), rtol=1e-5, atol=1e-5)
                continue
            n = built.adapter.shape.n_experts
            for expert in range(n):  # route every token to this one expert with weight 1
                index = torch.full((5, 1), expert)
                live_out = module.experts(x, index, torch.ones(5, 1))
                torch.testing.assert_close(_glu(glus[expert], x, act), live_out, rtol=1e-5, atol=1e-5)
            if hasattr(module, "shared_expert"):
                assert len(glus) == n + 1
                torch.testing.assert_close(_glu(glus[n], x, act), module.shared_expert(x), rtol=1e-5, atol=1e-5)
            else:
                assert len(glus) == n


def test_mlp_weights_are_the_live_parameters(built: Built) -> None:
    for layer in range(LAYERS):
        module = built.live.get_submodule(built.adapter.mlp_module_path(layer))
        glus = built.adapter.mlp(layer)
        if hasattr(module, "experts"):  # transformers 5 fuses experts in memory: gate_up_proj[e] is gate rows, up rows
            for expert, glu in enumerate(glus[: built.adapter.shape.n_experts]):
                assert torch.equal(torch.cat([glu.gate, glu.up]), module.experts.gate_up_proj[expert])
                assert torch.equal(glu.down, module.experts.down_proj[expert])
        elif hasattr(module, "gate_up_proj"):  # Phi-3: the fused weight is gate rows then up rows
            assert torch.equal(torch.cat([glus[0].gate, glus[0].up]), module.gate_up_proj.weight)
            assert glus[0].gate.shape == glus[0].up.shape == (H, D)
        else:
            assert torch.equal(glus[0].gate, module.gate_proj.weight)
            assert torch.equal(glus[0].up, module.up_proj.weight)
        if not hasattr(module, "experts"):
            assert torch.equal(glus[0].down, module.down_proj.weight)


def test_block_weights_agree_with_mlp(built: Built) -> None:
    for layer in range(LAYERS):
        weights = built.adapter.block_weights(layer)
        glus = built.adapter.mlp(layer)
        module = built.live.get_submodule(built.adapter.mlp_module_path(layer))
        if hasattr(module, "experts"):
            n = built.adapter.shape.n_experts
            prefixes = [f"experts.{e}." for e in range(n)] + (["shared_expert."] if len(glus) > n else [])
            assert torch.equal(weights["router"], module.gate.weight)
            if hasattr(module, "shared_expert_gate"):
                assert torch.equal(weights["shared_router"], module.shared_expert_gate.weight)
        else:
            prefixes = [""]
        assert len(prefixes) == len(glus)
        for prefix, glu in zip(prefixes, glus):
            for part in ("gate", "up", "down"):
                assert torch.equal(weights[f"{prefix}{part}"], getattr(glu, part))


# -- attention ---------------------------------------------------------------------------------------------------


def test_attention_projections_are_the_live_ones(built: Built) -> None:
    attn = _layer(built, 0).self_attn
    weights = built.adapter.block_weights(0)
    assert weights["q"].shape == (32, D) and weights["k"].shape == (16, D) and weights["v"].shape == (16, D)
    if hasattr(attn, "qkv_proj"):  # Phi-3: q rows, then k rows, then v rows
        assert torch.equal(torch.cat([weights["q"], weights["k"], weights["v"]]), attn.qkv_proj.weight)
    else:
        for role in ("q", "k", "v"):
            assert torch.equal(weights[role], getattr(attn, f"{role}_proj").weight)
            bias = getattr(attn, f"{role}_proj").bias
            assert (f"{role}_bias" in weights) == (bias is not None)
            if bias is not None:
                assert torch.equal(weights[f"{role}_bias"], bias)
    assert torch.equal(weights["o"], attn.o_proj.weight)


# -- norms -------------------------------------------------------------------------------------------------------


def _trace(built: Built, layer: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every submodule of `layer` during one forward pass of the whole model."""
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def recorder(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            inp = args[0] if args else kwargs["hidden_states"]
            seen[name] = (inp, output[0] if isinstance(output, tuple) else output)

        return hook

    handles = [m.register_forward_hook(recorder(n), with_kwargs=True) for n, m in layer.named_modules() if n]
    try:
        with torch.no_grad():
            built.live(input_ids=torch.tensor([[3, 17, 42, 99, 5, 64]]))
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.numel() == b.numel() and torch.allclose(a.flatten(), b.flatten(), atol=1e-6)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to a reordering: q/k norms see the projection reshaped, and some families transpose it first."""
    return _same(a.flatten().sort().values, b.flatten().sort().values)


# What each norm role means, stated as a fact about one forward pass: (norm input, norm output, traced dict) -> bool.
NORM_SEMANTICS: dict[str, Callable[[torch.Tensor, torch.Tensor, dict], bool]] = {
    "attn_norm": lambda x, y, t: _same(y, t["self_attn"][0]),
    "mlp_norm": lambda x, y, t: _same(y, t["mlp"][0]),
    "post_attn_norm": lambda x, y, t: _same(x, t["self_attn"][1]),
    "post_mlp_norm": lambda x, y, t: _same(x, t["mlp"][1]),
    "q_norm": lambda x, y, t: _same_values(x, t["self_attn.q_proj"][1]),
    "k_norm": lambda x, y, t: _same_values(x, t["self_attn.k_proj"][1]),
}


def test_norms_are_the_effective_multipliers_of_the_right_modules(built: Built) -> None:
    family = FAMILIES[built.name]
    layer = _layer(built, 0)
    trace = _trace(built, layer)
    weights = built.adapter.block_weights(0)
    norm_modules = {n: m for n, m in layer.named_modules() if "Norm" in type(m).__name__ and list(m.parameters())}
    assert set(weights) & set(NORM_SEMANTICS) == family.norm_roles
    assert len(norm_modules) == len(family.norm_roles)  # no weighted norm is left without a role
    for role in family.norm_roles:
        matches = [n for n in norm_modules if NORM_SEMANTICS[role](*trace[n], trace)]
        assert len(matches) == 1, (role, matches)
        module = norm_modules[matches[0]]
        size = weights[role].shape[0]
        # An RMSNorm of a vector of ones is its multiplier (up to 1/sqrt(1 + eps)).
        effective = module(torch.ones(1, size))[0].detach()
        torch.testing.assert_close(weights[role], effective, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family_name", sorted(GEMMA_FAMILIES))
def test_gemma_norms_add_one_to_the_stored_weight(family_name: str, tmp_path: Path) -> None:
    save_random(FAMILIES[family_name].config(), tmp_path)
    adapter = adapter_for(open_checkpoint(tmp_path))
    stored = adapter.checkpoint.get(f"{adapter.block_prefix(1)}input_layernorm.weight")
    assert torch.equal(adapter.block_weights(1)["attn_norm"], stored + 1.0)
    assert not torch.allclose(stored, stored + 1.0)


# -- other layouts -----------------------------------------------------------------------------------------------


def _resave_in_memory_layout(built: Built, folder: Path, drop: tuple[str, ...] = ()) -> None:
    """Write the live state_dict as is: transformers 5's in-memory names (fused experts, model.language_model)."""
    folder.mkdir()
    state = {k: v.contiguous() for k, v in built.live.state_dict().items() if k not in drop}
    save_file(state, str(folder / "model.safetensors"))
    shutil.copy(built.folder / "config.json", folder / "config.json")


@pytest.mark.parametrize("family_name", ["mixtral", "qwen2_moe"])
def test_fused_expert_layout_reads_the_same_experts(family_name: str, tmp_path: Path) -> None:
    save_random(FAMILIES[family_name].config(), tmp_path / "saved")
    live = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    saved = adapter_for(open_checkpoint(tmp_path / "saved"))
    _resave_in_memory_layout(Built(family_name, tmp_path / "saved", saved, live), tmp_path / "fused")
    fused = adapter_for(open_checkpoint(tmp_path / "fused"))
    fused_shape = fused.checkpoint.shape("model.layers.0.mlp.experts.gate_up_proj")
    assert fused_shape == (4, 2 * saved.shape.intermediate_size, D)
    assert not any("experts.0." in name for name in fused.checkpoint.tensor_names())
    for layer in range(LAYERS):
        expected, got = saved.block_weights(layer), fused.block_weights(layer)
        assert set(got) == set(expected)
        for role in expected:
            assert torch.equal(got[role], expected[role]), role
        for a, b in zip(saved.mlp(layer), fused.mlp(layer), strict=True):
            assert torch.equal(a.gate, b.gate) and torch.equal(a.up, b.up) and torch.equal(a.down, b.down)


def test_gemma3_multimodal_in_memory_names(tmp_path: Path) -> None:
    save_random(gemma3_multimodal(), tmp_path / "saved")
    live = AutoModelForCausalLM.from_pretrained(tmp_path / "saved").eval()
    saved = adapter_for(open_checkpoint(tmp_path / "saved"))
    assert saved.block_prefix(0) == "language_model.model.layers.0."
    # lm_head shares the embedding's storage (tied), which safetensors will not write twice.
    built = Built("gemma3", tmp_path / "saved", saved, live)
    _resave_in_memory_layout(built, tmp_path / "mem", drop=("lm_head.weight",))
    mem = adapter_for(open_checkpoint(tmp_path / "mem"))
    assert mem.block_prefix(0) == "model.language_model.layers.0."
    assert mem.mlp_module_path(0) == saved.mlp_module_path(0) == "model.language_model.layers.0.mlp"
    assert torch.equal(mem.mlp(1)[0].down, saved.mlp(1)[0].down)
    assert torch.equal(mem.embedding_rows([4, 9]), saved.embedding_rows([4, 9]))


# -- refusals ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama-src")
    save_random(FAMILIES["llama"].config(), folder)
    return folder


def _edited(source: Path, target: Path, **changes: Any) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_config_defaults_and_legacy_values_follow_transformers(tmp_path: Path) -> None:
    """Hub configs omit defaulted keys and carry legacy values; dims and activations must be what transformers uses."""
    save_random(FAMILIES["gemma"].config(), tmp_path / "src")
    folder = _edited(tmp_path / "src", tmp_path / "m", hidden_act="gelu")  # Gemma 1's legacy value, meaning tanh gelu
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]  # GemmaConfig defaults to tied
    (folder / "config.json").write_text(json.dumps(config))
    shape = adapter_for(open_checkpoint(folder)).shape
    assert shape.hidden_act == "gelu_pytorch_tanh"
    assert shape.tie_word_embeddings


def test_every_row_of_the_family_table_is_tested_and_claims_its_model_types_once() -> None:
    # The parametrised tests above build one tiny model per key of tests.tiny_models.FAMILIES: a row added to
    # the adapter table without a tiny model would go untested.
    claimed = [model_type for family in ADAPTER_FAMILIES for model_type in family.model_types]
    assert len(claimed) == len(set(claimed))
    assert set(claimed) == set(FAMILIES)


def test_weights_relabelled_as_another_model_type_are_refused(llama_folder: Path, tmp_path: Path) -> None:
    """A model_type without a family row is read off transformers' module tree, which finds none of its tensors."""
    folder = _edited(llama_folder, tmp_path / "m", model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match=r"stores no token embedding \(the model's transformer\.wte\.weight\)"):
        adapter_for(open_checkpoint(folder))


def test_unsupported_head_of_a_known_family(llama_folder: Path, tmp_path: Path) -> None:
    folder = _edited(llama_folder, tmp_path / "m", architectures=["LlamaForSequenceClassification"])
    with pytest.raises(UnsupportedArchitectureError, match="LlamaForSequenceClassification is not supported"):
        adapter_for(open_checkpoint(folder))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": 48}, r"model\.embed_tokens\.weight has shape \(128, 32\) but config\.json implies \(128, 48"),
        ({"vocab_size": 100}, r"model\.embed_tokens\.weight has shape \(128, 32\) but config\.json implies \(100, 32"),
        ({"intermediate_size": 48}, r"mlp\.gate_proj\.weight has shape \(64, 32\) but config\.json implies \(48, 32\)"),
        ({"num_key_value_heads": 4}, r"self_attn\.k_proj\.weight has shape \(16, 32\) but config\.json implies \(32,"),
        ({"num_hidden_layers": 3}, r"num_hidden_layers=3 but the checkpoint stores blocks 0\.\.1"),
        ({"num_hidden_layers": 1}, r"num_hidden_layers=1 but the checkpoint stores blocks 0\.\.1"),
        ({"hidden_size": "wide"}, r"config\.json is not a valid llama config"),
    ],
)
def test_config_that_disagrees_with_the_tensors(
    llama_folder: Path, tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    ckpt = open_checkpoint(_edited(llama_folder, tmp_path / "m", **changes))
    with pytest.raises(CheckpointError, match=message):
        adapter_for(ckpt)


def test_expert_count_that_disagrees_with_the_router(tmp_path: Path) -> None:
    save_random(FAMILIES["mixtral"].config(), tmp_path / "src")
    folder = _edited(tmp_path / "src", tmp_path / "m", num_local_experts=3)
    with pytest.raises(CheckpointError, match=r"block_sparse_moe\.gate\.weight has shape \(4, 32\) .* \(3, 32\)"):
        adapter_for(open_checkpoint(folder))


def test_missing_block_tensor(llama_folder: Path, tmp_path: Path) -> None:
    shutil.copytree(llama_folder, tmp_path / "m")
    ckpt = open_checkpoint(tmp_path / "m")
    state = {n: ckpt.get(n) for n in ckpt.tensor_names() if n != "model.layers.1.mlp.up_proj.weight"}
    save_file(state, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"has no tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        adapter_for(open_checkpoint(tmp_path / "m"))


def test_untied_config_without_an_output_head(tmp_path: Path) -> None:
    save_random(FAMILIES["qwen2"].config(), tmp_path / "src")  # tied: no lm_head.weight stored
    folder = _edited(tmp_path / "src", tmp_path / "m", tie_word_embeddings=False)
    with pytest.raises(CheckpointError, match=r"tie_word_embeddings is false\) but there is no lm_head\.weight"):
        adapter_for(open_checkpoint(folder))
