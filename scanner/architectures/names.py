"""What the module tree cannot say by itself, as data: which leaf names play which part of an MLP.

transformers' modules say where everything is and what shape it has, but not which of two (d -> h) linear maps is the
gate and which the up projection, nor which linear map of a block belongs to attention. Those are naming conventions,
so they live here as data, each with the families that use it; everything else is read off the modules.
"""

from __future__ import annotations

#: Subtrees of a decoder layer that are not its feed-forward network: attention, state-space and convolution mixers.
#: Their linear maps are never taken for an MLP's (GPT-2's attn.c_proj looks like an MLP down projection).
MIXER_NAMES = frozenset({
    "self_attn", "attn", "attention", "self_attention", "cross_attn", "encoder_attn", "linear_attn", "mixer", "mamba",
    "temporal_block", "mlstm_layer", "conv", "short_conv", "time_mixer", "rwkv", "token_mixer",
})

#: Leaf name of a gated MLP's gate projection (x -> pre-activation of sigma in down(sigma(gate x) * up x)).
GATE_NAMES = frozenset({"gate_proj", "w1", "proj_up_gate", "wi_0", "gate_linear"})
#: Leaf name of the (d -> h) map that is the up projection of a gated MLP, or the only input map of a plain one
#: (GPT-2 c_fc, NeoX/Falcon/BLOOM dense_h_to_4h, OPT/Phi fc1, GPT-J fc_in, ...), or a fused gate-and-up map.
UP_NAMES = frozenset({
    "up_proj", "w3", "fc1", "c_fc", "dense_h_to_4h", "fc_in", "lin1", "proj_up", "wi_1", "wi", "Wi", "input_linear",
    "gate_up_proj", "fc", "layer_1", "w_in", "c_fc1",
})
#: Leaf name of the (h -> d) map back into the residual stream.
DOWN_NAMES = frozenset({
    "down_proj", "w2", "fc2", "c_proj", "dense_4h_to_h", "fc_out", "lin2", "proj_down", "wo", "Wo", "output_linear",
    "layer_2", "w_out",
})

#: How a dense fused gate-and-up map splits. transformers' experts modules say it themselves (`is_concatenated`); a
#: dense fused map does not, and every one transformers ships computes `a, b = fused(x).chunk(2, dim=-1)` with the
#: first half going through the activation (Phi-3, GLM, GLM-4 gate_up_proj; ModernBERT's Wi): halves, gate first.
DENSE_FUSED_LAYOUT = "halves"

_MLA = ("multi-head latent attention: its tiny model fails in the rotary split of the block-by-block forward "
        "(tensor sizes 4 vs 8); MLPs found, end-to-end check not yet passing")
_TINY_CONFIG = "its config class rejects the shrunk tiny config, so the end-to-end check cannot run"
#: Model types whose MLPs the module tree finds but that fail the end-to-end check (tests/test_architectures.py) on
#: the installed transformers, each with what fails. Refused until the check passes: support is never claimed
#: for a type no test ran.
UNVERIFIED = {
    "axk1": _MLA, "deepseek_v2": _MLA, "deepseek_v3": _MLA, "deepseek_v32": _MLA, "glm4_moe_lite": _MLA,
    "minicpm3": _MLA, "sarvam_mla": _MLA, "youtu": _MLA,
    "bamba": _TINY_CONFIG, "dory": _TINY_CONFIG, "falcon_h1": _TINY_CONFIG, "granitemoehybrid": _TINY_CONFIG,
    "olmo_hybrid": _TINY_CONFIG, "xlnet": _TINY_CONFIG,
    "llama4": "routed experts run on their routed tokens only (Llama4TextExperts takes per-expert batches); hubtrace "
              "needs every token through every expert",
    "llama4_text": "routed experts run on their routed tokens only (Llama4TextExperts takes per-expert batches); "
                   "hubtrace needs every token through every expert",
    "glm_moe_dsa": "its layers take several hidden streams (hyper-connections), which the block recorder does not yet "
                   "replay",
    "hy_v4": "its layers take several hidden streams (hyper-connections), which the block recorder does not yet replay",
    "inkling2_text": "its tiny model asks for a tensor of negative size in the forward pass",
    "inkling2_loop_text": "its tiny model asks for a tensor of negative size in the forward pass",
    "emu3": "a saved checkpoint's text config is not one AutoModelForCausalLM builds",
    "mllama": "a saved checkpoint's text config is not one AutoModelForCausalLM builds",
    "got_ocr2": "a vision-language model whose forward needs pixel_values",
    "openai-gpt": "its base model's forward fails on the recorded block arguments (a list where a tensor is expected)",
}
