"""Which model types of the installed transformers hubtrace reads, and why it refuses the others.

Three tables, one per kind of language model (`scanner.reading.architectures.tasks`): the causal LMs, the
image-text-to-text checkpoints (whose language model is read), and the encoder masked LMs. Computed, not listed: each
model type's own config class, its sizes shrunk (`tiny_config`), is built on the meta device by the auto class of its
kind and its layers are searched for MLP sites exactly as a scan does. `hubtrace architectures` prints the result and
docs/architectures.md is generated from it, so the tables cannot drift from the code.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    MODEL_FOR_MASKED_LM_MAPPING_NAMES,
)
from transformers.utils import logging as hf_logging

from scanner.reading.architectures.module_tree import decoder_stack, meta_model, not_decoder_only
from scanner.reading.architectures.names import UNVERIFIED
from scanner.reading.architectures.sites import find_sites
from scanner.reading.architectures.tasks import Task, encoder_decoder_by_default, model_task
from scanner.reading.architectures.tiny import tiny_config

Verdict = Literal["gated", "plain", "moe", "hybrid", "refused"]
#: Why a refused model type is no language model of its table's kind with an MLP, so outside the share hubtrace aims
#: to cover: an encoder-decoder, an encoder in the causal table, a model with no MLP, or a type whose config makes it
#: another kind (read in that kind's table).
OutOfScope = Literal["encoder-decoder", "encoder", "no MLP", "another kind"]

#: The tables, in order, with the auto mapping that lists each one's model types and its heading.
TASKS: dict[Task, tuple[dict[str, str], str]] = {
    "causal-lm": (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, "Causal language models"),
    "image-text-to-text": (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                           "Image-text-to-text models (the language model inside)"),
    "masked-lm": (MODEL_FOR_MASKED_LM_MAPPING_NAMES, "Encoder masked language models (read bidirectionally)"),
}
#: What the supported share of each table counts.
_IN_SCOPE_WORDS: dict[Task, str] = {
    "causal-lm": "decoder-only causal-LM model types with an MLP",
    "image-text-to-text": "image-text-to-text model types whose language model is decoder-only with an MLP",
    "masked-lm": "encoder masked-LM model types with an MLP",
}


@dataclass(frozen=True)
class Coverage:
    """One model type's verdict in one table: a supported kind, or refused with a one-line reason (and, when it is no
    language model of the table's kind with an MLP, which kind of model it is instead)."""

    model_type: str
    verdict: Verdict
    reason: str
    out_of_scope: OutOfScope | None = None
    task: Task = "causal-lm"

    @property
    def supported(self) -> bool:
        return self.verdict != "refused"


def causal_lm_types() -> list[str]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return model_types("causal-lm")


def model_types(task: Task) -> list[str]:
    """Every model type the installed transformers lists for this kind, sorted."""
    return sorted(TASKS[task][0])


def classify(model_type: str, task: Task = "causal-lm") -> Coverage:
    """Build the tiny model of this kind on the meta device and find its MLP sites as a scan would."""

    def refused(reason: str, out_of_scope: OutOfScope | None = None) -> Coverage:
        return Coverage(model_type, "refused", reason, out_of_scope, task)

    if encoder_decoder_by_default(model_type):
        return refused("encoder-decoder: hubtrace reads decoder-only and encoder-only language models",
                       "encoder-decoder")
    if model_type in UNVERIFIED:
        return refused(f"not verified: {UNVERIFIED[model_type]}")
    try:
        config = tiny_config(model_type)
        read_as = model_task(config) if task != "causal-lm" else task
        if read_as != task and not (task == "image-text-to-text" and read_as == "causal-lm"):
            return refused(f"read as a {read_as.replace('-', ' ')} (its {TASKS[task][0][model_type]} is also its "
                           f"{read_as} class): see that table", "another kind")
        with warnings.catch_warnings(), _quiet():
            warnings.simplefilter("ignore")
            lm = meta_model(config, read_as)  # a VLM whose class is also a causal LM's (Gemma 3) is built as that
        stack = decoder_stack(lm)
    except Exception as exc:  # transformers raises anything from a config it cannot build at tiny sizes
        return refused(f"transformers does not build it from its own config: {_first(exc)}")
    layer_class = type(stack.layers[0]).__name__
    reason = not_decoder_only(lm.config, stack) if task != "masked-lm" else None
    if reason:
        if reason.startswith("encoder-decoder"):
            return refused(reason, "encoder-decoder")
        return refused(f"an encoder ({layer_class} under {stack.layers_path}): read bidirectionally, as a masked LM "
                       "(see that table), not as a decoder", "encoder")
    sites = [find_sites(layer) for layer in stack.layers]
    if not any(sites):
        return refused(f"no feed-forward network (MLP) in any of its layers ({layer_class})", "no MLP")
    kinds = {site.kind for layer in sites for site in layer}
    if len(kinds) > 1:
        return refused("mixes gated and plain MLPs")
    experts = any(site.experts for layer in sites for site in layer)
    hybrid = not all(sites)
    verdict: Verdict = "hybrid" if hybrid else "moe" if experts else kinds.pop()
    return Coverage(model_type, verdict, _describe(sites), None, task)


