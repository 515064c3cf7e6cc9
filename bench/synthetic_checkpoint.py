"""Random-weight checkpoints laid out like the Hub's (bf16 safetensors shards plus an index), for benches.

Any architecture transformers builds: the tensor names and shapes are those of the model transformers builds from
the shape's config (on the meta device, so nothing is allocated). Shards are written one at a time, so the writer
holds at most one shard's tensors in memory.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

#: Llama-2-7B's shape (6.74e9 parameters) and TinyLlama-1.1B's, gated MLPs; Pythia-6.9B's and Pythia-1.4B's (GPT-NeoX),
#: plain MLPs of 4x width with biases: a 7B of each kind, about the same size.
SHAPES = {
    "7b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=11008,
               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
               hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=4096, rope_theta=10000.0),
    "1b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=2048, intermediate_size=5632,
               num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
               hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=4096, rope_theta=10000.0),
    "7b-plain": dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_size=4096,
                     intermediate_size=16384, num_hidden_layers=32, num_attention_heads=32, vocab_size=50432,
                     hidden_act="gelu", rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=2048),
    "1b-plain": dict(model_type="gpt_neox", architectures=["GPTNeoXForCausalLM"], hidden_size=2048,
                     intermediate_size=8192, num_hidden_layers=24, num_attention_heads=16, vocab_size=50304,
                     hidden_act="gelu", rotary_pct=0.25, use_parallel_residual=True, max_position_embeddings=2048),
    # Llama-3-70B's widths with 3 of its 80 layers (memory is per block): 8192 hidden, 28672 MLP units, 64 heads over
    # 8 key-value heads, a 128,256-token vocabulary.
    "70b": dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=8192, intermediate_size=28672,
                num_hidden_layers=3, num_attention_heads=64, num_key_value_heads=8, vocab_size=128256,
                hidden_act="silu", rms_norm_eps=1e-5, max_position_embeddings=8192, rope_theta=500000.0),
    # DeepSeek-V3's widths with one dense layer and one MoE layer of its 61 (3 dense, 58 MoE): MLA attention, 256
    # routed experts of 2048 units and a shared one, top-8 routing in 8 groups.
    "deepseek-v3": dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=7168,
                        intermediate_size=18432, moe_intermediate_size=2048, num_hidden_layers=2,
                        first_k_dense_replace=1, n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8,
                        n_group=8, topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True,
                        num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, head_dim=64, v_head_dim=128, vocab_size=129280,
                        hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=10000.0),
}
#: Values of a random tensor drawn and written at a time, so the writer holds no whole tensor.
_RANDOM_CHUNK = 1 << 24


def _tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every stored tensor's name and shape, as the model transformers builds from the config holds them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    settings = {k: v for k, v in config.items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config["model_type"], **settings))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _random_chunks(name: str, dims: tuple[int, ...], generator: torch.Generator) -> Iterator[bytes]:
    """A tensor's bf16 bytes, `_RANDOM_CHUNK` values at a time: norm weights 1, biases 0 (DeepSeek's router
    correction bias too), everything else N(0, 0.02)."""
    count = int(torch.Size(dims).numel())
    for start in range(0, count, _RANDOM_CHUNK):
        n = min(_RANDOM_CHUNK, count - start)
        if len(dims) == 1 and "norm" in name and name.endswith("weight"):
            values = torch.ones(n, dtype=torch.bfloat16)
        elif name.endswith("bias"):
            values = torch.zeros(n, dtype=torch.bfloat16)
        else:
            values = (0.02 * torch.randn(n, generator=generator)).to(torch.bfloat16)
        yield values.view(torch.uint8).numpy().tobytes()


def _write_shard(file: Path, shapes: dict[str, tuple[int, ...]], generator: torch.Generator) -> None:
    """A safetensors file of random bf16 tensors, written value chunk by value chunk (a 15 GB expert tensor never
    sits in memory): the header first, then each tensor's bytes in header order."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dims in shapes.items():
        nbytes = 2 * int(torch.Size(dims).numel())
        header[name] = {"dtype": "BF16", "shape": list(dims), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(file, "wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for name, dims in shapes.items():
            for chunk in _random_chunks(name, dims, generator):
                out.write(chunk)


def write_random_checkpoint(root: Path, shape: str, *, shard_bytes: int = 5 * 10**9, seed: int = 0) -> int:
    """Write config.json, model-0000k-of-0000n.safetensors and the index under root; returns the parameter count."""
    config = {**SHAPES[shape], "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    shapes = _tensor_shapes(config)
    shards: list[list[str]] = [[]]
    size = 0
    for name, dims in shapes.items():
        nbytes = 2 * int(torch.Size(dims).numel())
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    generator = torch.Generator().manual_seed(seed)
    weight_map = {}
    for k, names in enumerate(shards, start=1):
        filename = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        _write_shard(root / filename, {name: shapes[name] for name in names}, generator)
        weight_map |= dict.fromkeys(names, filename)
    total = sum(int(torch.Size(d).numel()) for d in shapes.values())
    index = {"metadata": {"total_size": 2 * total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return total


@contextmanager
def scratch_checkpoint(cache: Path, shape: str, *, shard_bytes: int = 5 * 10**9) -> Iterator[Path]:
    """A random checkpoint in a fresh folder under cache (its parent folder is yours too), deleted afterwards."""
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"random-{shape}-", dir=cache))
    try:
        start = time.perf_counter()
        params = write_random_checkpoint(work / "model", shape, shard_bytes=shard_bytes)
        shards = sorted((work / "model").glob("*.safetensors"))
        size = sum(f.stat().st_size for f in shards)
        print(f"wrote {params / 1e9:.2f}e9 parameters, {size / 1e9:.2f} GB in {len(shards)} shards "
              f"in {time.perf_counter() - start:.0f} s")
        yield work / "model"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def tiny_template(folder: Path, tokens: int):
    """A tiny random Llama's fingerprint on ``tokens`` canonical tokens: real metadata for synthetic fingerprints
    (tests.fixtures.synthetic), with nothing trained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from scanner.fingerprints.fingerprint import fingerprint_model
    from scanner.fingerprints.inputs import InputSpec

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=512)
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return fingerprint_model(folder, inputs=InputSpec(n_sequences=max(1, tokens // 64), seq_len=min(64, tokens)))
