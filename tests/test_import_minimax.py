"""`madsl import` of MiniMax-Text-01 (`minimax`) and MiniMax-M1 (`minimax_m1`; madsl.weights.minimax;
the way back out: test_export_hf.py): tiny checkpoints made here by transformers (every weight random,
norms included; lightning attention in blocks of 8 tokens, softmax attention, 4 experts of which 2
are active, the residual factors off 1) load into the compiled madsl model with transformers'
logits, through the parallel forward and through prefill + step; the spec's `postnorm` and
`residual_factors` each move the logits by far more than the tolerance when taken away.

MiniMax-M1's own code is not in transformers: its reference here is transformers' MiniMaxForCausalLM
on the same tensors with what MiniMax-M1's modeling_minimax_m1.py does otherwise put in (its
slopes' layer factor 1 - l / (layers - 1) + 1e-5, the rotary embedding over the first rotary_dim
channels of each head, the residual before the norm where postnorm is false).

Tolerance: 1e-4 absolute in float32 on logits up to about 6 (tests/test_import_hf.py's argument: the
same operations grouped otherwise, transformers' norms and router in float32 of their own, its
lightning attention in blocks against madsl's chunked form). The matrices are drawn at std 0.2: at
randomized's 0.3 this stack amplifies a relative change of 1e-7 in any weight to 8.5e-5 in the logits
(measured in float64), so float32 rounding alone reaches 1.6e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checkpoints import minimax, prefill_and_step_error, reference, tokens  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from madsl.cli import main  # noqa: E402
from madsl.compiler import compile_spec  # noqa: E402
from madsl.lang.spec import spec_from_data  # noqa: E402
from madsl.weights import load_pretrained  # noqa: E402

TOLERANCE = 1e-4
CASES = {
    "residual factors": {},
    "factors at 1": {"factors": False},
    "tied, a sliding window of 5": {"tied": True, "sliding_window": 5},
}
M1_KEYS = {  # MiniMaxConfig's key -> MiniMax-M1's
    "full_attn_alpha_factor": "layernorm_full_attention_alpha",
    "full_attn_beta_factor": "layernorm_full_attention_beta",
    "linear_attn_alpha_factor": "layernorm_linear_attention_alpha",
    "linear_attn_beta_factor": "layernorm_linear_attention_beta",
    "mlp_alpha_factor": "layernorm_mlp_alpha",
    "mlp_beta_factor": "layernorm_mlp_beta",
}


def _relaxed(model, spec_changes: dict):
    """`model`'s weights in the model of its spec with `spec_changes`."""
    other = compile_spec(spec_from_data({**model.spec.data, **spec_changes}))
    other.load_state_dict(model.state_dict())
    return other.eval()


@pytest.mark.parametrize("case", CASES, ids=CASES)
def test_logits_equal_transformers_through_prefill_and_step(tmp_path: Path, case: str) -> None:
    folder = minimax(tmp_path / "ckpt", **CASES[case])
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    with torch.no_grad():
        got = model(ids)
    assert (got - expected).abs().max().item() < TOLERANCE and expected.abs().max().item() > 2.0
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE
    assert model.spec.postnorm and model.spec.norm_eps == 1e-6


def test_postnorm_and_the_residual_factors_matter(tmp_path: Path) -> None:
    folder = minimax(tmp_path / "ckpt")
    ids = tokens(21)
    expected = reference(folder, ids)
    model = load_pretrained(folder)
    assert set(model.spec.data["residual_factors"]) == {"A", "Lt", "MoE"}
    for changes in ({"postnorm": False}, {"residual_factors": {}}):
        with torch.no_grad():
            assert (_relaxed(model, changes)(ids) - expected).abs().max().item() > 100 * TOLERANCE


def test_the_decay_buffers_are_checked_and_may_be_left_out(tmp_path: Path, capsys) -> None:
    folder = minimax(tmp_path / "ckpt", factors=False)
    tensors = load_file(folder / "model.safetensors")
    buffers = [name for name in tensors if name.endswith(("slope_rate", "query_decay", "key_decay", "diagonal_decay"))]
    assert len(buffers) == 12  # three lightning layers
    ids = tokens(11)
    expected = reference(folder, ids)
    save_file({k: v for k, v in tensors.items() if k not in buffers}, folder / "model.safetensors")
    with torch.no_grad():  # left out: transformers computes them, madsl never reads them
        assert (load_pretrained(folder)(ids) - expected).abs().max().item() < TOLERANCE
    name = "model.layers.3.self_attn.slope_rate"
    save_file({**tensors, name: tensors[name] * 1.01}, folder / "model.safetensors")
    assert main(["import", str(folder), "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert f"'{name}' is not the constant its config.json makes of it" in error and not (tmp_path / "out").exists()


# ---- MiniMax-M1: MiniMax's own config keys, its code's computation ----------------------------------------


def _as_minimax_m1(folder: Path, out: Path, *, rotary_dim: int, postnorm: bool) -> Path:
    """The checkpoint in `folder` in MiniMax-M1's config keys (and without transformers' decay buffers,
    which MiniMax-M1's code does not have)."""
    config = json.loads((folder / "config.json").read_text())
    m1 = {M1_KEYS.get(key, key): value for key, value in config.items() if key not in ("layer_types", "block_size")}
    m1["rope_theta"] = m1.pop("rope_parameters")["rope_theta"]
    m1 |= {"model_type": "minimax_m1", "architectures": ["MiniMaxM1ForCausalLM"], "postnorm": postnorm}
    m1 |= {"attn_type_list": [int(kind == "full_attention") for kind in config["layer_types"]]}
    m1 |= {"rotary_dim": rotary_dim, "shared_intermediate_size": 0}
    out.mkdir()
    (out / "config.json").write_text(json.dumps(m1))
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if "decay" not in k and "slope" not in k}, out / "model.safetensors")
    return out


