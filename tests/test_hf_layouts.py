"""Options that state Hugging Face models (seed 004's GPT-Neo and Mamba) as specs: attention's
softmax `scale` and `out_bias`, and the model-wide `positions: learned`, `embedding_std`,
`linear_std`. Each is counted as built, changes the identity only off its default, and is a
located error when its value is bad."""

from __future__ import annotations

import math

import pytest
import torch
from layer_helpers import make

import madsl
from madsl.errors import MadslError

GPT_NEO = """name: neo
dim: 32
seq_len: 16
norm: layer
positions: learned
linear_std: 0.02
channel_mixer: Mlp
layers:
  Ag: {primitive: attention, heads: 2, rotary: false, scale: 1.0, out_bias: true}
  Mlp: {bias: true}
topology: 2Ag
"""


def _spec(tmp_path, text: str, name: str = "s.mad"):
    path = tmp_path / name
    path.write_text(text)
    return madsl.load_spec(path)


def test_scale_one_is_unscaled_softmax_attention():
    torch.manual_seed(0)
    _, module = make("attention", 16, heads=2, rotary=False, scale=1.0)
    module = module.double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    q, k, v = module.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2)  # no 1/sqrt(head_dim)
    scores = scores.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
    expected = module.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16))
    torch.testing.assert_close(module(x), expected)
    _, default = make("attention", 16, heads=2, rotary=False)
    default.load_state_dict(module.float().state_dict())
    assert not torch.allclose(default(x.float()), module(x.float()))


def test_out_bias_is_on_the_output_projection_alone():
    prim, module = make("attention", 16, heads=2, out_bias=True)
    assert module.qkv.bias is None and module.out.bias is not None
    assert prim.params() == sum(p.numel() for p in module.parameters()) == 4 * 16 * 16 + 16


def test_gpt_neo_layout_compiles_counts_and_initialises_as_gpt_neo(tmp_path):
    spec = _spec(tmp_path, GPT_NEO)
    model = madsl.compile(spec, vocab_size=10)
    account = madsl.account(spec, vocab=10)
    assert account.totals["params"] == sum(p.numel() for p in model.parameters())
    assert model.positions.weight.shape == (16, 32)
    # per layer as GPT-Neo's block: q, k, v without bias, out_proj with, two LayerNorms, an MLP with biases
    assert (
        account.totals["params"] == 10 * 32 + 16 * 32 + 2 * (4 * 32 * 32 + 32 + 2 * 64 + 2 * 32 * 128 + 128 + 32) + 64
    )
    linears = [m for m in model.body.modules() if isinstance(m, torch.nn.Linear)]
    assert all(abs(m.weight.std().item() - 0.02) < 0.004 for m in linears)
    assert all(m.bias is None or not m.bias.any() for m in linears)
    # positions matter: the same tokens at shifted positions give other outputs
    tokens = torch.tensor([[1, 2, 3, 1, 2, 3]])
    assert not torch.allclose(model(tokens)[0, :3], model(tokens)[0, 3:])


def test_learned_positions_step_equals_the_parallel_forward(tmp_path):
    model = madsl.compile(_spec(tmp_path, GPT_NEO), vocab_size=10).eval()
    tokens = torch.randint(0, 10, (2, 9))
    expected = model(tokens)
    logits, state = model.prefill(tokens[:, :4])
    torch.testing.assert_close(logits, expected[:, :4], atol=1e-5, rtol=1e-5)
    for t in range(4, 9):
        step_logits, state = model.step(tokens[:, t], state)
        torch.testing.assert_close(step_logits, expected[:, t], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="past the 16 learned positions"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_embedding_std_sets_the_embedding_init(tmp_path):
    spec = _spec(tmp_path, "name: m\ndim: 64\ntopology: 2Mb\nembedding_std: 0.1\n")
    model = madsl.compile(spec, vocab_size=512)
    assert abs(model.embedding.weight.std().item() - 0.1) < 0.005
    default = madsl.compile(_spec(tmp_path, "name: m\ndim: 64\ntopology: 2Mb\n", "d.mad"), vocab_size=512)
    assert abs(default.embedding.weight.std().item() - 0.02) < 0.002


def test_model_options_enter_the_identity_only_off_their_defaults(tmp_path):
    base = _spec(tmp_path, "name: m\ndim: 32\ntopology: 2mA\n").identity()
    restated = _spec(
        tmp_path,
        "name: m\ndim: 32\ntopology: 2mA\npositions: none\nembedding_std: 0.02\n"
        "linear_std: null\nlayers:\n  mA: {scale: null, out_bias: false}\n",
        "r.mad",
    )
    assert restated.identity() == base
    for extra in (
        "positions: learned",
        "embedding_std: 0.1",
        "linear_std: 0.02",
        "layers:\n  mA: {scale: 1.0}",
        "layers:\n  mA: {out_bias: true}",
    ):
        assert _spec(tmp_path, f"name: m\ndim: 32\ntopology: 2mA\n{extra}\n", "x.mad").identity() != base


@pytest.mark.parametrize(
    "line, column",
    [("positions: sinusoidal", 12), ("embedding_std: 0", 16), ("linear_std: -1", 13), ("embedding_std: yes", 16)],
)
def test_bad_model_options_are_located_errors(tmp_path, line, column):
    with pytest.raises(MadslError) as err:
        _spec(tmp_path, f"name: m\ndim: 32\ntopology: 2mA\n{line}\n")
    assert f"s.mad:4:{column}" in str(err.value)


def test_bad_attention_scale_is_a_located_error(tmp_path):
    with pytest.raises(MadslError) as err:
        madsl.account(_spec(tmp_path, "name: m\ndim: 32\ntopology: 2mA\nlayers:\n  mA: {scale: -1.0}\n"))
    assert "scale" in str(err.value) and "s.mad:5" in str(err.value)


def test_a_run_longer_than_the_learned_positions_is_refused_before_training(tmp_path):
    from tests.test_cli import madsl as run_madsl

    spec = tmp_path / "s.mad"
    spec.write_text(GPT_NEO + "eval:\n  protocol: smoke\n  tasks: [in-context-recall]\n  set: {seq_len: 32}\n")
    proc = run_madsl("eval", str(spec), "--db", str(tmp_path / "r.db"), check_rc=2)
    assert "s.mad:3:10" in proc.stderr and "past the 16 learned positions" in proc.stderr
