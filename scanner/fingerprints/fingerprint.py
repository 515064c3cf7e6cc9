"""Fingerprints: everything the activation statistics need from a model, read once, kept in one small file.

A fingerprint holds every block's gate and up activations on the canonical inputs (per expert for MoE),
plus what comparisons and screening need without the checkpoint: dims, depth, vocabulary and tokenizer
identity, the input set, per-tensor sha256 of the stored weights (exact copies), the parameter count and
small permutation-invariant summaries. Comparing two models is then a computation on two files.

The file is a safetensors file (tensors `blocks.{layer}.{expert}.gate|up|write`, shaped (units, tokens), and
`blocks.{layer}.{expert}.gate_scale|up_scale|write_scale|written`, one per unit, and `.weight`, one per token); the
metadata is JSON under the header's `__metadata__` together with a sha256 over the tensors, checked on every read.
Each unit's activation row is stored divided by its largest magnitude, as float16 (halving the size; see
docs/fingerprints.md for the measured effect on p-values; the write view as int8 steps of 1/127, a quarter more than
the two read views), and that
magnitude as float32: a unit rescaled by 1e-30 or 1e30 (which leaves a model's outputs unchanged when its output
column is rescaled back) keeps its direction, where float16 values would flush it to zero or overflow.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import TypeAdapter, ValidationError
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from scanner import __version__
from scanner.errors import CheckpointError, FingerprintError, one_line
from scanner.files import file_sha256
from scanner.fingerprints.inputs import InputSet, InputSpec, canonical_inputs
from scanner.fingerprints.shared_vocab import pair_input_sets
from scanner.reading.activations import WRITE_STEPS, MLPActivations
from scanner.reading.architectures.families import ArchitectureAdapter
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights
from scanner.reading.checkpoint import Checkpoint
from scanner.reading.formats.gguf_file import is_gguf_file
from scanner.reading.streaming import stream_blocks
from scanner.reading.validate import ValuesAsRead, validate_checkpoint
from scanner.reading.value_sample import block_sample
from scanner.stats.verbatim import sample_layout

#: The file's layout, raised whenever what a fingerprint holds changes, so that two fingerprints compared were always
#: made alike: the views of each MLP's canonical units (scanner.reading.canonical_mlp: units that compute one function
#: combined, gates grouped by what they compute on the block's inputs, units that write nothing dropped), a plain MLP's
#: views free of each unit's gate sign where act(z) - act(-z) = z (scanner.reading.activations.plain_views), and every
#: unit's write view beside its read views, as int8 steps of its peak. Fingerprints of another format are re-made.
#: Format 6: gates are grouped by what they compute on the block's inputs alone (what rows hold along directions the
#: input never takes is the copier's to set), and after that algebra, units that write one column join where their
#: gates nearly agree there (scanner.reading.canonical_mlp, `_gate_groups`, `_near_copies_joined`).
#: Format 7: routed experts that the router weighs in proportion at every canonical token are read as one expert
#: (scanner.reading.alike_experts), and ``block_experts`` counts them so.
#: Format 8: where no write view was read (a layout that hands its layers several streams), each unit's output
#: column's length (``written``), which a unit's magnitude, and the units a MoE block pools, read
#: (scanner.stats.pooled_units).
#: Format 9: that length is each unit's net write size (scanner.reading.activations.net_written): units that put out
#: one function count together, so two whose outputs cancel write nothing; and each routed expert (as joined) keeps
#: the weight the block gave it on each canonical token (``weight``), which what a unit contributes reads.
FINGERPRINT_FORMAT = 9
STORAGE_DTYPES = ("float16", "float32")
#: The tensors a fingerprint keeps per MLP (the write view and its scale only where a residual stream was read, the
#: output columns' lengths only where none was, a routed expert's weight on each token where its routing was seen).
STORED_PARTS = ("gate", "up", "gate_scale", "up_scale", "write", "write_scale", "written", "weight")
#: Quantiles of the per-unit activation RMS stored in the summaries (permutation invariant).
QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
_META_KEY = "hubtrace_fingerprint"
_CONTENT_KEY = "content_sha256"
#: Entries of a weight tensor its kurtosis summary reads at most (about; a fixed stride).
KURTOSIS_SAMPLE = 1 << 20


@dataclass(frozen=True)
class FingerprintMeta:
    """What a comparison needs to know about the model without opening it. JSON-serialisable."""

    model: str
    architecture: str
    model_type: str
    n_layers: int
    hidden_size: int
    intermediate_size: int
    n_experts: int
    vocab_size: int
    token_range: int
    tokenizer_hash: str | None
    hidden_act: str
    input_set: str
    input_spec: dict[str, int]
    parameter_count: int
    tensor_hashes: dict[str, str]
    summaries: dict[str, list]
    hubtrace_version: str
    format_version: int
    dtype: str
    mlp_kind: str = "gated"  # "plain": fc -> act -> proj units, views (fc pre-activation, write direction's residual)
    model_layers: list[int] | None = None  # decoder layer of each block where some layers hold no MLP (hybrids)
    attention: str = "causal"  # "bidirectional": an encoder, whose units see every position (compared only with one)
    # routed experts of each block as read, those weighed in proportion as one (scanner.reading.alike_experts; 0: a
    # dense block); None: no block has any
    block_experts: list[int] | None = None
    mlp_values: str | None = None  # base64 float32: MLP weight values at fixed positions (scanner.stats.verbatim)
    mlp_layout: str = ""  # digest of the matrices mlp_values was read from: samples of one layout line up

    def value_sample(self) -> np.ndarray:
        """The MLP weight values sampled for the verbatim share (empty when none was recorded)."""
        if not self.mlp_values:
            return np.zeros(0, dtype=np.float32)
        return np.frombuffer(base64.b64decode(self.mlp_values), dtype="<f4").astype(np.float32)

    @property
    def up_sign_free(self) -> bool:
        """Whether the second view's sign carries no identity: a gated MLP's up output (negating a unit's up row and
        its down column keeps the outputs); a plain MLP's views both keep their sign."""
        return self.mlp_kind == "gated"

    def routed_experts(self, block: int) -> int:
        """Routed experts of block ``block`` (its MLPs after them are shared experts or a dense MLP)."""
        return self.block_experts[block] if self.block_experts is not None else self.n_experts


