"""Nemotron-H (NVIDIA, `model_type: nemotron_h`, transformers' NemotronHForCausalLM): where each
checkpoint tensor goes in the madsl model `madsl convert --from-hf` makes of its config.

The checkpoint has one entry per Megatron layer (`backbone.layers.i`: a norm and a mixer, which is a
Mamba-2, an attention or an MLP layer); madsl pairs each sequence layer with the MLP after it into
a block (madsl.interop.megatron.megatron_blocks), so layer i of the pattern is a block's sequence
or channel half:

    backbone.embeddings.weight                  embedding.weight
    backbone.norm_f.weight                      final_norm.weight
    lm_head.weight                              head.weight (untied), or none (tied)
    backbone.layers.i.norm.weight               body.k.mixer.norm.weight, or body.k.channel.norm.weight
    backbone.layers.i.mixer.{in_proj,out_proj}  body.k.mixer.layer.{in_proj,out_proj} (M2)
    backbone.layers.i.mixer.conv1d              body.k.mixer.layer.conv.conv
    backbone.layers.i.mixer.{dt_bias,A_log,D}   body.k.mixer.layer.{dt_bias,A_log,D}
    backbone.layers.i.mixer.norm.weight         body.k.mixer.layer.norm_weight (the gated RMSNorm)
    backbone.layers.i.mixer.{q,k,v}_proj        body.k.mixer.layer.qkv (one projection: q, k, v rows)
    backbone.layers.i.mixer.o_proj              body.k.mixer.layer.out
    backbone.layers.i.mixer.{up,down}_proj      body.k.channel.layer.{fc,proj} (Mlp, squared ReLU)
    backbone.layers.i.mixer.gate.weight         body.k.channel.layer.router.weight (MoE)
    backbone.layers.i.mixer.gate.e_score_correction_bias   body.k.channel.layer.selection_bias (a buffer)
    backbone.layers.i.mixer.experts.e.{up,down}_proj       body.k.channel.layer.{w_up,w_down}[e], transposed
    backbone.layers.i.mixer.shared_experts.{up,down}_proj  body.k.channel.layer.shared.{up,down}
    backbone.layers.i.mixer.fc{1,2}_latent_proj            body.k.channel.layer.latent_{down,up}

The layers compute what transformers' do: Mamba-2 as bamba.py says, attention without position
embeddings (Nemotron-H's NoPE), the MLP down(relu(up x)^2), the mixture of experts routed as
NemotronHTopkRouter (MoE scores: sigmoid with the correction bias; madsl divides by the chosen
scores' sum, transformers by the sum plus 1e-20). Refused by key: a `layer_norm_epsilon` other than
madsl's 1e-5 and a clamping `time_step_limit` (madsl.weights.mamba2).
"""

from __future__ import annotations

from typing import Any

from madsl.interop.megatron import CHANNEL, SEQUENCE
from madsl.weights.mamba2 import check_mamba2_config
from madsl.weights.parts import Sources, experts, one, qkv

MAMBA = ("in_proj", "out_proj", "conv.conv", "dt_bias", "A_log", "D", "norm_weight")
# a MoE's tensors outside the routed experts: madsl's name after `layer.` -> Nemotron-H's after `mixer.`
EXPERT_TENSORS = (
    ("router.weight", "gate.weight"),
    ("selection_bias", "gate.e_score_correction_bias"),
    ("shared.up.weight", "shared_experts.up_proj.weight"),
    ("shared.down.weight", "shared_experts.down_proj.weight"),
    ("latent_down.weight", "fc1_latent_proj.weight"),
    ("latent_up.weight", "fc2_latent_proj.weight"),
)
NAMES = {"conv.conv": "conv1d", "norm_weight": "norm.weight"}  # madsl's M2 name -> Nemotron-H's


def check_config(config: dict[str, Any], path: str) -> None:
    """What madsl's layers cannot compute as Nemotron-H's, refused by its key (the converter checks the rest)."""
    check_mamba2_config(config, path, "layer_norm_epsilon", "Nemotron-H")


def _pattern(config: dict[str, Any], path: str) -> str:
    from madsl.interop.huggingface.config import Config
    from madsl.interop.huggingface.nemotron import layer_pattern

    return layer_pattern(Config(config, "", path))[0]


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the Nemotron-H checkpoint tensors it is made of."""
    state = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    out: Sources = {
        "embedding.weight": one("backbone.embeddings.weight", state["embedding.weight"]),
        "final_norm.weight": one("backbone.norm_f.weight", state["final_norm.weight"]),
    }
    if "head.weight" in state:
        out["head.weight"] = one("lm_head.weight", state["head.weight"])
    for block, (sequence, channel) in enumerate(_halves(_pattern(config, "config.json"))):
        _sequence(out, model, state, f"body.{block}.mixer.", f"backbone.layers.{sequence}.")
        if channel is not None:
            _channel(out, state, f"body.{block}.channel.", f"backbone.layers.{channel}.")
    return out


def _halves(pattern: str) -> list[tuple[int, int | None]]:
    """Each madsl block's (sequence layer, channel layer or None) indices in the pattern, paired as
    madsl.interop.megatron.megatron_blocks pairs them (a pattern it refuses never reaches here)."""
    out, i = [], 0
    while i < len(pattern):
        paired = i + 1 < len(pattern) and pattern[i] in SEQUENCE and pattern[i + 1] in CHANNEL
        out.append((i, i + 1 if paired else None))
        i += 2 if paired else 1
    return out


def _sequence(out: Sources, model: Any, state: dict, madsl: str, layer: str) -> None:
    """A sequence half: its norm and its Mamba-2 or attention layer's tensors."""
    out[madsl + "norm.weight"] = one(layer + "norm.weight", state[madsl + "norm.weight"])
    for name, shape in state.items():
        if not name.startswith(madsl + "layer."):
            continue
        rest = name[len(madsl + "layer.") :]
        if rest in ("qkv.weight", "qkv.bias"):
            kind = rest.split(".")[1]
            q, k, v = (f"{layer}mixer.{x}_proj.{kind}" for x in "qkv")
            out[name] = qkv(model.get_submodule(madsl + "layer"), q, k, v, shape)
        elif rest.startswith("out."):
            out[name] = one(f"{layer}mixer.o_proj.{rest[4:]}", shape)
        else:
            base = next((m for m in MAMBA if rest == m or rest.startswith(m + ".")), None)
            if base is not None:
                out[name] = one(f"{layer}mixer.{NAMES.get(base, base)}{rest[len(base) :]}", shape)


def _channel(out: Sources, state: dict, madsl: str, layer: str) -> None:
    """A channel half: its norm and the MLP's up and down projections, or the mixture of experts."""
    out[madsl + "norm.weight"] = one(layer + "norm.weight", state[madsl + "norm.weight"])
    for ours, theirs in EXPERT_TENSORS:
        name = f"{madsl}layer.{ours}"
        if name in state:
            out[name] = one(f"{layer}mixer.{theirs}", state[name])
    for ours, theirs in (("w_up", "up_proj"), ("w_down", "down_proj")):
        name = f"{madsl}layer.{ours}"
        if name in state:
            count = state[name][0]
            out[name] = experts([f"{layer}mixer.experts.{e}.{theirs}.weight" for e in range(count)], state[name])
    for ours, theirs in (("fc", "up_proj"), ("proj", "down_proj")):
        for kind in ("weight", "bias"):
            name = f"{madsl}layer.{ours}.{kind}"
            if name in state:
                out[name] = one(f"{layer}mixer.{theirs}.{kind}", state[name])


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "backbone.embeddings.weight"}
