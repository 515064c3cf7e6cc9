"""Every architecture hubtrace calls supported, checked end to end on a tiny random model of its own config class.

The coverage verdicts come from `scanner.architectures.coverage` (the data behind `hubtrace architectures`); each
supported type is built by transformers at tiny sizes, saved with save_pretrained, and fingerprinted through the scan's
own block-by-block path. A copy with small noise must test dependent and an independent initialisation must not.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from scanner.activations import site_activations
from scanner.architectures.coverage import classify, coverage, tiny_config
from scanner.architectures.sites import SiteWeights
from scanner.checkpoint import open_checkpoint
from scanner.errors import UnsupportedArchitectureError
from scanner.fingerprint import fingerprint_model
from scanner.fingerprint_compare import compare_fingerprints
from scanner.stats.independence import phi_match
from scanner.validate import validate_checkpoint

DEPENDENT = -20.0  # log10 p a noisy copy must reach (the bar)
INDEPENDENT = -3.0  # log10 p an independent model must stay above: 1e-3 false failures per type, so about one seed
# in ten would fail one of the ~106 types; the seeds are fixed (the smallest measured: -2.82)


def _save(model_type: str, folder: Path, seed: int, noise: float = 0.0) -> None:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type))
    if noise:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter) * noise)
    model.save_pretrained(folder)


def test_every_causal_lm_type_has_a_verdict_and_a_reason() -> None:
    rows = list(coverage())
    verdicts = {row.model_type: row for row in rows}
    assert all(row.reason for row in rows)
    assert verdicts["mamba"].verdict == "refused" and "no feed-forward" in verdicts["mamba"].reason
    assert verdicts["bert"].verdict == "refused" and "encoder" in verdicts["bert"].reason
    assert verdicts["gpt2"].verdict == "plain" and verdicts["falcon"].verdict == "plain"
    assert verdicts["granite"].verdict == "gated" and verdicts["glm4"].verdict == "gated"
    for moe in ("glm4_moe", "solar_open", "gpt_oss", "qwen3_moe"):
        assert verdicts[moe].verdict == "moe", moe
    assert verdicts["jamba"].verdict == "moe"  # Mamba and attention layers alike hold a feed-forward network
    assert "interleaved" in verdicts["gpt_oss"].reason and "transposed" in verdicts["gpt_oss"].reason
    assert sum(row.supported for row in rows) >= 100


def test_every_supported_type_tells_a_noisy_copy_from_an_independent_model(tmp_path: Path) -> None:
    supported = [row.model_type for row in coverage() if row.supported]
    failures = []
    for model_type in supported:
        folders = [tmp_path / f"{model_type}-{name}" for name in ("base", "copy", "other")]
        _save(model_type, folders[0], seed=0)
        _save(model_type, folders[1], seed=0, noise=0.002)
        _save(model_type, folders[2], seed=1)
        base, copy, other = (fingerprint_model(folder) for folder in folders)
        dependent = compare_fingerprints(base, copy).log10_p
        independent = compare_fingerprints(base, other).log10_p
        if not (dependent <= DEPENDENT and independent >= INDEPENDENT):
            failures.append(f"{model_type}: copy {dependent:.1f}, independent {independent:.2f}")
    assert not failures, failures
    assert len(supported) >= 100


def test_a_refused_architecture_is_one_clear_error(tmp_path: Path) -> None:
    for model_type, words in (("mamba", "no feed-forward"), ("deepseek_v3", "not verified")):
        _save(model_type, tmp_path / model_type, seed=0)
        with pytest.raises(UnsupportedArchitectureError, match=words) as caught:
            validate_checkpoint(tmp_path / model_type, check_values=False)
        assert "\n" not in str(caught.value)


def _gpt2(folder: Path, seed: int) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=128, vocab_size=128)).eval()
    model.save_pretrained(folder)
    return model


def test_plain_mlp_copy_with_permuted_units_in_conv1d_layout_tests_dependent(tmp_path: Path) -> None:
    """GPT-2 stores its MLP as Conv1D (weight (in, out)): permuting c_fc's output columns (and bias) with c_proj's
    rows leaves the function unchanged, and phi_MATCH on the plain views still pairs every unit."""
    model = _gpt2(tmp_path / "base", seed=0)
    ids = torch.arange(32).reshape(1, -1)
    before = model(ids).logits
    with torch.no_grad():
        for block in model.transformer.h:
            order = torch.randperm(block.mlp.c_fc.weight.shape[1])
            block.mlp.c_fc.weight.copy_(block.mlp.c_fc.weight[:, order])
            block.mlp.c_fc.bias.copy_(block.mlp.c_fc.bias[order])
            block.mlp.c_proj.weight.copy_(block.mlp.c_proj.weight[order])
    assert torch.allclose(model(ids).logits, before, atol=1e-4)
    model.save_pretrained(tmp_path / "permuted")
    _gpt2(tmp_path / "other", seed=1)
    base, permuted, other = (fingerprint_model(tmp_path / n) for n in ("base", "permuted", "other"))
    assert base.meta.mlp_kind == "plain"
    assert compare_fingerprints(base, permuted).log10_p <= DEPENDENT
    assert compare_fingerprints(base, other).log10_p >= INDEPENDENT


def test_plain_and_gated_fingerprints_are_refused_as_a_pair(tmp_path: Path) -> None:
    _gpt2(tmp_path / "gpt2", seed=0)
    _save("granite", tmp_path / "granite", seed=0)
    reason = fingerprint_model(tmp_path / "gpt2").comparable_with(fingerprint_model(tmp_path / "granite"))
    assert reason is not None and "plain" in reason and "gated" in reason


@pytest.mark.parametrize("coupling", [0.0, 0.8])
def test_plain_statistic_p_values_are_uniform_for_independent_mlps(coupling: float) -> None:
    """150 independent pairs of plain MLPs (fc 96 units, width 32) on their own residual inputs, the output column of
    each unit made to echo its input row (``coupling``, as trained GPT-2 neurons partly do): KS against uniform at
    alpha 0.01, so this test fails falsely once in a hundred seeds; the seed is fixed."""
    rng = np.random.default_rng(7)
    p_values = []
    for _ in range(150):
        views = []
        for _side in range(2):
            fc = torch.from_numpy(rng.standard_normal((96, 32))).float()
            proj = torch.from_numpy(rng.standard_normal((32, 96))).float() + coupling * fc.T
            x = torch.from_numpy(rng.standard_normal((256, 32))).float()
            views.append(site_activations(x, SiteWeights(up=fc, down=proj, up_bias=torch.zeros(96))))
        a, b = views
        p_values.append(10 ** phi_match(a.gate, a.up, b.gate, b.up).log10_p)
    assert kstest(p_values, "uniform").pvalue >= 0.01


def test_architectures_command_lists_every_type() -> None:
    out = subprocess.run([sys.executable, "-m", "jobs.cli.app", "architectures"], capture_output=True, text=True,
                         check=True).stdout
    assert "causal-LM model types supported" in out
    assert any(line.split()[:2] == ["gpt2", "plain"] for line in out.splitlines())
    checkpoint_types = {classify("gpt_oss").verdict, classify("mamba").verdict}
    assert checkpoint_types == {"moe", "refused"}


def test_docs_table_is_the_command_output() -> None:
    from scanner.architectures.coverage import coverage_markdown

    docs = Path(__file__).parent.parent / "docs" / "architectures.md"
    assert docs.read_text() == coverage_markdown(list(coverage())), "regenerate: hubtrace architectures --markdown"


def test_checkpoint_attention_choice_is_ignored(tmp_path: Path) -> None:
    """A config's attn_implementation (a Hub-style value would load a compiled kernel) never reaches transformers."""
    _gpt2(tmp_path / "m", seed=0)
    config_file = tmp_path / "m" / "config.json"
    config_file.write_text(config_file.read_text().replace('"activation_function"',
                                                           '"attn_implementation": "kernels-community/evil",\n'
                                                           '  "_attn_implementation": "kernels-community/evil",\n'
                                                           '  "activation_function"'))
    assert open_checkpoint(tmp_path / "m").config["attn_implementation"] == "kernels-community/evil"
    assert fingerprint_model(tmp_path / "m").meta.mlp_kind == "plain"
