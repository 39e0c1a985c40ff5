"""Falcon-H1 (TII, `model_type: falcon_h1`) config.json <-> madsl spec.

Every Falcon-H1 layer runs attention and Mamba-2 side by side on one pre-norm input and adds
their outputs (times its µP multipliers) to the residual, then a SwiGLU MLP: madsl's parallel
mixers, the block `[A | M2]-Sg`, one norm and one residual add for both. The Mamba layers are
mamba_d_ssm wide (expand x hidden_size where it is null) = mamba_n_heads x mamba_d_head; with
`mamba_rms_norm: false` (the released models) their gate has no RMSNorm (M2{norm: false}).

The µP multipliers scale activations and carry no parameter, state or FLOP. The embedding's and
lm_head's become the spec's `embedding_scale` and `logit_divisor` (1 / lm_head_multiplier), and
rms_norm_eps every norm's eps (the Mamba-2 gated norm's too), each written only where it is not
madsl's default; the others (attention in and out, key, SSM in and out, the SSM's per-part
multipliers, the MLP's) sit right before or after a linear map and are folded into its weights
by `madsl import` (madsl/weights/falcon_h1.py), so a spec does not state them.
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, head_dim, ignored, mamba2, rope, spec_data
from madsl.interop.huggingface.config import Config
from madsl.interop.huggingface.ibm import IBM_MAMBA2

BLOCK = "[A | M2]-Sg"
NORM_EPS = 1e-5  # madsl's norms' default eps (madsl.model_parts.DEFAULT_NORM_EPS), FalconH1Config's too


class FalconH1(Family):
    model_type, title, architecture, tied_by_default = "falcon_h1", "Falcon-H1", "FalconH1ForCausalLM", False
    config_class = "FalconH1Config"
    # transformers' FalconH1Config defaults, taken where a config leaves a key out
    defaults = {
        "num_key_value_heads": 8,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 128,
        "mamba_d_head": "auto",
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "projectors_bias": False,
        "mamba_rms_norm": False,
        "mamba_norm_before_gate": True,
        "embedding_multiplier": 1.0,
        "lm_head_multiplier": 1.0,
        "rms_norm_eps": NORM_EPS,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_hidden_layers")
        # transformers' Falcon-H1 runs attention beside Mamba-2 in every layer, whatever this says
        ignored(cfg, "attn_layer_indices", None, "runs attention beside Mamba-2 in every layer")
        theta, fraction = rope(cfg, 10000.0)  # FalconH1Config's default; the released models state 1e11
        data = spec_data(
            cfg,
            name,
            self,
            dim,
            [BLOCK] * n,
            {
                "A": attention(
                    cfg, head_dim(cfg, dim, "head_dim"), rotary=True, rotary_base=theta, rotary_fraction=fraction
                ),
                "M2": _mamba(cfg, dim),
                "Sg": {"inner": cfg.count("intermediate_size"), "bias": cfg.flag("mlp_bias")},
            },
            note="; its embedding and lm_head muP multipliers are embedding_scale and logit_divisor, "
            "the others folded into the weights by madsl import",
        )
        return {**data, **_scales(cfg, data["layers"]["M2"])}

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self, parallel=True)
        stack.refuse_kinds({"mamba2", "attention", "swiglu"}, f"every block {BLOCK}")
        for mixers, channel in stack.blocks:
            if sorted(p.name for p in mixers) != ["attention", "mamba2"] or channel is None or channel.name != "swiglu":
                stack.refuse(f"every Falcon-H1 layer is attention beside Mamba-2, then a SwiGLU ({BLOCK})")
        out = stack.common(self.model_type)
        out.update(stack.attention(rotary=True))
        a, mlp = stack.kinds["attention"], stack.kinds["swiglu"]
        if a.qk_norm:
            stack.refuse("Falcon-H1's attention has no query-key norm")
        out.update(
            {
                "head_dim": a.inner_head_dim,
                "attention_bias": a.bias,
                "rope_theta": a.rotary_base,
                "attn_layer_indices": None,
            }
        )
        if a.rotary_fraction != 1.0:
            out["partial_rotary_factor"] = a.rotary_fraction
        m = stack.kinds["mamba2"]
        out.update(
            {
                "mamba_d_ssm": m.d_inner,
                "mamba_n_heads": m.n_heads,
                "mamba_d_head": m.head_dim,
                "mamba_d_state": m.d_state,
                "mamba_n_groups": m.groups,
                "mamba_d_conv": m.d_conv,
                "mamba_expand": m.expand,
                "mamba_proj_bias": m.bias,
                "projectors_bias": m.bias,
                "mamba_conv_bias": m.conv_bias,
                "mamba_rms_norm": m.norm,
                "mamba_norm_before_gate": False,
            }
        )
        out.update({"intermediate_size": mlp.inner, "mlp_bias": mlp.bias})
        out.update(_write_scales(stack, m))
        return out


def _scales(cfg: Config, m2: dict[str, Any]) -> dict[str, Any]:
    """The spec's keys of Falcon-H1's embedding and lm_head multipliers and of its rms_norm_eps (also
    the Mamba-2 gated norm's, `m2`), each only where it is not madsl's default."""
    embedding = cfg.number("embedding_multiplier", positive=True)
    head = cfg.number("lm_head_multiplier", positive=True)
    eps = cfg.number("rms_norm_eps", positive=True)
    out: dict[str, Any] = {}
    if embedding != 1.0:
        out["embedding_scale"] = embedding
    if head != 1.0:
        out["logit_divisor"] = 1.0 / head  # the logits times lm_head_multiplier
    if eps != NORM_EPS:
        out["norm_eps"] = eps
        if m2["norm"]:
            m2["norm_eps"] = eps
    return out


def _write_scales(stack: Stack, m: Any) -> dict[str, Any]:
    """embedding_multiplier, lm_head_multiplier and rms_norm_eps of the spec's keys (where not at the
    defaults); a residual scale, a logit soft cap and a Mamba-2 norm eps of its own are refused."""
    spec = stack.spec
    if spec.residual_scale != 1.0 or spec.logit_soft_cap is not None:
        stack.refuse("Falcon-H1 has no residual scale and no logit soft cap", "residual_scale: 1, logit_soft_cap: null")
    if spec.embedding_scale <= 0 or spec.logit_divisor <= 0:
        stack.refuse("Falcon-H1's embedding and lm_head multipliers are positive", "a positive scale and divisor")
    if m.norm and m.norm_eps != spec.norm_eps:
        stack.refuse("Falcon-H1's norms share one rms_norm_eps", f"M2{{norm_eps={spec.norm_eps:g}}}")
    out: dict[str, Any] = {}
    if spec.embedding_scale != 1.0:
        out["embedding_multiplier"] = spec.embedding_scale
    if spec.logit_divisor != 1.0:
        out["lm_head_multiplier"] = 1.0 / spec.logit_divisor
    if spec.norm_eps != NORM_EPS:
        out["rms_norm_eps"] = spec.norm_eps
    return out


def _mamba(cfg: Config, dim: int) -> dict[str, Any]:
    """Falcon-H1's Mamba-2: mamba_d_ssm wide (Hugging Face's default 1024 where the key is absent,
    expand x hidden_size where it is null), one bias switch for in_proj and out_proj, and the
    gated RMSNorm only with mamba_rms_norm (applied after the gate, as madsl's)."""
    if "mamba_d_ssm" in cfg.data and cfg.data["mamba_d_ssm"] is None:
        width, of = cfg.count("mamba_expand") * dim, " (mamba_d_ssm null: mamba_expand x hidden_size)"
    else:
        width = cfg.count("mamba_d_ssm")
        of = " (mamba_d_ssm" + (", absent: transformers' default)" if "mamba_d_ssm" not in cfg.data else ")")
    params = mamba2(cfg, dim, IBM_MAMBA2, width=width, of=of)  # Falcon-H1 spells them as Bamba does
    if cfg.flag("projectors_bias") != params["bias"]:
        raise cfg.error(
            "projectors_bias",
            "differs from mamba_proj_bias: madsl's Mamba-2 has one bias switch for its input and output projections",
            "make the two agree",
        )
    params["norm"] = cfg.flag("mamba_rms_norm")
    if params["norm"] and cfg.flag("mamba_norm_before_gate"):
        raise cfg.error(
            "mamba_norm_before_gate",
            "true: the RMSNorm before the gate; madsl's Mamba-2 normalises after it",
            "mamba_norm_before_gate: false",
        )
    return params
