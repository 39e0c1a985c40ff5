"""Zamba2 (`model_type: zamba2`, Zyphra's Zamba2-1.2B/2.7B/7B; transformers' Zamba2ForCausalLM) config.json
<-> madsl spec.

Every one of num_hidden_layers layers is a pre-norm residual Mamba-2 mixer with no channel mixer (`M2-none`).
The layers `layers_block_type` calls "hybrid" first run a shared transformer block and add its output to the
input of the Mamba layer's norm: madsl's injector, `Zs#s0>M2-none` (h + M2(norm(h + Zs(h))); the block reads
concat(h, token embeddings), madsl/primitives/zamba.py). There are num_mem_blocks shared blocks, used in
turn by the hybrid layers (hybrid layer k uses block k mod num_mem_blocks: the tags #s0, #s1, ...); each use
has its own output projection and LoRA adapters (on gate_up, and on q, k, v with
use_shared_attention_adapter), which madsl counts per use. Its attention is 2 x hidden_size wide per head
set (attention_head_dim = 2 x hidden_size / num_attention_heads, whatever the config says), rotary only with
use_mem_rope; its MLP is gate_up (2 x intermediate_size) and down, biased with add_bias_linear, gated by
hidden_act. The Mamba-2 mixers are expand x hidden_size wide in n_mamba_heads heads, their conv always
biased, their gated norm at 1e-5, dt clamped below at time_step_min (`dt_min`), as Zamba2MambaMixer builds
them; every other norm is an RMSNorm at rms_norm_eps; tied embeddings unless tie_word_embeddings is false.

Read as transformers' Zamba2Config reads it: `layer_types` is its other name of layers_block_type, "mamba"
its old name of "linear_attention", and mamba_headdim, which the class derives, must agree with it. Not
read: use_conv_bias (the class biases every conv), head_dim and attention_head_dim (derived from
hidden_size), use_long_context (RoPE's range only), use_mem_eff_path, chunk_size and the kernels' switches.
Refused by name: Zyphra's keys from before transformers (lora_rank, state_size, ffn_hidden_size, ...:
the class ignores them) where transformers' own key is missing or says otherwise,
use_shared_attention_adapter with fewer key/value heads than heads (transformers' adapters are 2 x
hidden_size wide and do not fit k and v), and tie_word_embeddings false with hybrid layers
(transformers 5.24 ties the shared blocks only along with the embeddings: untied, every hybrid layer
gets a block of its own holding every use's adapter slots). Written back from a spec of the same
shape.
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, attention, ignored, rope, spec_data
from madsl.interop.huggingface.config import Config
from madsl.lang import topology as topo
from madsl.structure import INJECT, TAG, plan_blocks

KINDS = {"linear_attention": "mamba", "mamba": "mamba", "hybrid": "hybrid"}
ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu"}
# Zyphra's pre-transformers spelling of the sizes -> the key transformers' Zamba2Config reads instead
LEGACY_KEYS = {
    "ffn_hidden_size": "intermediate_size",
    "lora_rank": "adapter_rank",
    "state_size": "mamba_d_state",
    "use_shared_attention_lora": "use_shared_attention_adapter",
}
MAMBA_NORM_EPS = 1e-5  # Zamba2MambaMixer's gated RMSNorm, whatever rms_norm_eps says


def default_layer_types() -> list[str]:
    """Zamba2Config's layers_block_type where a config leaves it out (Zamba2-2.7B's 54 layers)."""
    mamba, hybrid = "linear_attention", "hybrid"
    return [mamba] + ([mamba] * 5 + [hybrid]) * 7 + [mamba] * 4 + [hybrid] + [mamba] * 3 + [hybrid] + [mamba] * 2


class Zamba2(Family):
    model_type, title, architecture, tied_by_default = "zamba2", "Zamba2", "Zamba2ForCausalLM", True
    config_class = "Zamba2Config"
    # transformers' Zamba2Config defaults, taken where a config leaves a key out
    defaults = {
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_ngroups": 1,
        "n_mamba_heads": 8,
        "time_step_min": 0.001,
        "add_bias_linear": False,
        "intermediate_size": None,
        "hidden_act": "gelu",
        "num_key_value_heads": None,
        "num_mem_blocks": 1,
        "use_shared_attention_adapter": False,
        "adapter_rank": 128,
        "use_mem_rope": False,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        self._legacy(cfg)
        dim = cfg.count("hidden_size")
        kinds = self._kinds(cfg)
        blocks, uses = [], 0
        shared = cfg.count("num_mem_blocks")
        for kind in kinds:
            if kind == "hybrid":
                blocks.append(f"Zs#s{uses % shared}>M2-none")
                uses += 1
            else:
                blocks.append("M2-none")
        layers = {"M2": self._mamba(cfg, dim), "Zs": self._shared(cfg, dim)}
        ignored(cfg, "use_conv_bias", True, "biases every Mamba conv")
        for key in ("head_dim", "attention_head_dim"):
            ignored(cfg, key, 2 * dim // layers["Zs"]["heads"], "derives it as 2 x hidden_size / num_attention_heads")
        if uses and not cfg.flag("tie_word_embeddings"):
            raise cfg.error(
                "tie_word_embeddings",
                "false: transformers' Zamba2ForCausalLM ties its shared blocks only along with the embeddings; "
                "untied, it builds a block of its own for every hybrid layer, each holding the adapters of every "
                "use of its block, which is no model madsl states",
                "tie_word_embeddings: true, as every published Zamba2 config",
            )
        data = spec_data(cfg, name, self, dim, blocks, layers)
        return {**data, "norm_eps": cfg.number("rms_norm_eps", positive=True)}

    def _legacy(self, cfg: Config) -> None:
        """Zyphra's keys from before transformers: read by nothing, so a config that states a size only
        under them would be built as another model; where transformers' key agrees, they are left, noted."""
        for old, key in LEGACY_KEYS.items():
            if old not in cfg.data:
                continue
            if key not in cfg.data or cfg.data[key] != cfg.data[old]:
                said = "leaves it out" if key not in cfg.data else f"states {cfg.data[key]!r}"
                raise cfg.error(
                    old,
                    f"Zyphra's key from before transformers' Zamba2: Zamba2Config reads {key} instead, which this "
                    f"config {said}, and would build another model than {old} = {cfg.data[old]!r} says",
                    "the Hugging Face hub's current config.json of the checkpoint, in transformers' keys",
                )
            cfg.notes.append(f"{old} is not read: Zamba2Config reads {key} (the same value)")
        if cfg.data.get("use_shared_block_lora", True) is not True:
            raise cfg.error(
                "use_shared_block_lora",
                "false: transformers' Zamba2 builds the MLP adapters of every use whatever it says",
                "the Hugging Face hub's current config.json of the checkpoint, in transformers' keys",
            )

    def _kinds(self, cfg: Config) -> list[str]:
        n = cfg.layers("num_hidden_layers")
        key = "layers_block_type" if "layers_block_type" in cfg.data or "layer_types" not in cfg.data else "layer_types"
        if key not in cfg.data:
            kinds = cfg.take_default(key, default_layer_types(), "Zamba2-2.7B's stack, as Zamba2Config defaults it")
        else:
            kinds = [KINDS[kind] for kind in cfg.words(key, KINDS)]
        kinds = [KINDS[kind] for kind in kinds]
        if len(kinds) != n:
            raise cfg.error(
                key if key in cfg.data else "num_hidden_layers",
                f"{len(kinds)} layers, but num_hidden_layers is {n}",
                "Zamba2ForCausalLM builds one layer per entry of layers_block_type",
            )
        return kinds

    def _shared(self, cfg: Config, dim: int) -> dict[str, Any]:
        heads = cfg.count("num_attention_heads")
        if (2 * dim) % heads:
            raise cfg.error(
                "num_attention_heads",
                f"{heads} does not divide 2 x hidden_size = {2 * dim}",
                "Zamba2's attention heads split the 2 x hidden_size input",
            )
        position = cfg.flag("use_mem_rope")
        theta, fraction = rope(cfg, 10000.0) if position else (10000.0, 1.0)
        if fraction != 1.0:
            raise cfg.error("partial_rotary_factor", "Zamba2's rotary covers the whole head", "leave it out")
        grouped = attention(cfg, 2 * dim // heads, rotary=position, bias_key=None)
        adapters = cfg.flag("use_shared_attention_adapter")
        if adapters and grouped.get("kv_heads", heads) != heads:
            raise cfg.error(
                "use_shared_attention_adapter",
                f"adapters on k and v with {grouped['kv_heads']} key/value heads of {heads}: transformers' "
                "adapters are 2 x hidden_size wide and fit k and v only with as many key/value heads as heads",
                "num_key_value_heads = num_attention_heads, or use_shared_attention_adapter: false",
            )
        if cfg.data.get("intermediate_size", cfg.defaults["intermediate_size"]) is None:
            ffn = cfg.take_default(
                "intermediate_size", 4 * dim, f"null: 4 x hidden_size, as {cfg.config_owner} Zamba2Config reads it"
            )
        else:
            ffn = cfg.count("intermediate_size")
        activation = cfg.word("hidden_act", ACTIVATIONS)
        return {
            "heads": heads,
            **({"kv_heads": grouped["kv_heads"]} if "kv_heads" in grouped else {}),
            "ffn": ffn,
            "adapter_rank": cfg.count("adapter_rank"),
            "qkv_adapters": adapters,
            "rope": position,
            "rope_theta": theta,
            "activation": ACTIVATIONS[activation],
            "bias": cfg.flag("add_bias_linear"),
            "norm_eps": cfg.number("rms_norm_eps", positive=True),
        }

    def _mamba(self, cfg: Config, dim: int) -> dict[str, Any]:
        expand, heads = cfg.count("mamba_expand"), cfg.count("n_mamba_heads")
        if (expand * dim) % heads:
            raise cfg.error(
                "n_mamba_heads",
                f"{heads} heads do not divide the Mamba width {expand * dim} (mamba_expand x hidden_size)",
                "Zamba2's Mamba heads split mamba_expand x hidden_size",
            )
        per_head = expand * dim // heads
        if "mamba_headdim" in cfg.data and cfg.data["mamba_headdim"] != per_head:
            raise cfg.error(
                "mamba_headdim",
                f"{cfg.data['mamba_headdim']!r}, but Zamba2Config derives mamba_expand x hidden_size / n_mamba_heads "
                f"= {per_head}: the config describes another model than the one transformers builds from it",
                f"n_mamba_heads = {expand * dim} / mamba_headdim",
            )
        groups = cfg.count("mamba_ngroups")
        if heads % groups:
            raise cfg.error("mamba_ngroups", f"{groups} groups do not divide n_mamba_heads = {heads}")
        return {
            "d_state": cfg.count("mamba_d_state"),
            "d_conv": cfg.count("mamba_d_conv"),
            "expand": expand,
            "head_dim": per_head,
            "heads": heads,
            "groups": groups,
            "bias": cfg.flag("add_bias_linear"),
            "conv_bias": True,
            "norm_eps": MAMBA_NORM_EPS,
            "dt_min": cfg.number("time_step_min", positive=False),
        }

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self, structures=frozenset({TAG, INJECT}))
        what = "Mamba-2 layers (M2) with no channel mixer, some with a shared block before them (Zs#s0>M2-none)"
        stack.refuse_kinds({"mamba2"}, what)
        blocks = plan_blocks(stack.plan)
        if any(len(b.mixers) != 1 or b.channel is not None for b in blocks):
            stack.refuse(f"every Zamba2 layer is one Mamba-2 mixer with no channel mixer; {spec.name} has others", what)
        m, shared = stack.mamba2(), self._uses(stack, blocks)
        if shared is not None and not spec.tie_embeddings:
            stack.refuse("transformers' Zamba2 shares its blocks only with tied embeddings", "tie_embeddings: true")
        out = stack.common(self.model_type)
        out["layers_block_type"] = ["mamba" if b.inject is None else "hybrid" for b in blocks]
        if m is not None:
            out.update(self._write_mamba(stack, m))
        if shared is not None:
            z, count = shared
            if m is not None and m.bias != z.bias:
                stack.refuse("Zamba2's add_bias_linear biases the Mamba projections and the shared MLP alike")
            if z.inner_head_dim * z.heads != 2 * spec.dim or z.norm_eps != spec.norm_eps:
                stack.refuse(
                    "Zamba2's shared attention has heads of 2 x hidden_size / heads and its norms at rms_norm_eps",
                    "head_dim: null; norm_eps: the spec's norm_eps",
                )
            inverse = {madsl: hf for hf, madsl in ACTIVATIONS.items()}
            out.update(
                {
                    "num_attention_heads": z.heads,
                    "num_key_value_heads": z.key_value_heads,
                    "intermediate_size": z.ffn,
                    "hidden_act": inverse[z.activation],
                    "add_bias_linear": z.bias,
                    "num_mem_blocks": count,
                    "use_shared_attention_adapter": z.qkv_adapters,
                    "adapter_rank": z.adapter_rank,
                    "use_mem_rope": z.rope,
                    **({"rope_theta": z.rope_theta} if z.rope else {}),
                }
            )
        out["rms_norm_eps"] = spec.norm_eps
        return out

    def _uses(self, stack: Stack, blocks: list[Any]) -> tuple[Any, int] | None:
        """The shared block's setting and how many there are (num_mem_blocks), from its uses in order: every
        injector a Zs, the k-th use tagged as the (k mod num_mem_blocks)-th, as Zamba2 cycles through them."""
        uses = [b.inject for b in blocks if b.inject is not None]
        if not uses:
            return None
        if any(u["primitive"].name != "zamba_shared" for u in uses):
            stack.refuse("Zamba2 injects its shared transformer blocks (Zs) alone", "Zs#s0>M2-none")
        first = uses[0]["primitive"]
        if any(u["primitive"] != first for u in uses):
            stack.refuse("Zamba2's shared blocks have one setting; the spec's Zs layers differ")
        tags = [u["layer"].tag for u in uses]
        count = len(dict.fromkeys(tags))
        if None in tags and len(uses) > 1 or any(tag != tags[k % count] for k, tag in enumerate(tags)):
            stack.refuse(
                f"Zamba2's hybrid layers use num_mem_blocks shared blocks in turn; the spec's injectors are "
                f"{', '.join(topo.layer_text(u['layer']) for u in uses)}",
                "tag the k-th injector with the (k mod n)-th of n tags: Zs#s0, Zs#s1, Zs#s0, ...",
            )
        if first.qkv_adapters and first.key_value_heads != first.heads:
            stack.refuse("Zamba2's q, k and v adapters need as many key/value heads as heads", "qkv_adapters: false")
        return first, count

    def _write_mamba(self, stack: Stack, m: Any) -> dict[str, Any]:
        dim = stack.spec.dim
        if m.d_inner != m.expand * dim or not m.conv_bias or m.norm_eps != MAMBA_NORM_EPS:
            stack.refuse(
                "Zamba2's Mamba-2 layers are mamba_expand x hidden_size wide, with a biased conv and the gated "
                f"norm at {MAMBA_NORM_EPS:g}",
                "M2 heads x head_dim = expand x dim, conv_bias: true, norm_eps: 1e-5",
            )
        return {
            "mamba_d_state": m.d_state,
            "mamba_d_conv": m.d_conv,
            "mamba_expand": m.expand,
            "mamba_ngroups": m.groups,
            "n_mamba_heads": m.n_heads,
            "add_bias_linear": m.bias,
            "time_step_min": m.dt_min,
        }
