"""What the module tree cannot say by itself, as data: which leaf names play which part of an MLP.

transformers' modules say where everything is and what shape it has, but not which of two (d -> h) linear maps is the
gate and which the up projection, nor which linear map of a block belongs to attention. Those are naming conventions,
so they live here as data, each with the families that use it; everything else is read off the modules.
"""

from __future__ import annotations

#: Subtrees of a decoder layer that are not its feed-forward network: attention, state-space and convolution mixers.
#: Their linear maps are never taken for an MLP's (GPT-2's attn.c_proj looks like an MLP down projection). `mixer` is
#: searched: Nemotron-H names every sublayer so, an MLP included (a Mamba or attention mixer has no up/down pair).
MIXER_NAMES = frozenset({
    "self_attn", "attn", "attention", "self_attention", "cross_attn", "encoder_attn", "linear_attn", "mamba",
    "temporal_block", "mlstm_layer", "conv", "short_conv", "time_mixer", "rwkv", "token_mixer", "crossattention",
})

#: Experts stacked by row in 2-D maps, which no shape tells apart from a dense MLP: the attribute holding the expert
#: count -> the (gate, up, down) parameter names. DBRX's DbrxExpertGLU (w1, v1, w2 of E * ffn_hidden_size rows).
STACKED_EXPERTS = {"moe_num_experts": ("w1", "v1", "w2")}

#: Routers of mixture-of-experts blocks: never an MLP site, however they compute their scores (ZAYA's router is a
#: small MLP of its own).
ROUTER_NAMES = frozenset({"gate", "router"})

#: Children of an MLP module that wrap some of its maps one level down: GIT's BERT-style intermediate.dense (up) and
#: output.dense (down), Reformer's dense.dense and output.dense, CPM-Ant's w_in holding gate w_0 and up w_1.
WRAPPER_NAMES = frozenset({"intermediate", "output", "w_in", "dense"})

#: Words in a module path that mark a vision, audio or image-tokenizer tower of a multimodal model, or the Q-Former
#: that bridges one to the language model (BLIP-2, InstructBLIP): their layer lists are never taken for the language
#: model's stack.
TOWER_WORDS = ("vision", "visual", "audio", "image", "speech", "vqmodel", "qformer")

#: A child whose name ends so is a norm, never searched for MLPs (AXK2's gated RMSNorm holds a small gating MLP).
NORM_SUFFIX = "norm"

#: Leaf name of a gated MLP's gate projection (x -> pre-activation of sigma in down(sigma(gate x) * up x)).
GATE_NAMES = frozenset({"gate_proj", "w1", "proj_up_gate", "wi_0", "gate_linear", "w_0"})
#: Leaf name of the (d -> h) map that is the up projection of a gated MLP, or the only input map of a plain one
#: (GPT-2 c_fc, NeoX/Falcon/BLOOM dense_h_to_4h, OPT/Phi fc1, GPT-J fc_in, RWKV's channel-mixing key, ...), or a
#: fused gate-and-up map.
UP_NAMES = frozenset({
    "up_proj", "w3", "fc1", "c_fc", "dense_h_to_4h", "fc_in", "lin1", "proj_up", "wi_1", "wi", "Wi", "input_linear",
    "gate_up_proj", "fc", "layer_1", "w_in", "c_fc1", "key", "w_1", "intermediate.dense", "dense.dense",
})
#: Leaf name of the (h -> d) map back into the residual stream (RWKV's channel-mixing value among them).
DOWN_NAMES = frozenset({
    "down_proj", "w2", "fc2", "c_proj", "dense_4h_to_h", "fc_out", "lin2", "proj_down", "wo", "Wo", "output_linear",
    "layer_2", "w_out", "value", "output.dense",
})

#: How a dense fused gate-and-up map splits. transformers' experts modules say it themselves (`is_concatenated`); a
#: dense fused map does not, and every one transformers ships computes `a, b = fused(x).chunk(2, dim=-1)` with the
#: first half going through the activation (Phi-3, GLM, GLM-4 gate_up_proj; ModernBERT's Wi): halves, gate first.
DENSE_FUSED_LAYOUT = "halves"

_ASSISTANT = ("a draft model for speculative decoding: every layer reads the keys, values and per-layer inputs of the "
              "model it assists, so it does not run on its own")
#: Model types whose MLPs the module tree finds but that fail the end-to-end check (tests/test_architectures.py) on
#: the installed transformers, each with what fails. Refused until the check passes: support is never claimed
#: for a type no test ran.
UNVERIFIED: dict[str, str] = {
    "gemma4_assistant": _ASSISTANT, "gemma4_unified_assistant": _ASSISTANT,
    "cpmant": "its forward embeds prompt ids it adds to the input ids, which a block-by-block fingerprint with a "
              "partial embedding table cannot follow",
    "blt": "a byte-level model: its blocks see patches of hashed byte n-grams (other ids than its input ids), and the "
           "end-to-end check finds no dependence between a model and its noisy copy",
    "reformer": "LSH attention hashes with fresh random rotations on every forward pass (unless the config sets "
                "hash_seed), so its activations are not a function of its weights",
    "idefics": "its language model's forward needs an image (pixel values or image embeddings) on every call, so it "
               "cannot read text alone",
    "shieldgemma2": "an image classifier (ShieldGemma2ForImageClassification): the image-text-to-text class "
                    "transformers builds for it saves its language model under names that class does not load back",
    "pi0": "a robot action policy (a vision-language model and an action expert): the tiny model of its own config "
           "stores an action-token table of another size than that config gives, so no end-to-end check runs",
    "xmod": "every layer routes through a language-specific adapter chosen by a language id, which the canonical "
            "token ids do not carry (its forward refuses to run without one)",
    "longformer": "its forward pads the input with padding tokens up to a multiple of its attention window, so its "
                  "blocks see other ids than the canonical ones",
}
