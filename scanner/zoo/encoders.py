"""A zoo of tiny encoder masked LMs with known lineage, for the encoder statistic's validity and power.

BERT-style encoders (plain GELU MLPs, learned positions, post-LayerNorm) trained with a masked-LM objective on one
synthetic language (`scanner.zoo.languages`), each from its own seed and data order: independent models trained
alike, the hard case for validity. ModernBERT-style encoders (gated GeGLU MLPs, rotary positions, pre-norm) trained
the same way, for the gated statistic's validity on encoders. From the first BERT, three derivatives people make of
encoders:

* ``finetune``: more masked-LM training on another language (a domain-adapted encoder);
* ``sentence``: a sentence-transformers-style embedding model: the encoder under mean pooling, trained with an
  in-batch contrastive loss (InfoNCE) on two noisy views of each sequence, saved as sentence-transformers saves it
  (the bare encoder, `modules.json` and a pooling config beside it);
* ``pruned``: a quarter of every MLP's units removed (those with the smallest weights), the config's
  intermediate size shrunk to match.

Built once under one folder (about a minute on one thread) and reused while the spec is unchanged; `encoders.json`
is written last and names every model with its relation.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, BertModel, ModernBertConfig, ModernBertForMaskedLM

from scanner.zoo.build import _exclusive
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import single_thread

GROUND_TRUTH = "encoders.json"
#: Token ids: the language's 256, then [MASK] and [PAD].
LANGUAGE_VOCAB = 256
MASK_ID, PAD_ID = 256, 257


@dataclass(frozen=True)
class EncoderZooSpec:
    """What the zoo is trained from; a different spec builds a new zoo."""

    independent: int = 8
    gated_independent: int = 8
    hidden: int = 64
    layers: int = 4
    intermediate: int = 256
    seq_len: int = 64
    steps: int = 400
    lr: float = 1e-3
    derivative_steps: int = 150
    prune_fraction: float = 0.25
    language_seed: int = 11
    version: int = 1

    def config(self) -> BertConfig:
        return BertConfig(vocab_size=LANGUAGE_VOCAB + 2, hidden_size=self.hidden, num_hidden_layers=self.layers,
                          num_attention_heads=4, intermediate_size=self.intermediate,
                          max_position_embeddings=self.seq_len, pad_token_id=PAD_ID, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)

    def gated_config(self) -> ModernBertConfig:
        """ModernBERT at the same width, half the units per view (its Wi holds gate and up), global attention in
        every layer, no dropout."""
        special = {key: PAD_ID for key in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id",
                                           "sep_token_id")}
        return ModernBertConfig(vocab_size=LANGUAGE_VOCAB + 2, hidden_size=self.hidden, num_hidden_layers=self.layers,
                                num_attention_heads=4, intermediate_size=self.intermediate // 2,
                                max_position_embeddings=self.seq_len, global_attn_every_n_layers=1,
                                local_attention=self.seq_len, attention_dropout=0.0, mlp_dropout=0.0,
                                embedding_dropout=0.0, **special)


@dataclass(frozen=True)
class EncoderZoo:
    """The built zoo: model id -> folder, and each derivative's relation to the base (``independent-<i>``: none)."""

    root: Path
    models: dict[str, Path]
    relations: dict[str, str]

    @property
    def independent(self) -> list[str]:
        return [m for m, relation in self.relations.items() if relation == "independent"]

    @property
    def derivatives(self) -> list[str]:
        return [m for m, relation in self.relations.items() if relation not in ("independent", "base", "gated")]

    def trained_alike(self, gated: bool = False) -> list[Path]:
        """The encoders trained alike from their own seeds: the BERT-style ones (the base first), or the gated."""
        kinds = ("gated",) if gated else ("base", "independent")
        return [self.models[m] for m, relation in self.relations.items() if relation in kinds]


def build_encoder_zoo(root: Path, spec: EncoderZooSpec = EncoderZooSpec()) -> EncoderZoo:
    """Build (or reuse) the encoder zoo under ``root``."""
    root = Path(root)
    if (zoo := _cached(root, spec)) is not None:
        return zoo
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root):
        if (zoo := _cached(root, spec)) is not None:
            return zoo
        (root / GROUND_TRUTH).unlink(missing_ok=True)
        relations = _build(root, spec)
        tmp = root / (GROUND_TRUTH + ".tmp")
        tmp.write_text(json.dumps({"spec": asdict(spec), "relations": relations}, indent=1))
        os.replace(tmp, root / GROUND_TRUTH)
    return _cached(root, spec)  # type: ignore[return-value]


def _cached(root: Path, spec: EncoderZooSpec) -> EncoderZoo | None:
    try:
        data = json.loads((root / GROUND_TRUTH).read_text())
    except (OSError, ValueError):
        return None
    if data.get("spec") != asdict(spec):
        return None
    relations = data["relations"]
    return EncoderZoo(root, {m: root / m for m in relations}, relations)


