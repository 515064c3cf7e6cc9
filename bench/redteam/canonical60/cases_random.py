"""canonical60 cases on other MoE kinds, originals random-initialised tiny models (tiny_config, seed 1), saved under
/tmp/canonical60/<kind>/original: OLMoE (4 experts x 96, softmax top-k, no shared expert) and Qwen3-MoE (128 experts
x 32). Same loud ghost pairs as cases.py."""

from __future__ import annotations

import copy
import sys

import torch
from transformers import AutoModelForCausalLM

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical59.cases as c59
import bench.redteam.canonical60.cases as c60
from bench.redteam.case_cli import case_arguments
from scanner.reading.architectures.tiny import tiny_config

TYPES = {"olmoe-rand": "olmoe", "qwen3moe-rand": "qwen3_moe"}
_original_of = c49.original_of


def original_of(kind: str):
    if kind not in TYPES:
        return _original_of(kind)
    folder = c49.WORK / kind / "original"
    if (folder / "config.json").exists():
        m = AutoModelForCausalLM.from_pretrained(folder).eval()
    else:
        torch.manual_seed(1)
        m = AutoModelForCausalLM.from_config(tiny_config(TYPES[kind])).eval()
        c49.save(m, folder)
    cost = None
    if c49.DTYPE != torch.float32:
        full = m
        m = copy.deepcopy(m).to(c49.DTYPE)
        folder = c49.save(m, c49.WORK / kind / f"original-{c49.DTYPE}".replace("torch.", ""))
        m = m.float()
        cost = c49.adv.max_logit_change(full, m, c49.probe_ids(full))
    return m, folder, cost


c49.original_of = original_of
CASES = {
    "widen-olmoe-rand": ("olmoe-rand", lambda: c59.widen_intermediate(1100)),
    "loud-widen-olmoe-rand": ("olmoe-rand", lambda: c60.loud_pairs(c59.widen_intermediate(1100))),
    "widen-qwen3moe-rand": ("qwen3moe-rand", lambda: c59.widen_intermediate(40, "moe_intermediate_size")),
    "loud-widen-qwen3moe-rand": (
        "qwen3moe-rand", lambda: c60.loud_pairs(c59.widen_intermediate(40, "moe_intermediate_size"))),
    "loud5k-widen-qwen3moe-rand": (
        "qwen3moe-rand", lambda: c60.loud_pairs(c59.widen_intermediate(40, "moe_intermediate_size"), n=5120)),
}

if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(c60.CODE), scanner.__file__
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
