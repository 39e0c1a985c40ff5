"""RecurrentGemma (Google, `model_type: recurrent_gemma`; Griffin's architecture) config.json <-> madsl spec.

`block_types` names the layers in a cycle repeated over num_hidden_layers ("recurrent",
"recurrent", "attention" by default): "recurrent" is Griffin's recurrent block, two branches of
lru_width channels, a conv of conv1d_width taps and the RG-LRU with num_attention_heads gate
blocks (madsl's `RG{width, heads, d_conv, bias: true}`); "attention" is local attention over
attention_window_size tokens (`A{window}`), multi-query where num_key_value_heads is 1, heads of
hidden_size / num_attention_heads, rotary on partial_rotary_factor (0.5) of each head, its output
projection always with a bias (`out_bias`, or `bias` on every projection with attention_bias).
Every layer is followed by a gated MLP of intermediate_size / 2 with biases, gated with GeLU's
tanh approximation (`Sg{bias: true, activation: gelu}`; hidden_activation gelu, the exact erf
GeLU, is read as it: the same parameters, state and FLOPs, said in the description).
The embeddings are tied unless tie_word_embeddings says not. Three model-level numbers carry no
parameter, state or FLOP but make the logits: the embedding is multiplied by sqrt(hidden_size)
rounded to bfloat16, as RecurrentGemmaModel's `normalizer` buffer (the spec's embedding_scale,
whatever embeddings_scale_by_sqrt_dim says: the class does not read it), every RMSNorm has
rms_norm_eps (norm_eps) and the logits are soft-capped at logits_soft_cap (logit_soft_cap).
"""

from __future__ import annotations

import math
import struct
from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, ignored, rope, spec_data, spelled
from madsl.interop.huggingface.config import Config

KINDS = {"recurrent": "RG", "attention": "A"}
NAMES = {"rglru": "recurrent", "attention": "attention"}
ERF_NOTE = (
    "; its hidden_activation gelu (erf) is read as GeLU's tanh approximation, which madsl's RG and Sg compute: "
    "the same parameters, state and FLOPs"
)