def coverage(task: Task = "causal-lm") -> Iterator[Coverage]:
    """`classify` for every model type of one kind."""
    for model_type in model_types(task):
        yield classify(model_type, task)


def all_coverage() -> list[Coverage]:
    """Every table's rows, the causal LMs first."""
    return [row for task in TASKS for row in coverage(task)]


def coverage_summary(rows: list[Coverage], task: Task) -> str:
    """One table's headline: the share supported, and what the rest are."""
    mine = [r for r in rows if r.task == task]
    in_scope = [r for r in mine if r.out_of_scope is None]
    supported = [r for r in in_scope if r.supported]
    outside = Counter(r.out_of_scope for r in mine if r.out_of_scope is not None)
    rest = (f"; the other {len(mine) - len(in_scope)} are " + ", ".join(f"{n} {kind}" for kind, n in
                                                                        sorted(outside.items()))
            if outside else "")
    return (f"**{len(supported)} of {len(in_scope)}** ({100 * len(supported) / max(len(in_scope), 1):.1f}%) "
            f"{_IN_SCOPE_WORDS[task]} are supported. The installed transformers lists {len(mine)} such model "
            f"types{rest}")


def coverage_markdown(rows: list[Coverage]) -> str:
    """docs/architectures.md: per table, the share supported, then one row per model type (hub text never enters
    it)."""
    lines = [
        "# Architectures",
        "",
        "Generated by `hubtrace architectures --markdown` from the installed transformers; do not edit by hand.",
        "Every supported type is checked end to end (a noisy copy tests dependent, an independent model does not) "
        "by `tests/test_architectures.py`.",
    ]
    for task, (_, heading) in TASKS.items():
        lines += ["", f"## {heading}", "", coverage_summary(rows, task) + " (refused with that reason).", "",
                  "| model_type | verdict | MLP sites found (or why refused) |", "| --- | --- | --- |"]
        lines += [f"| `{r.model_type}` | {r.verdict} | {r.reason.replace('|', '/')} |" for r in rows if r.task == task]
    return "\n".join(lines) + "\n"


def _describe(sites: list[list]) -> str:
    first = next(layer for layer in sites if layer)
    parts = []
    for site in first:
        where = site.path or "(the layer)"
        if site.experts:
            parts.append(f"{where}: {site.experts} experts, {site.kind}" + (f", {site.fused}" if site.fused else "")
                         + (", transposed" if site.transposed else ""))
        else:
            maps = "/".join(n for n in (site.gate, site.up, site.down) if n)
            parts.append(f"{where}: {maps}" + (f" (fused {site.fused})" if site.fused else ""))
    skipped = sum(1 for layer in sites if not layer)
    tail = f"; {skipped} of {len(sites)} tiny layers hold no MLP" if skipped else ""
    return "; ".join(parts) + tail


def _first(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


class _quiet:
    """transformers' warnings off while a tiny model is built."""

    def __enter__(self) -> None:
        self._level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()

    def __exit__(self, *_: object) -> None:
        hf_logging.set_verbosity(self._level)