_META_TYPES = TypeAdapter(FingerprintMeta)
"""Checks a read header against FingerprintMeta's annotations: the file is data from anywhere, its JSON may lie."""


@dataclass(frozen=True)
class Fingerprint:
    """A model's metadata and its activations: blocks[layer][expert] with gate/up shaped (units, tokens)."""

    meta: FingerprintMeta
    blocks: list[list[MLPActivations]]

    def comparable_with(self, other: Fingerprint) -> str | None:
        """None when activation statistics may compare the two; otherwise why not (one line)."""
        a, b = self.meta, other.meta
        if a.attention != b.attention:
            return (f"one model reads its input {a.attention}ly and the other {b.attention}ly (an encoder and a "
                    "decoder): their units see different positions of the same tokens, so hubtrace compares encoders "
                    "only with encoders")
        if a.mlp_kind != b.mlp_kind:
            return (f"one model's MLPs are {a.mlp_kind} and the other's {b.mlp_kind}: their units have different "
                    "views, so no activation statistic pairs them")
        if a.input_set == b.input_set:
            return None
        if a.token_range != b.token_range and a.input_spec == b.input_spec:
            return (
                f"the fingerprints draw their canonical ids from different ranges ({a.input_set} vs {b.input_set}): "
                f"the same input set needs the shared range; fingerprint both models with token range "
                f"{min(a.token_range, b.token_range)}"
            )
        return f"the fingerprints were taken on different input sets ({a.input_set} vs {b.input_set})"


def model_token_range(checkpoint: Checkpoint, adapter: ArchitectureAdapter) -> int:
    """The ids whose meaning the model's tokenizer defines: its base vocabulary (added tokens excluded) when
    tokenizer.json says, else the embedding rows."""
    base = checkpoint.tokenizer_base_vocab_size()
    vocab = adapter.shape.vocab_size
    return min(vocab, base) if base else vocab


