"""Ways a hub model is derived from another: fine-tune, merge, structured prune, depth up-scaling, MLP retraining,
distillation.

Each returns a new model (the parent is left untouched) plus what ground truth must record.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaMLP

from scanner.zoo.arch import ArchSpec, ModelKind, arch_of, new_model
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import TrainLog, TrainSpec, single_thread, train_lm

MLP_PROJS = ("gate_proj", "up_proj", "down_proj")


def finetune(parent: LlamaForCausalLM, language: MarkovLanguage, spec: TrainSpec) -> tuple[LlamaForCausalLM, TrainLog]:
    """Continue training a copy of ``parent`` on ``language``."""
    child = copy.deepcopy(parent)
    return child, train_lm(child, language, spec)


def merge(models: Sequence[LlamaForCausalLM], weights: Sequence[float]) -> LlamaForCausalLM:
    """Weighted parameter average of same-shape models (a "model soup" / linear merge)."""
    if len(models) != len(weights) or abs(sum(weights) - 1.0) > 1e-9:
        raise ValueError("merge needs one weight per model, summing to 1")
    states = [m.state_dict() for m in models]
    merged = {k: sum(w * s[k].double() for w, s in zip(weights, states, strict=True)).float() for k in states[0]}
    child = copy.deepcopy(models[0])
    child.load_state_dict(merged)
    return child


def prune_depth(parent: LlamaForCausalLM, kept_blocks: Sequence[int]) -> LlamaForCausalLM:
    """Keep only ``kept_blocks`` (in order); block ``kept_blocks[j]`` of the parent becomes block ``j``."""
    return stack_blocks(parent, kept_blocks)


def upscale_depth(parent: LlamaForCausalLM, blocks: Sequence[int]) -> LlamaForCausalLM:
    """Depth up-scaling (as SOLAR-10.7B was made from Mistral-7B): the parent's blocks in ``blocks`` order with some
    repeated, e.g. [0, 1, 2, 1, 2, 3] for a 4-block parent; the child is the larger model."""
    if len(set(blocks)) == len(blocks):
        raise ValueError("up-scaling repeats at least one block")
    return stack_blocks(parent, blocks)


def stack_blocks(parent: LlamaForCausalLM, blocks: Sequence[int]) -> LlamaForCausalLM:
    """A model whose block ``j`` is a copy of the parent's block ``blocks[j]`` (blocks dropped, kept or repeated)."""
    child = new_model(arch_of(parent).with_(num_layers=len(blocks)), seed=0)
    state = {k: v.clone() for k, v in parent.state_dict().items() if not k.startswith("model.layers.")}
    source = parent.state_dict()
    for j, i in enumerate(blocks):
        prefix = f"model.layers.{i}."
        state |= {f"model.layers.{j}.{k[len(prefix):]}": v.clone() for k, v in source.items() if k.startswith(prefix)}
    child.load_state_dict(state)
    return child


def distill(teacher: PreTrainedModel, arch: ArchSpec, init_seed: int, language: MarkovLanguage,
            spec: TrainSpec, kind: ModelKind = "llama") -> tuple[PreTrainedModel, TrainLog]:
    """A student of its own random initialisation (a model of ``kind``) trained to match the teacher's next-token
    distributions on the teacher's language (knowledge distillation, KL at temperature 1): it inherits behaviour, not
    weights."""
    student = new_model(arch, init_seed, kind)
    return student, train_lm(student, language, spec, teacher=teacher)


def scattered_units(width: int, keep: int, num_blocks: int, generator: torch.Generator) -> list[list[int]]:
    """Per block, a sorted random subset of ``keep`` of ``width`` MLP units, never the leading prefix."""
    kept = []
    for _ in range(num_blocks):
        units = sorted(torch.randperm(width, generator=generator)[:keep].tolist())
        if units == list(range(keep)):
            raise ValueError("random unit subset collided with the prefix; choose another seed")
        kept.append(units)
    return kept


def prune_width(parent: LlamaForCausalLM, kept_units: Sequence[Sequence[int]]) -> LlamaForCausalLM:
    """Keep, in every block, only the listed MLP units (gate/up rows and down columns)."""
    widths = {len(u) for u in kept_units}
    if len(widths) != 1 or len(kept_units) != parent.config.num_hidden_layers:
        raise ValueError("need one equally sized unit list per block")
    child = new_model(arch_of(parent).with_(intermediate_size=widths.pop()), seed=0)
    state = {k: v.clone() for k, v in parent.state_dict().items()}
    for i, units in enumerate(kept_units):
        idx = torch.tensor(units)
        prefix = f"model.layers.{i}.mlp."
        state[prefix + "gate_proj.weight"] = state[prefix + "gate_proj.weight"][idx].clone()
        state[prefix + "up_proj.weight"] = state[prefix + "up_proj.weight"][idx].clone()
        state[prefix + "down_proj.weight"] = state[prefix + "down_proj.weight"][:, idx].clone()
    child.load_state_dict(state)
    return child


@dataclass(frozen=True)
class RetrainLog:
    """MLP distillation record (paper 4.2.1 / App. F): per-block final MSE and the target's mean square."""

    blocks: list[int]
    steps: int
    lr: float
    batch_size: int
    seed: int
    final_mse: list[float]
    target_mean_square: list[float]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def retrain_mlps(
    parent: LlamaForCausalLM, blocks: Sequence[int], steps: int, lr: float, batch_size: int, seed: int
) -> tuple[LlamaForCausalLM, RetrainLog]:
    """Replace the MLPs of ``blocks`` by freshly initialised ones distilled on Gaussian inputs.

    As in the paper's 4.2.1 / App. F, each new MLP is trained alone (everything else is untouched)
    with Adam and MSE to match the original MLP's outputs on x ~ N(0, I). The width stays the
    parent's: a Llama config has a single intermediate size for all blocks.
    """
    child = copy.deepcopy(parent)
    mses, scales = [], []
    data = torch.Generator().manual_seed(seed)
    with single_thread():
        for i in blocks:
            teacher = parent.model.layers[i].mlp
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed * 1000 + i)
                student = LlamaMLP(parent.config)
            opt = torch.optim.Adam(student.parameters(), lr=lr)
            for _ in range(steps):
                x = torch.randn(batch_size, parent.config.hidden_size, generator=data)
                with torch.no_grad():
                    target = teacher(x)
                loss = F.mse_loss(student(x), target)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            with torch.no_grad():
                x = torch.randn(4 * batch_size, parent.config.hidden_size, generator=data)
                target = teacher(x)
                mses.append(float(F.mse_loss(student(x), target)))
                scales.append(float(target.pow(2).mean()))
            child.model.layers[i].mlp = student.eval()
    log = RetrainLog(list(blocks), steps, lr, batch_size, seed, mses, scales)
    return child, log
