"""Deterministic single-thread language-model training and evaluation on synthetic languages."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from scanner.zoo.languages import MarkovLanguage

Optimizer = Literal["adam", "sgd"]

EVAL_DATA_SEED = 987_654_321
"""Held-out batch seed: no training run uses it, so before/after losses are comparable across models."""


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread (bitwise-reproducible reductions), restoring the previous setting after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@dataclass(frozen=True)
class TrainSpec:
    """How to train: optimizer, step count, learning rate, batch size and the data-order seed."""

    steps: int
    lr: float
    optimizer: Optimizer = "adam"
    batch_size: int = 8
    data_seed: int = 0


@dataclass(frozen=True)
class TrainLog:
    """What a training run did, for ground truth: the recipe plus held-out loss before and after."""

    language_seed: int
    steps: int
    lr: float
    optimizer: str
    batch_size: int
    data_seed: int
    initial_loss: float
    final_loss: float

    def to_json(self) -> dict[str, float | int | str]:
        return asdict(self)


def lm_loss(model: PreTrainedModel, tokens: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats)."""
    logits = model(input_ids=tokens).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@torch.no_grad()
def eval_loss(model: PreTrainedModel, language: MarkovLanguage, n_seq: int = 32) -> float:
    """Held-out loss on a fixed batch of ``language`` (same batch for every model of that language)."""
    tokens = language.sample(n_seq, model.config.max_position_embeddings, torch.Generator().manual_seed(EVAL_DATA_SEED))
    return float(lm_loss(model.eval(), tokens))


def distillation_loss(student: PreTrainedModel, teacher: PreTrainedModel, tokens: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions, averaged over positions (nats)."""
    with torch.no_grad():
        target = F.log_softmax(teacher(input_ids=tokens).logits, dim=-1)
    predicted = F.log_softmax(student(input_ids=tokens).logits, dim=-1)
    return F.kl_div(predicted.flatten(0, 1), target.flatten(0, 1), log_target=True, reduction="batchmean")


def train_lm(
    model: PreTrainedModel,
    language: MarkovLanguage,
    spec: TrainSpec,
    params: Iterable[torch.nn.Parameter] | None = None,
    *,
    teacher: PreTrainedModel | None = None,
    after_step: Callable[[int], None] | None = None,
) -> TrainLog:
    """Train ``model`` in place on ``language`` (all parameters unless ``params`` is given): on the next token, or on
    ``teacher``'s next-token distributions when one is given (distillation). ``after_step(n)`` is called after the
    n-th step (a run that publishes checkpoints saves them there). Returns the log."""
    initial = eval_loss(model, language)
    trainable = list(model.parameters() if params is None else params)
    if spec.optimizer == "adam":
        opt: torch.optim.Optimizer = torch.optim.Adam(trainable, lr=spec.lr)
    else:
        opt = torch.optim.SGD(trainable, lr=spec.lr, momentum=0.9)
    data = torch.Generator().manual_seed(spec.data_seed)
    seq_len = model.config.max_position_embeddings
    model.train()
    with single_thread():
        for step in range(1, spec.steps + 1):
            tokens = language.sample(spec.batch_size, seq_len, data)
            loss = lm_loss(model, tokens) if teacher is None else distillation_loss(model, teacher.eval(), tokens)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            opt.step()
            if after_step is not None:
                after_step(step)
    model.eval()
    return TrainLog(
        language_seed=language.seed,
        steps=spec.steps,
        lr=spec.lr,
        optimizer=spec.optimizer,
        batch_size=spec.batch_size,
        data_seed=spec.data_seed,
        initial_loss=initial,
        final_loss=eval_loss(model, language),
    )
