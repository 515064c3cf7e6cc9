"""Model surgery people publish, beside plain pruning and up-scaling (scanner.zoo.derivations): block expansion (new
blocks inserted as identities and trained alone, as LLaMA Pro was made), a depth prune that drops the block whose
output is most like its input (angular distance, Gromov et al.'s "unreasonable ineffectiveness of the deeper
layers"), and pruned models healed by distillation from their parent rather than by more training on the data."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from transformers import LlamaForCausalLM

from scanner.zoo.derivations import stack_blocks
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import EVAL_DATA_SEED, single_thread


def expand_blocks(parent: LlamaForCausalLM, after: Sequence[int]) -> tuple[LlamaForCausalLM, list[int]]:
    """The parent with a copy of block i inserted after each block i in ``after``, its attention output and MLP down
    projections zeroed so that it adds nothing yet (the model computes what the parent computes); returns the model
    and the indices of the inserted blocks, the ones a block expansion then trains."""
    order, inserted = [], []
    for i in range(parent.config.num_hidden_layers):
        order.append(i)
        if i in after:
            inserted.append(len(order))
            order.append(i)
    child = stack_blocks(parent, order)
    with torch.no_grad():
        for j in inserted:
            child.model.layers[j].self_attn.o_proj.weight.zero_()
            child.model.layers[j].mlp.down_proj.weight.zero_()
    return child, inserted


@torch.no_grad()
def angular_distances(model: LlamaForCausalLM, language: MarkovLanguage, n_seq: int = 16) -> list[float]:
    """Per block, the mean angular distance (arccos of the cosine, over pi) between the hidden state entering it and
    the one leaving it, on a held-out batch of ``language``: the block that changes its input least is the one a
    prune by angular distance drops."""
    tokens = language.sample(n_seq, model.config.max_position_embeddings,
                             torch.Generator().manual_seed(EVAL_DATA_SEED))
    with single_thread():
        states = model.eval()(input_ids=tokens, output_hidden_states=True).hidden_states
    out = []
    for before, after in zip(states[:-1], states[1:]):
        cos = torch.nn.functional.cosine_similarity(before, after, dim=-1).clamp(-1.0, 1.0)
        out.append(float(torch.arccos(cos).mean()) / math.pi)
    return out