def fingerprint_model(
    path: str | Path,
    *,
    inputs: InputSpec = InputSpec(),
    device: str = "cpu",
    token_range: int | None = None,
    storage_dtype: str = "float16",
    tensor_hashes: Mapping[str, str] | None = None,
    input_set: InputSet | None = None,
    follow_links: bool = False,
) -> Fingerprint:
    """Read a checkpoint, block by block, into its fingerprint, after every check of `validate_checkpoint`.

    token_range overrides the model's own id range (a pair test of two vocabularies uses the shared one);
    activations are rounded to storage_dtype here, so a fingerprint compares the same before and after a
    write/read round trip. tensor_hashes, when the caller already ran the value pass (a scan's worker), saves
    a second one: the folder is still checked, its values are not read again. input_set, when given, replaces the
    canonical ids (and `inputs`): shared-string inputs for two tokenizers (scanner.fingerprints.shared_vocab) give each
    model its own ids for the same text.
    """
    if storage_dtype not in STORAGE_DTYPES:
        raise ValueError(f"storage dtype must be one of {', '.join(STORAGE_DTYPES)}, got {storage_dtype!r}")
    checkpoint, adapter, _ = validate_checkpoint(path, check_values=False, follow_links=follow_links)
    if tensor_hashes is not None and set(tensor_hashes) != set(checkpoint.tensor_names()):
        raise ValueError(f"{path}: the given tensor hashes are not those of this checkpoint's tensors")
    own_range = model_token_range(checkpoint, adapter)
    if input_set is None:
        input_set = canonical_inputs(min(token_range, own_range) if token_range else own_range, inputs)
    inputs = input_set.spec
    blocks: list[list[MLPActivations]] = []
    per_block: list[dict[str, Any]] = []
    sample: list[np.ndarray] = []
    layout: list[str] = []
    routed: list[int] = []
    values = _value_pass(checkpoint, adapter) if tensor_hashes is None else None
    with values.watch() if values is not None else nullcontext():
        for block in stream_blocks(checkpoint, adapter, input_set.ids, device=device):
            if not all(np.isfinite(a.gate).all() and np.isfinite(a.up).all() for a in block.activations):
                raise CheckpointError(f"{path}: block {len(blocks)} computes NaN or Inf activations from finite "
                                      f"weights (values overflow float32); hubtrace cannot fingerprint it")
            blocks.append([stored_activations(acts, storage_dtype) for acts in block.activations])
            per_block.append({**_block_summary(block.experts, block.activations), "routing_seen": block.routing_seen,
                              "stored_experts": block.stored_experts})
            _sample_block(block.experts[0], adapter.shape.n_layers, sample, layout)
            routed.append(block.routed)
            del block
    tensor_hashes = dict(tensor_hashes if values is None else values.finish())
    shape = adapter.shape
    meta = FingerprintMeta(
        model=str(path),
        architecture=shape.architecture,
        model_type=shape.model_type,
        n_layers=shape.n_layers,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        n_experts=shape.n_experts,
        vocab_size=shape.vocab_size,
        token_range=input_set.token_range,
        tokenizer_hash=checkpoint.tokenizer_hash(),
        hidden_act=shape.hidden_act,
        input_set=input_set.id,
        input_spec=asdict(inputs),
        parameter_count=sum(math.prod(checkpoint.shape(n)) for n in checkpoint.tensor_names()),
        tensor_hashes=tensor_hashes,
        summaries=_summaries(per_block),
        hubtrace_version=__version__,
        format_version=FINGERPRINT_FORMAT,
        dtype=storage_dtype,
        mlp_kind=getattr(adapter, "mlp_kind", "gated"),
        model_layers=getattr(adapter, "model_layers", None),
        block_experts=routed if any(routed) else None,
        attention=getattr(adapter, "attention", "causal"),
        mlp_values=base64.b64encode(np.concatenate(sample).astype("<f4").tobytes()).decode() if sample else None,
        mlp_layout=sample_layout(layout),
    )
    checkpoint.close()
    return Fingerprint(meta=meta, blocks=blocks)


def _sample_block(mlp: GLUWeights | SiteWeights, n_blocks: int, sample: list[np.ndarray], layout: list[str]) -> None:
    """Add the block's (first expert's) MLP values at the verbatim share's fixed positions to ``sample``."""
    values, parts = block_sample([(part, getattr(mlp, part)) for part in ("gate", "up", "down")
                                  if getattr(mlp, part) is not None], n_blocks)
    sample += values
    layout += parts