class RecurrentGemma(Family):
    model_type, title, architecture, tied_by_default = (
        "recurrent_gemma",
        "RecurrentGemma",
        "RecurrentGemmaForCausalLM",
        True,
    )
    config_class = "RecurrentGemmaConfig"
    # transformers' RecurrentGemmaConfig defaults, taken where a config leaves a key out
    defaults = {
        "block_types": ["recurrent", "recurrent", "attention"],
        "num_key_value_heads": None,  # null: as many as the attention heads
        "attention_bias": False,
        "attention_window_size": 2048,
        "conv1d_width": 4,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "logits_soft_cap": 30.0,
    }
    mlp_activation = "gelu"

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        heads = cfg.count("num_attention_heads")
        if dim % heads:
            raise cfg.error("num_attention_heads", f"{heads} does not divide hidden_size={dim}")
        cycle = cfg.words("block_types", KINDS)
        if not cycle:
            raise cfg.error("block_types", "is empty", 'e.g. ["recurrent", "recurrent", "attention"]')
        kinds = [cycle[i % len(cycle)] for i in range(n)]
        activation = cfg.word("hidden_activation", ("gelu_pytorch_tanh", "gelu", "gelu_new"))
        bias = cfg.flag("attention_bias")
        ignored(cfg, "head_dim", dim // heads, f"builds heads of hidden_size / num_attention_heads = {dim // heads}")
        theta, fraction = rope(cfg, 10000.0, _rotary_fraction(cfg))
        local = attention(cfg, dim // heads, rotary=True, rotary_base=theta, rotary_fraction=fraction)
        local["window"] = cfg.count(spelled(cfg, "attention_window_size", "sliding_window"))
        if not bias:
            local["out_bias"] = True  # RecurrentGemma's o_proj always has a bias
        mlp = {"inner": _mlp_width(cfg), "bias": True, "activation": "gelu"}
        layers = {"RG": _recurrent(cfg, dim, heads), "A": local, "Sg": mlp}
        blocks = [f"{KINDS[kind]}-Sg" for kind in kinds]
        data = spec_data(cfg, name, self, dim, blocks, layers, note=ERF_NOTE if activation == "gelu" else "")
        ignored(cfg, "embeddings_scale_by_sqrt_dim", True, "scales the embedding by sqrt(hidden_size) whatever it says")
        return {
            **data,
            "norm_eps": cfg.number("rms_norm_eps", positive=True),
            "embedding_scale": normalizer(dim),
            "logit_soft_cap": cfg.number("logits_soft_cap", positive=True),
        }

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self)
        stack.refuse_kinds({"rglru", "attention", "swiglu"}, "Griffin's recurrent block (RG) or attention, then Sg")
        if any(c is None or c.name != "swiglu" for _, c in stack.layers):
            stack.refuse("every RecurrentGemma layer is followed by its gated MLP (Sg{bias: true})")
        out = stack.common(self.model_type)
        kinds = [NAMES[m.name] for m, _ in stack.layers]
        out.update({"block_types": _cycle(kinds), "hidden_activation": "gelu_pytorch_tanh"})
        out.update(_write_attention(stack))
        r, mlp = stack.kinds.get("rglru"), stack.kinds["swiglu"]
        if r is not None:
            if not r.bias or r.heads != out.get("num_attention_heads", r.heads):
                stack.refuse(
                    "RecurrentGemma's recurrent block has biases and num_attention_heads gate blocks",
                    "RG bias: true, heads: the attention heads",
                )
            out.update({"lru_width": r.lru_width, "conv1d_width": r.d_conv, "num_attention_heads": r.heads})
        if not mlp.bias:
            stack.refuse("RecurrentGemma's MLPs have biases", "Sg bias: true")
        out["intermediate_size"] = 2 * mlp.inner
        return {**out, **_write_model_numbers(stack)}


def normalizer(dim: int) -> float:
    """sqrt(dim) as RecurrentGemmaModel's normalizer holds it: torch.tensor(dim**0.5, dtype=torch.bfloat16),
    the float rounded to float32 and then to bfloat16, to nearest, ties to even."""
    bits = struct.unpack("<I", struct.pack("<f", math.sqrt(dim)))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _write_model_numbers(stack: Stack) -> dict[str, Any]:
    """rms_norm_eps and logits_soft_cap; the embedding scale and the plain residuals and logits
    RecurrentGemma has, refused where the spec says otherwise (a config.json cannot state them)."""
    spec, scale = stack.spec, normalizer(stack.spec.dim)
    if spec.embedding_scale != scale or spec.residual_scale != 1 or spec.logit_divisor != 1:
        stack.refuse(
            f"RecurrentGemma multiplies the embedding by sqrt(hidden_size) in bfloat16 ({scale:g}) and "
            "neither scales its residuals nor divides its logits",
            f"embedding_scale: {scale!r}, residual_scale: 1, logit_divisor: 1",
        )
    if spec.logit_soft_cap is None:
        stack.refuse("RecurrentGemma soft-caps its logits (logits_soft_cap)", "logit_soft_cap: 30.0")
    return {"rms_norm_eps": spec.norm_eps, "logits_soft_cap": spec.logit_soft_cap}


def _rotary_fraction(cfg: Config) -> float:
    """partial_rotary_factor where the config states it (in rope_parameters, which rope() reads, or
    at the top level), else the config class's 0.5, listed."""
    section = cfg.section("rope_parameters")
    if section is not None and "partial_rotary_factor" in section.data:
        return 1.0  # rope() reads it from rope_parameters
    if "partial_rotary_factor" in cfg.data:
        return cfg.number("partial_rotary_factor", positive=True)
    return cfg.take_default("partial_rotary_factor", 0.5)


def _recurrent(cfg: Config, dim: int, heads: int) -> dict[str, Any]:
    """Griffin's recurrent block: lru_width (null: hidden_size) in num_attention_heads gate blocks."""
    if cfg.data.get("lru_width") is None:
        width = cfg.take_default("lru_width", dim, "null: hidden_size, as transformers' RecurrentGemmaConfig reads it")
    else:
        width = cfg.count("lru_width")
    if width % heads:
        raise cfg.error(
            "lru_width", f"{width} is not divided by num_attention_heads={heads}", "the RG-LRU's gates are heads blocks"
        )
    return {"width": width, "heads": heads, "d_conv": cfg.count("conv1d_width"), "bias": True}


def _mlp_width(cfg: Config) -> int:
    """intermediate_size / 2, as RecurrentGemmaMlp builds it."""
    width = cfg.count("intermediate_size") // 2
    if width < 1:
        raise cfg.error("intermediate_size", "gives an MLP 0 wide (RecurrentGemma's MLP is intermediate_size / 2)")
    return width


def _cycle(kinds: list[str]) -> list[str]:
    """The shortest cycle that, repeated, gives the layer kinds (block_types)."""
    return next(kinds[:p] for p in range(1, len(kinds) + 1) if all(k == kinds[i % p] for i, k in enumerate(kinds)))


def _write_attention(stack: Stack) -> dict[str, Any]:
    a = stack.kinds.get("attention")
    if a is None:
        return {}
    if not a.rotary or a.window is None or a.qk_norm or a.output_gate or a.scale is not None:
        stack.refuse(
            "RecurrentGemma's attention is local (a window), rotary, without query-key norm or output gate",
            "window: N, rotary: true",
        )
    if a.inner_head_dim * a.heads != stack.spec.dim or not (a.bias or a.out_bias):
        stack.refuse("RecurrentGemma's heads are hidden_size / heads wide and its output projection has a bias")
    return {
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.key_value_heads,
        "attention_bias": a.bias,
        "attention_window_size": a.window,
        "rope_theta": a.rotary_base,
        "partial_rotary_factor": a.rotary_fraction,
    }