def _minimax_m1_reference(folder: Path, ids, *, rotary_dim: int, postnorm: bool, monkeypatch):
    """MiniMax-M1's logits: transformers' MiniMaxForCausalLM of the tensors in `folder` (its own keys)
    with MiniMax-M1's slopes, partial rotary embedding and `postnorm` (modeling_minimax_m1.py)."""
    from transformers.models.minimax import modeling_minimax as modeling

    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    config, layers = model.config, model.model.layers
    for index, layer in enumerate(layers):
        attention = layer.self_attn
        if isinstance(attention, modeling.MiniMaxLightningAttention):  # slope * (1 - l / (layers - 1) + 1e-5)
            base = 1 / (2 ** (8 / config.num_attention_heads))
            slope = base ** (torch.arange(config.num_attention_heads) + 1) * (1 - index / (len(layers) - 1) + 1e-5)
            slope = slope[:, None, None]
            attention.slope_rate = slope
            attention.query_decay, attention.key_decay, attention.diagonal_decay = attention.decay_factors(slope)
    theta = config.rope_parameters["rope_theta"]
    model.model.rotary_emb.inv_freq = 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)

    def partial_rotary(q, k, cos, sin, unsqueeze_dim=1):  # MiniMax-M1's: the first rotary_dim channels
        cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
        out = []
        for x in (q, k):
            rotated, kept = x[..., :rotary_dim], x[..., rotary_dim:]
            out.append(torch.cat((rotated * cos + modeling.rotate_half(rotated) * sin, kept), dim=-1))
        return tuple(out)

    def decoder_layer(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        residual, hidden_states = hidden_states, self.input_layernorm(hidden_states)
        residual = hidden_states if postnorm else residual
        out, _ = self.self_attn(hidden_states, position_embeddings, attention_mask)
        hidden_states = residual * self.attn_alpha_factor + out * self.attn_beta_factor
        residual, hidden_states = hidden_states, self.post_attention_layernorm(hidden_states)
        residual = hidden_states if postnorm else residual
        return residual * self.mlp_alpha_factor + self.mlp(hidden_states) * self.mlp_beta_factor

    monkeypatch.setattr(modeling, "apply_rotary_pos_emb", partial_rotary)
    monkeypatch.setattr(modeling.MiniMaxDecoderLayer, "forward", decoder_layer)
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("rotary_dim, postnorm", [(8, True), (4, False)], ids=["whole heads, postnorm", "partial"])
def test_minimax_m1_computes_its_codes_logits(tmp_path: Path, monkeypatch, rotary_dim: int, postnorm: bool) -> None:
    folder = minimax(tmp_path / "ckpt")
    m1 = _as_minimax_m1(folder, tmp_path / "m1", rotary_dim=rotary_dim, postnorm=postnorm)
    ids = tokens(21)
    expected = _minimax_m1_reference(folder, ids, rotary_dim=rotary_dim, postnorm=postnorm, monkeypatch=monkeypatch)
    model = load_pretrained(m1)
    with torch.no_grad():
        got = model(ids)
    assert (got - expected).abs().max().item() < TOLERANCE and expected.abs().max().item() > 2.0
    assert prefill_and_step_error(model, ids, expected, prompt=9) < TOLERANCE
    assert model.spec.postnorm == postnorm
    with torch.no_grad():  # MiniMax-M1's postnorm and rotary_dim are read: the other reading computes otherwise
        changed = _relaxed(model, {"postnorm": not postnorm})(ids)
        assert (changed - expected).abs().max().item() > 100 * TOLERANCE
        if rotary_dim < 8:
            whole = {**model.spec.data["layers"]["A"], "rotary_fraction": 1.0}
            changed = _relaxed(model, {"layers": {**model.spec.data["layers"], "A": whole}})(ids)
            assert (changed - expected).abs().max().item() > 100 * TOLERANCE
    if rotary_dim == 8:  # whole heads: transformers' MiniMaxForCausalLM, up to its slopes' layer factor
        assert (reference(folder, ids) - expected).abs().max().item() < TOLERANCE


def test_minimax_m1_is_not_exported_and_says_why(tmp_path: Path, capsys) -> None:
    m1 = _as_minimax_m1(minimax(tmp_path / "ckpt"), tmp_path / "m1", rotary_dim=8, postnorm=True)
    assert main(["import", str(m1), "--out", str(tmp_path / "madsl"), "-q"]) == 0
    assert main(["export", str(tmp_path / "madsl"), "--to-hf", "minimax_m1", "-o", str(tmp_path / "hf")]) == 2
    error = capsys.readouterr().err
    assert "--to-hf minimax_m1: transformers has no MiniMax-M1 class" in error and "Traceback" not in error
    assert not (tmp_path / "hf").exists()


def test_minimax_m1_at_a_head_count_not_a_power_of_two_is_refused(tmp_path: Path, capsys) -> None:
    m1 = _as_minimax_m1(minimax(tmp_path / "ckpt"), tmp_path / "m1", rotary_dim=8, postnorm=True)
    config = json.loads((m1 / "config.json").read_text())
    (m1 / "config.json").write_text(json.dumps({**config, "num_attention_heads": 3, "num_key_value_heads": 1}))
    assert main(["import", str(m1), "--out", str(tmp_path / "out")]) == 2
    assert "is not a power of two" in capsys.readouterr().err and not (tmp_path / "out").exists()