def _value_pass(checkpoint: Checkpoint, adapter: ArchitectureAdapter) -> ValuesAsRead:
    """The value pass (NaN/Inf, tensor hashes) of a fingerprint that was given no hashes: where the checkpoint's reads
    are its stored bytes, every block tensor is checked as the forward pass reads it (one read from disk instead of
    two) and the rest (embedding, norms, head) now; otherwise every tensor now, as `validate_checkpoint` does."""
    values = ValuesAsRead(checkpoint)
    if ValuesAsRead.applies(checkpoint):
        streamed = adapter.streamed_tensor_names()
        values.before(n for n in checkpoint.tensor_names() if n not in streamed)
    else:
        values.before(checkpoint.tensor_names())
    return values


def fingerprint_pair(
    path_a: str | Path | Fingerprint, path_b: str | Path | Fingerprint, *, inputs: InputSpec = InputSpec(),
    device: str = "cpu", follow_links: bool = False,
) -> tuple[Fingerprint, Fingerprint]:
    """Fingerprints of two sides, each a model directory, a fingerprint file or a fingerprint already read (from an
    object store, say), on one input set if possible.

    A fingerprint side fixes the input set (its spec and id range) for a directory side; two directories use
    `inputs` on their shared id range, or on their shared token strings when their vocabularies differ
    (scanner.fingerprints.shared_vocab). Whether the result is comparable is `comparable_with`'s call.
    """
    sides = (path_a, path_b)
    given = [side if isinstance(side, Fingerprint) else read_fingerprint(side) if is_fingerprint_file(side) else None
             for side in sides]
    fixed = next((fp.meta for fp in given if fp is not None), None)
    if fixed is not None:
        inputs, token_range = InputSpec(**fixed.input_spec), fixed.token_range
    else:
        checked = [validate_checkpoint(p, check_values=False, follow_links=follow_links) for p in (path_a, path_b)]
        adapters = [c.adapter for c in checked]
        token_range = min(model_token_range(c.checkpoint, c.adapter) for c in checked)
        shared = pair_input_sets(path_a, path_b, *(a.shape.vocab_size for a in adapters), inputs)
        if shared is not None:
            return tuple(  # type: ignore[return-value]
                fingerprint_model(p, device=device, input_set=s, follow_links=follow_links)
                for p, s in zip((path_a, path_b), shared)
            )
    return tuple(  # type: ignore[return-value]
        fp if fp is not None else fingerprint_model(side, inputs=inputs, device=device, token_range=token_range,
                                                    follow_links=follow_links)
        for fp, side in zip(given, sides)
    )


def is_fingerprint_file(path: str | Path) -> bool:
    """A side given as a file is a fingerprint unless it is a GGUF model (both are single files)."""
    return Path(path).is_file() and not is_gguf_file(Path(path))


