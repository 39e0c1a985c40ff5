"""GPT-Neo (EleutherAI, `model_type: gpt_neo`: gpt-neo-125M and its sizes; transformers'
GPTNeoForCausalLM) config.json <-> madsl spec: the seed-004 study's pretrained Transformer.

Each of num_layers blocks is attention, global or local as attention_types says (local: a window of
window_size tokens, itself included), then an MLP of intermediate_size (null: 4 x hidden_size) with
biases and gelu_new (GELU, tanh approximation); LayerNorms at layer_norm_epsilon, learned absolute
positions (max_position_embeddings of them: the spec's seq_len), a final norm, tied embeddings. The
attention has no bias on q, k and v, one on its output projection, and does not scale q.k:
`Ag {primitive: attention, rotary: false, scale: 1.0, out_bias: true}` and `Al {base: Ag, window}`,
as specs/hybrid/*-transformer*.mad write it. Dropout keys carry no parameter and are not read.
"""

from __future__ import annotations

from typing import Any

from madsl.interop.huggingface.base import Family, Stack, spec_data
from madsl.interop.huggingface.config import Config

KINDS = {"global": "Ag", "local": "Al"}


class GPTNeo(Family):
    model_type, title, architecture, tied_by_default = "gpt_neo", "GPT-Neo", "GPTNeoForCausalLM", True
    config_class = "GPTNeoConfig"
    # transformers' GPTNeoConfig defaults, taken where a config leaves a key out
    defaults = {
        "intermediate_size": None,  # null: 4 x hidden_size
        "window_size": 256,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-5,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
    }

    def read(self, cfg: Config, name: str) -> dict[str, Any]:
        dim, n = cfg.count("hidden_size"), cfg.layers("num_layers")
        kinds = _attention_layers(cfg)
        if len(kinds) != n:
            raise cfg.error("attention_types", f"gives {len(kinds)} layers, but num_layers is {n}")
        cfg.word("activation_function", ("gelu_new",))  # madsl's Mlp GELU is the tanh approximation
        heads = cfg.count("num_heads")
        if dim % heads:
            raise cfg.error("num_heads", f"{heads} does not divide hidden_size={dim}")
        if cfg.data.get("intermediate_size", cfg.defaults["intermediate_size"]) is None:
            inner = cfg.take_default("intermediate_size", 4 * dim, "null: 4 x hidden_size, as GPTNeoBlock reads it")
        else:
            inner = cfg.count("intermediate_size")
        layers = {
            "Ag": {"primitive": "attention", "heads": heads, "rotary": False, "scale": 1.0, "out_bias": True},
            "Al": {"base": "Ag", "window": cfg.count("window_size")},
            "Mlp": {"inner": inner, "bias": True, "activation": "gelu"},
        }
        data = spec_data(cfg, name, self, dim, [f"{kind}-Mlp" for kind in kinds], layers)
        return {
            **data,
            "norm": "layer",
            "norm_eps": cfg.number("layer_norm_epsilon", positive=True),
            "positions": "learned",
            "seq_len": cfg.count("max_position_embeddings"),
        }

    def write(self, spec: Any) -> dict[str, Any]:
        stack = Stack(spec, self, varying=frozenset({"window"}), norm="layer")
        stack.refuse_kinds({"attention", "mlp"}, "attention (global, or local with a window), then an Mlp")
        if spec.positions != "learned":
            stack.refuse("GPT-Neo adds learned positions to the embedding", "positions: learned")
        windows = []
        for a, channel in stack.layers:
            plain = not a.rotary and a.scale == 1.0 and a.out_bias and not a.bias and a.key_value_heads == a.heads
            if channel is None or not plain:
                stack.refuse(
                    "GPT-Neo's blocks are unscaled attention without rotary, with a bias on its output "
                    "projection alone, then an MLP",
                    "A{rotary=false, scale=1.0, out_bias=true}-Mlp",
                )
            windows.append(a.window)
        local = {w for w in windows if w is not None}
        if len(local) > 1:
            stack.refuse(f"GPT-Neo's local layers share one window_size, got {sorted(local)}")
        mlp = stack.kinds["mlp"]
        if not mlp.bias or mlp.activation != "gelu":
            stack.refuse("GPT-Neo's MLP has biases and gelu_new", "Mlp bias: true, activation: gelu")
        out = stack.common(self.model_type)
        out["num_layers"] = out.pop("num_hidden_layers")
        out.update(
            {
                "num_heads": stack.kinds["attention"].heads,
                "attention_types": [[["local" if w is not None else "global"], 1] for w in windows],
                "window_size": local.pop() if local else 256,
                "intermediate_size": mlp.inner,
                "activation_function": "gelu_new",
                "layer_norm_epsilon": spec.norm_eps,
                "max_position_embeddings": spec.seq_len,
            }
        )
        return out


def _attention_layers(cfg: Config) -> list[str]:
    """attention_types ([[["global", "local"], 12]]: a pattern and how often it repeats) -> each
    layer's symbol, Ag or Al."""
    spelled = cfg.data.get("attention_types")
    if spelled is None:
        raise cfg.error("attention_types", "is missing: which layers attend locally", '[[["global", "local"], 6]]')
    kinds = []
    ok = isinstance(spelled, list) and spelled
    for item in spelled if ok else ():
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], list) and isinstance(item[1], int)):
            ok = False
            break
        if not all(kind in KINDS for kind in item[0]) or item[1] < 1 or item[1] > 10_000:
            ok = False
            break
        kinds += [KINDS[kind] for kind in item[0]] * item[1]
    if not ok:
        raise cfg.error(
            "attention_types",
            f"expected [[[kinds...], repeat], ...] with kinds global or local, got {spelled!r}"[:300],
            '[[["global", "local"], 6]]',
        )
    return kinds