def _build(root: Path, spec: EncoderZooSpec) -> dict[str, str]:
    language = MarkovLanguage(seed=spec.language_seed, vocab_size=LANGUAGE_VOCAB)
    relations: dict[str, str] = {}
    with single_thread():
        for i in range(spec.independent):
            torch.manual_seed(1000 + i)
            model = BertForMaskedLM(spec.config())
            _train_mlm(model, language, spec.steps, spec.lr, spec.seq_len, data_seed=i)
            name = f"encoders/independent-{i}"
            model.save_pretrained(root / name)
            relations[name] = "base" if i == 0 else "independent"
            if i == 0:
                base = model
        state = {k: v.clone() for k, v in base.state_dict().items()}

        finetune = BertForMaskedLM(spec.config())
        finetune.load_state_dict(state)
        other = MarkovLanguage(seed=spec.language_seed + 1, vocab_size=LANGUAGE_VOCAB)
        _train_mlm(finetune, other, spec.derivative_steps, spec.lr / 2, spec.seq_len, data_seed=100)
        finetune.save_pretrained(root / "derived/finetune")
        relations["derived/finetune"] = "finetune"

        sentence = BertModel(spec.config(), add_pooling_layer=False)
        sentence.load_state_dict({k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")})
        _train_contrastive(sentence, language, spec.derivative_steps, spec.lr / 2, spec.seq_len, data_seed=200)
        _save_sentence_transformer(sentence, root / "derived/sentence")
        relations["derived/sentence"] = "sentence-embedding"

        _pruned(base, spec.prune_fraction).save_pretrained(root / "derived/pruned")
        relations["derived/pruned"] = "pruned"

        for i in range(spec.gated_independent):
            torch.manual_seed(1000 + i)
            gated = ModernBertForMaskedLM(spec.gated_config())
            _train_mlm(gated, language, spec.steps, spec.lr, spec.seq_len, data_seed=i)
            gated.save_pretrained(root / f"gated/modernbert-{i}")
            relations[f"gated/modernbert-{i}"] = "gated"
    return relations


def _masked(tokens: torch.Tensor, generator: torch.Generator, rate: float = 0.15) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption, simplified: ``rate`` of the positions replaced by [MASK]; labels -100 elsewhere."""
    chosen = torch.rand(tokens.shape, generator=generator) < rate
    return tokens.masked_fill(chosen, MASK_ID), tokens.masked_fill(~chosen, -100)


def _train_mlm(model: BertForMaskedLM | ModernBertForMaskedLM, language: MarkovLanguage, steps: int, lr: float,
               seq_len: int, data_seed: int) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(data_seed)
    model.train()
    for _ in range(steps):
        inputs, labels = _masked(language.sample(16, seq_len, data), data)
        loss = model(input_ids=inputs, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()


def _train_contrastive(model: BertModel, language: MarkovLanguage, steps: int, lr: float, seq_len: int,
                       data_seed: int, temperature: float = 0.05) -> None:
    """A sentence-embedding objective as sentence-transformers' MultipleNegativesRankingLoss computes it: mean-pooled
    embeddings of two views of each sequence (a tenth of the tokens masked, independently), each view's partner the
    positive and the batch's other sequences the negatives."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    data = torch.Generator().manual_seed(data_seed)
    model.train()
    for _ in range(steps):
        tokens = language.sample(16, seq_len, data)
        views = [F.normalize(model(input_ids=_masked(tokens, data, 0.1)[0]).last_hidden_state.mean(1), dim=-1)
                 for _ in range(2)]
        logits = views[0] @ views[1].T / temperature
        loss = F.cross_entropy(logits, torch.arange(len(tokens)))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()


def _save_sentence_transformer(model: BertModel, folder: Path) -> None:
    """The layout sentence-transformers writes: the encoder's config and weights at the top (no MLM head, names
    without the `bert.` prefix), `modules.json` naming a Transformer then a mean Pooling module."""
    model.save_pretrained(folder)
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": model.config.hidden_size, "pooling_mode_mean_tokens": True}))
    settings = {"max_seq_length": model.config.max_position_embeddings, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))


@torch.no_grad()
def _pruned(model: BertForMaskedLM, fraction: float) -> BertForMaskedLM:
    """A copy with ``fraction`` of each MLP's units removed: those whose input row and output column have the
    smallest norm (magnitude pruning of whole units, as structured pruning tools do)."""
    keep = model.config.intermediate_size - int(fraction * model.config.intermediate_size)
    config = BertConfig(**{**model.config.to_dict(), "intermediate_size": keep})
    pruned = BertForMaskedLM(config)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for i, layer in enumerate(model.bert.encoder.layer):
        up, down = layer.intermediate.dense, layer.output.dense
        score = up.weight.norm(dim=1) * down.weight.norm(dim=0)
        kept = score.argsort(descending=True)[:keep].sort().values
        prefix = f"bert.encoder.layer.{i}."
        state[prefix + "intermediate.dense.weight"] = up.weight[kept].clone()
        state[prefix + "intermediate.dense.bias"] = up.bias[kept].clone()
        state[prefix + "output.dense.weight"] = down.weight[:, kept].clone()
    pruned.load_state_dict(state)
    return pruned.eval()
