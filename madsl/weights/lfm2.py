"""LFM2 (Liquid AI, `model_type: lfm2`, transformers' Lfm2ForCausalLM): where each checkpoint tensor
goes in the madsl model `madsl convert --from-hf` makes of its config.

    model.embed_tokens.weight                    embedding.weight
    model.embedding_norm.weight                  final_norm.weight (LFM2's norm after the last layer)
    lm_head.weight                               head.weight (untied), or none (tied: the embedding)
    model.layers.i.operator_norm.weight          body.i.mixer.norm.weight
    model.layers.i.conv.{in_proj,conv,out_proj}  body.i.mixer.layer.{in_proj,conv,out_proj} (GConv)
    model.layers.i.self_attn.{q,k,v}_proj        body.i.mixer.layer.qkv (one projection: q, k, v rows)
    model.layers.i.self_attn.out_proj            body.i.mixer.layer.out
    model.layers.i.self_attn.{q,k}_layernorm     body.i.mixer.layer.{q,k}_norm
    model.layers.i.ffn_norm.weight               body.i.channel.norm.weight
    model.layers.i.feed_forward.w{1,2,3}         body.i.channel.layer.w{1,2,3} (SwiGLU)

The layers compute what transformers' do: madsl's GConv is Lfm2ShortConv's layout and order
(B, C, x from in_proj; C * conv(B * x)), its attention normalises each head's q and k before the
rotate-half rotary, its SwiGLU is LFM2's w2(silu(w1 x) * w3 x). madsl's RMSNorms have eps 1e-5, so
a config whose `norm_eps` is another is refused by name, not approximated; so is a
`partial_rotary_factor` other than 1 (the converter reads it, transformers' LFM2 rotates whole heads).
"""

from __future__ import annotations

from typing import Any

from madsl.errors import MadslError
from madsl.weights.parts import Sources, layered

NORM_EPS = 1e-5  # madsl's RMSNorm (madsl.model_parts.make_norm) and attention's q/k norms
RULES = (  # (madsl name after `body.i.`, LFM2's after `model.layers.i.`)
    (r"mixer\.norm\.weight", "operator_norm.weight"),
    (r"channel\.norm\.weight", "ffn_norm.weight"),
    (r"channel\.layer\.(w[123])\.weight", r"feed_forward.\1.weight"),
    (r"mixer\.layer\.(in_proj|conv|out_proj)\.(weight|bias)", r"conv.\1.\2"),
    (r"mixer\.layer\.out\.weight", "self_attn.out_proj.weight"),
    (r"mixer\.layer\.q_norm\.weight", "self_attn.q_layernorm.weight"),
    (r"mixer\.layer\.k_norm\.weight", "self_attn.k_layernorm.weight"),
)


def check_config(config: dict[str, Any], path: str) -> None:
    """What madsl's layers cannot compute as LFM2's, refused by its key (the converter checks the rest)."""
    eps = config.get("norm_eps", NORM_EPS)
    if eps != NORM_EPS:
        raise MadslError(
            f'{path}: "norm_eps" is {eps!r}; madsl\'s RMSNorms have eps {NORM_EPS:g}, so its logits would differ',
            hint="madsl imports LFM2 checkpoints with norm_eps 1e-05 (transformers' default)",
        )
    rope = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    for where, section in (("", config), ('"rope_parameters".', rope)):
        if section.get("partial_rotary_factor", 1.0) != 1.0:
            factor = section["partial_rotary_factor"]
            raise MadslError(
                f'{path}: {where}"partial_rotary_factor" is {factor!r}: transformers\' Lfm2Attention rotates '
                "the whole head whatever it says, madsl's attention would rotate a part",
                hint="madsl imports LFM2 checkpoints without partial_rotary_factor (or with 1.0)",
            )


def sources(model: Any, config: dict[str, Any]) -> Sources:
    """Each tensor of the model's state dict -> the LFM2 checkpoint tensors it is made of."""
    top = {
        "embedding.weight": "model.embed_tokens.weight",
        "final_norm.weight": "model.embedding_norm.weight",
        "head.weight": "lm_head.weight",
    }
    return layered(model, top, RULES)


# where the embeddings are tied (the model has no head), a checkpoint may still hold lm_head: the embedding's copy
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
