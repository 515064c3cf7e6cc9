"""A model zoo with ground truth: tiny Llama families (bases, fine-tunes, merges, prunes, MLP
retrains, T1-T6 camouflage) trained on synthetic languages, written as Hugging Face directories
with model cards, so the independence tests can be checked against known lineage."""

from scanner.declared.cards import read_card
from scanner.zoo.arch import ArchSpec, load_model
from scanner.zoo.build import (
    GROUND_TRUTH,
    RELATIONS,
    ZOO_VERSION,
    ChainSpec,
    IndependentSpec,
    Zoo,
    ZooModel,
    ZooSpec,
    build_chain,
    build_zoo,
    train_independent_models,
)
from scanner.zoo.camouflage import max_logit_diff
from scanner.zoo.cards import classify_card

__all__ = [
    "GROUND_TRUTH",
    "RELATIONS",
    "ZOO_VERSION",
    "ArchSpec",
    "ChainSpec",
    "IndependentSpec",
    "Zoo",
    "ZooModel",
    "ZooSpec",
    "build_chain",
    "build_zoo",
    "classify_card",
    "load_model",
    "max_logit_diff",
    "read_card",
    "train_independent_models",
]