def write_fingerprint(fp: Fingerprint, path: str | Path) -> str:
    """Write atomically (temporary file in the same folder, then rename); returns the file's sha256."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors = {
        _tensor_name(layer, expert, part): getattr(stored, part)
        for layer, experts in enumerate(fp.blocks)
        for expert, acts in enumerate(experts)
        for stored in [acts if acts.gate_scale is not None else stored_activations(acts, fp.meta.dtype)]
        for part in STORED_PARTS if getattr(stored, part) is not None
    }
    metadata = {_META_KEY: json.dumps(asdict(fp.meta), sort_keys=True), _CONTENT_KEY: _content_sha256(tensors)}
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, tmp, metadata=metadata)
        digest = file_sha256(Path(tmp))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return digest


def read_fingerprint_meta(path: str | Path) -> FingerprintMeta:
    """Only the metadata (header), without reading or checking the activations."""
    with _open(path) as handle:
        return parse_fingerprint_meta(path, handle.metadata())


def read_fingerprint(path: str | Path) -> Fingerprint:
    """Read and check a fingerprint file; FingerprintError (one line) if it is corrupt or of another format."""
    with _open(path) as handle:
        meta = parse_fingerprint_meta(path, handle.metadata())
        names = set(handle.keys())
        try:
            tensors = {name: handle.get_tensor(name) for name in sorted(names)}
        except SafetensorError as exc:
            raise FingerprintError(f"{path}: cannot read the activations: {exc}") from exc
        stored_sha = handle.metadata().get(_CONTENT_KEY)
    if stored_sha != _content_sha256(tensors):
        raise FingerprintError(f"{path}: the activations do not match their recorded sha256 (altered or damaged file)")
    blocks = [checked_block(path, meta, layer, tensors) for layer in range(meta.n_layers)]
    leftover = sorted(tensors)
    if leftover:
        raise FingerprintError(f"{path}: unexpected tensors {leftover[:3]} beyond the {meta.n_layers} blocks")
    return Fingerprint(meta=meta, blocks=blocks)


def read_fingerprint_block(path: str | Path, layer: int) -> tuple[FingerprintMeta, list[MLPActivations]]:
    """The metadata and one block's activations (per expert), reading only that block's tensors.

    Each tensor is checked (shape, finite values) as in `read_fingerprint`, but the file's sha256 over every tensor
    cannot be without reading them all: a caller that needs the whole-file check reads the whole file.
    """
    with _open(path) as handle:
        meta = parse_fingerprint_meta(path, handle.metadata())
        if not 0 <= layer < meta.n_layers:
            raise FingerprintError(f"{path}: no block {layer} (the fingerprint has {meta.n_layers})")
        try:
            tensors = {name: handle.get_tensor(name) for name in handle.keys()
                       if name.startswith(block_tensor_prefix(layer))}
        except SafetensorError as exc:
            raise FingerprintError(f"{path}: cannot read the activations: {exc}") from exc
    experts = checked_block(path, meta, layer, tensors)
    if tensors:
        raise FingerprintError(f"{path}: unexpected tensors {sorted(tensors)[:3]} in block {layer}")
    return meta, experts


def block_tensor_prefix(layer: int) -> str:
    """The name prefix of every tensor of one block (``blocks.{layer}.``)."""
    return f"blocks.{layer}."


def checked_block(path: str | Path, meta: FingerprintMeta, layer: int,
                  tensors: dict[str, np.ndarray]) -> list[MLPActivations]:
    """Block ``layer``'s experts, taken out of ``tensors`` (name -> array): each gate/up pair checked for shape
    (units x the input set's tokens) and finite values; FingerprintError (one line) names what is wrong."""
    n_tokens = _token_count(meta)
    experts = []
    while _tensor_name(layer, len(experts), "gate") in tensors:
        where = f"{path}: block {layer} expert {len(experts)}"
        gate, up, gate_scale, up_scale, write, write_scale, written, weight = (
            tensors.pop(_tensor_name(layer, len(experts), p), None) for p in STORED_PARTS)
        if up is None or gate.ndim != 2 or gate.shape != up.shape or gate.shape[1] != n_tokens \
                or any(s is None or s.shape != (gate.shape[0],) for s in (gate_scale, up_scale)):
            raise FingerprintError(f"{where} has malformed gate/up tensors")
        if (write is None) != (write_scale is None) or write is not None and (
                write.shape != gate.shape or write.dtype != np.int8 or write_scale.shape != gate_scale.shape):
            raise FingerprintError(f"{where} has a malformed write view (int8 rows beside the gate's, one scale each)")
        if written is not None and (write is not None or written.shape != gate_scale.shape
                                    or not np.isfinite(written).all() or (written < 0).any()):
            raise FingerprintError(f"{where} has malformed output column lengths (one finite length per unit, and "
                                   "only where no write view is stored)")
        if weight is not None and (weight.shape != (n_tokens,) or not np.isfinite(weight).all()):
            raise FingerprintError(f"{where} has a malformed routing weight (one finite weight per token)")
        # a NaN would make every statistic NaN
        if not all(np.isfinite(t).all() for t in (gate, up, gate_scale, up_scale)) or \
                write_scale is not None and not np.isfinite(write_scale).all():
            raise FingerprintError(f"{where} holds NaN or Inf activations")
        if (gate_scale < 0).any() or (up_scale < 0).any() or np.abs(gate).max(initial=0) > 1 \
                or np.abs(up).max(initial=0) > 1 or \
                write is not None and ((write_scale < 0).any() or (write == -128).any()):
            raise FingerprintError(f"{where} is not stored as unit-peak rows with non-negative scales")
        experts.append(MLPActivations(gate=gate, up=up, gate_scale=gate_scale, up_scale=up_scale, write=write,
                                      write_scale=write_scale, written=written, weight=weight))
    if not experts:
        raise FingerprintError(f"{path}: block {layer} of {meta.n_layers} has no activations")
    return experts


# -- helpers -----------------------------------------------------------------------------------------------------


def _tensor_name(layer: int, expert: int, part: str) -> str:
    return f"blocks.{layer}.{expert}.{part}"


def stored_activations(acts: MLPActivations, storage_dtype: str) -> MLPActivations:
    """As a fingerprint holds a unit's views: rows divided by their peak (within [-1, 1]) in the storage dtype, the
    peaks as float32 (see the module docstring)."""
    scaled = acts.normalised()
    return replace(scaled, gate=_as_storage(scaled.gate, storage_dtype), up=_as_storage(scaled.up, storage_dtype),
                   write=None if scaled.write is None else _write_steps(scaled.write))


def _as_storage(values: np.ndarray, storage_dtype: str) -> np.ndarray:
    """Unit-peak rows in the storage dtype (float16 holds every such value: no overflow, and no unit flushes to zero,
    since each row's peak is 1). Through torch, whose vectorised conversion is several times numpy's on large blocks;
    the rounding (to nearest even) is the same."""
    tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return (tensor.half() if storage_dtype == "float16" else tensor).numpy()


def _write_steps(rows: np.ndarray) -> np.ndarray:
    """Unit-peak rows as int8 steps of 1/WRITE_STEPS (rounded to nearest; -128 never used, so -x is stored as -x)."""
    return np.rint(np.asarray(rows, dtype=np.float32) * WRITE_STEPS).astype(np.int8)


def _kurtosis(weights: torch.Tensor) -> float:
    """Excess kurtosis (population moments, as scipy.stats.kurtosis defaults to) of every entry, or of a fixed
    stride of about KURTOSIS_SAMPLE entries in larger tensors.

    The stride is deterministic, so equal tensors give equal values; its standard error (about 0.005 for
    Gaussian weights) and float32's pairwise reductions (~1e-6) sit far below the 0.02 that direction votes
    need, while reading every entry of a 7B block made the summaries cost more than the block's forward pass.
    """
    flat = weights.reshape(-1)
    x = flat[:: max(1, flat.numel() // KURTOSIS_SAMPLE)].float()
    squared = (x - x.mean()).square_()
    m2 = squared.mean()
    return float(squared.square_().mean() / m2.square() - 3.0) if m2 > 0 else 0.0


def _unit_rms(values: np.ndarray) -> np.ndarray:
    """Root mean square of each unit's activations (rows), accumulated in float64."""
    rows = torch.from_numpy(values)
    return (torch.linalg.vector_norm(rows, dim=1, dtype=torch.float64) / math.sqrt(max(rows.shape[1], 1))).numpy()


def activation_effective_rank(values: np.ndarray) -> float:
    """Effective rank (exp of the entropy of the normalised squared singular values) of a (units, tokens)
    activation matrix whose rows are scaled to unit length.

    Unchanged by every output-preserving transformation: permuting or rescaling units (rows, any sign) and
    rotating the residual stream (activations do not change). Fine-tuning concentrates activations on fewer
    directions, so it falls from a model to its fine-tunes (docs/lineage.md, direction). Computed from the
    tokens x tokens Gram matrix in float64.
    """
    rows = torch.from_numpy(np.asarray(values, dtype=np.float64))
    rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min(1e-300)
    gram = rows.T @ rows if rows.shape[0] >= rows.shape[1] else rows @ rows.T
    energy = torch.linalg.eigvalsh(gram).clamp_min(0.0)
    p = energy / energy.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum())) if p.numel() else 0.0


def _block_summary(experts: list[GLUWeights] | list[SiteWeights], activations: list[MLPActivations]) -> dict[str, Any]:
    rms = {part: np.concatenate([_unit_rms(getattr(a, part)) for a in activations]) for part in ("gate", "up")}
    parts = [part for part in ("gate", "up", "down") if getattr(experts[0], part) is not None]
    kurtosis = {part: float(np.mean([_kurtosis(getattr(e, part)) for e in experts])) for part in parts}
    return {
        "kurtosis": kurtosis,
        "canonical_units": [sum(a.gate.shape[0] + a.dead + a.combined for a in activations),
                            sum(a.dead for a in activations), sum(a.combined for a in activations)],
        "activation_effective_rank": float(np.mean([activation_effective_rank(getattr(a, part))
                                                    for a in activations for part in ("gate", "up")])),
        "gate_rms_quantiles": _quantiles(rms["gate"]),
        "up_rms_quantiles": _quantiles(rms["up"]),
    }


def _quantiles(values: np.ndarray) -> list[float]:
    """QUANTILES of ``values``; zeros for a block left with no units (its MLPs write nothing: their activation is
    0, and the block is reported as cannot-test, not refused)."""
    return np.quantile(values, QUANTILES).tolist() if values.size else [0.0] * len(QUANTILES)


def _summaries(per_block: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-block lists (index = block). Every entry is invariant to permuting hidden units (and experts)."""
    return {
        "mlp_weight_kurtosis": [float(np.mean(list(b["kurtosis"].values()))) for b in per_block],
        "activation_effective_rank": [b["activation_effective_rank"] for b in per_block],
        "gate_weight_kurtosis": [b["kurtosis"].get("gate") for b in per_block],  # None: a plain MLP has no gate
        "up_weight_kurtosis": [b["kurtosis"]["up"] for b in per_block],
        "down_weight_kurtosis": [b["kurtosis"]["down"] for b in per_block],
        "activation_rms_quantiles": list(QUANTILES),
        "canonical_units": [b["canonical_units"] for b in per_block],  # [units as stored, dead, combined] per block
        # per block: whether its routing was seen (scanner.reading.alike_experts; False: its experts read alone,
        # None: no routed experts)
        "expert_routing_seen": [b["routing_seen"] for b in per_block],
        "stored_experts": [b["stored_experts"] for b in per_block],  # routed experts as stored (block_experts: read)
        "gate_rms_quantiles": [b["gate_rms_quantiles"] for b in per_block],
        "up_rms_quantiles": [b["up_rms_quantiles"] for b in per_block],
    }


def _content_sha256(tensors: dict[str, np.ndarray]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}\n".encode())
        digest.update(array.reshape(-1).view(np.uint8))  # its bytes, without a copy (an empty tensor too)
    return digest.hexdigest()


class _open:
    """safe_open as a context manager that turns every way a file can be unreadable into FingerprintError."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __enter__(self) -> Any:
        if not self.path.is_file():
            raise FingerprintError(f"fingerprint file {self.path} does not exist or is not a file")
        try:
            self.handle = safe_open(str(self.path), framework="numpy")
        except (SafetensorError, OSError, ValueError) as exc:
            raise FingerprintError(
                f"{self.path} is not a readable fingerprint (safetensors) file ({exc}), "
                "nor a GGUF model (no GGUF magic)"
            ) from exc
        return self.handle

    def __exit__(self, *exc: object) -> None:
        del self.handle


def parse_fingerprint_meta(path: str | Path, metadata: dict[str, str] | None) -> FingerprintMeta:
    raw = (metadata or {}).get(_META_KEY)
    if raw is None:
        raise FingerprintError(f"{path} is a safetensors file but not a hubtrace fingerprint (no {_META_KEY} metadata)")
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # ValueError: invalid JSON, or an integer of thousands of digits
        raise FingerprintError(f"{path}: fingerprint metadata is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise FingerprintError(f"{path}: fingerprint metadata is not a JSON object")
    version = data.get("format_version")
    if version != FINGERPRINT_FORMAT:
        raise FingerprintError(
            f"{path}: fingerprint format {version!r}, but this hubtrace (version {__version__}) reads format "
            f"{FINGERPRINT_FORMAT}; re-fingerprint the model"
        )
    expected = {f.name for f in fields(FingerprintMeta)}
    defaulted = {f.name for f in fields(FingerprintMeta) if f.default is not MISSING}
    if set(data) - expected or expected - defaulted - set(data):  # a field added later is read with its default
        missing, extra = sorted(expected - set(data)), sorted(set(data) - expected)
        raise FingerprintError(f"{path}: fingerprint metadata fields differ (missing {missing}, unexpected {extra})")
    try:  # strict: a JSON that lies about a field's type ("4" layers, true for a count) is refused, not coerced
        meta = _META_TYPES.validate_json(raw, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise FingerprintError(f"{path}: fingerprint metadata field {field!r} has the wrong type: {first['msg']} "
                               f"(got {one_line(repr(first['input']), limit=80)})") from exc
    if meta.n_layers < 1 or _token_count(meta) < 1:
        raise FingerprintError(f"{path}: the fingerprint holds no blocks or no tokens ({meta.n_layers} blocks, "
                               f"{_token_count(meta)} tokens), so there is nothing to compare")
    return meta


def _token_count(meta: FingerprintMeta) -> int:
    """Canonical tokens per activation row (input sequences x their length)."""
    spec = meta.input_spec
    return int(spec.get("n_sequences", 0)) * int(spec.get("seq_len", 0))
