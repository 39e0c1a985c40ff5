"""RWKV-7 (`model_type: rwkv7`, flash-linear-attention's RWKV7ForCausalLM): where each checkpoint tensor
goes in the madsl model `madsl convert --from-hf` makes of its config (an R7 time mixer and an R6c
channel mixer without receptance in every block; the R7 layers after the first with value_residual).

    model.embeddings.weight                          embedding.weight
    model.layers.0.pre_norm.{weight,bias}            embedding_norm.{weight,bias} (norm_first)
    model.norm.{weight,bias}, lm_head.weight         final_norm.{weight,bias}, head.weight
    model.layers.i.attn_norm.*, ffn_norm.*           body.i.mixer.norm.*, body.i.channel.norm.*
    model.layers.i.attn.x_{r,w,k,v,a,g} (1, 1, D)    body.i.mixer.layer.mix.{r,w,k,v,a,g} (D,)
    model.layers.i.attn.{k_k,k_a,r_k}                body.i.mixer.layer.{k_k,k_a,r_k}
    model.layers.i.attn.{r,k,v,o}_proj.weight        body.i.mixer.layer.{r,k,v,o}_proj.weight
    model.layers.i.attn.{w,a,g,v}_lora.lora.{0,2}.*  body.i.mixer.layer.{w,a,g,v}_lora.{0,2}.*
    model.layers.i.attn.g_norm.{weight,bias}         body.i.mixer.layer.g_norm.{weight,bias}
    model.layers.i.ffn.x_k                           body.i.channel.layer.maa_k
    model.layers.i.ffn.{key,value}.weight            body.i.channel.layer.{key,value}.weight

What the converter refuses (attn layers, a wider value_dim, ...) is refused there by key, before this
map is read.
"""

from __future__ import annotations

from typing import Any

from madsl.weights.parts import Part, Sources, layered

PRE_NORM = "model.layers.0.pre_norm"
RULES = (  # (madsl name after `body.i.`, fla's after `model.layers.i.`)
    (r"mixer\.norm\.(weight|bias)", r"attn_norm.\1"),
    (r"channel\.norm\.(weight|bias)", r"ffn_norm.\1"),
    (r"mixer\.layer\.(k_k|k_a|r_k)", r"attn.\1"),
    (r"mixer\.layer\.([rkvo]_proj\.weight)", r"attn.\1"),
    (r"mixer\.layer\.([wagv]_lora)\.([02]\.(weight|bias))", r"attn.\1.lora.\2"),
    (r"mixer\.layer\.g_norm\.(weight|bias)", r"attn.g_norm.\1"),
    (r"channel\.layer\.maa_k", "ffn.x_k"),
    (r"channel\.layer\.(key|value)\.weight", r"ffn.\1.weight"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """Nothing beyond the converter's refusals (madsl/interop/huggingface/rwkv7.py), which come first."""


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the RWKV-7 checkpoint tensors it is made of."""
    top = {f"final_norm.{x}": f"model.norm.{x}" for x in ("weight", "bias")} | {"head.weight": "lm_head.weight"}
    top |= {f"embedding_norm.{x}": f"{PRE_NORM}.{x}" for x in ("weight", "bias")}
    top["embedding.weight"] = "model.embeddings.weight"
    out = layered(model, top, RULES)
    state = model.state_dict()
    for name, tensor in state.items():  # the six mixes, (1, 1, D) in fla's layer
        prefix, dot, mix = name.rpartition(".mixer.layer.mix.")
        if dot:
            source = f"model.layers.{prefix.removeprefix('body.')}.attn.x_{mix}"
            out[name] = (Part(source, (1, 1, tensor.shape[0]), reshaped=tuple(tensor.shape)),)
    return out


TIED = {"lm_head.weight": "model.embeddings.weight"}
