"""The spec key `meta_tokens: M` (Hymba's meta tokens): M learned vectors prepended to every sequence, their
outputs dropped. Checked: the accounting (M x dim parameters; every layer reads L + M tokens: its KV cache and
FLOPs at that length), the forward (outputs for the sequence's own positions, which the meta tokens change),
recurrent inference from `init_state` (the state after the meta tokens) and from `prefill`, equal to the
forward, bad values located, and the identity of specs without meta tokens unchanged."""

from __future__ import annotations

import pytest
import torch
from layer_helpers import model_steps

import madsl
from madsl import compiler
from madsl.errors import MadslError
from madsl.spec import spec_from_data

torch.set_num_threads(1)


def _spec(meta: int, topology: str = "Mb:A-Sg", **extra) -> madsl.Spec:
    data = {"name": "meta", "dim": 32, "vocab": 20, "topology": topology, "layers": {"Mb": {"d_state": 4}}}
    return spec_from_data({**data, **({"meta_tokens": meta} if meta is not None else {}), **extra})


def test_meta_tokens_are_counted_and_every_layer_reads_them():
    plain, meta = madsl.account(_spec(0), seq_len=10), madsl.account(_spec(6), seq_len=10)
    assert meta.totals["params"] - plain.totals["params"] == 6 * 32
    assert [part.name for part in meta.parts if part.name == "meta_tokens"] == ["meta_tokens"]
    # attention's KV cache and every layer's FLOPs at 10 + 6 tokens
    assert meta.totals["kv_cache"] == madsl.account(_spec(0), seq_len=16).totals["kv_cache"] == 2 * 32 * 16
    assert [row.flops for row in meta.layers] == [row.flops for row in madsl.account(_spec(0), seq_len=16).layers]


def test_the_forward_gives_the_sequences_own_positions_which_the_meta_tokens_change():
    model = compiler.compile_spec(_spec(5), max_seq_len=16).double()
    tokens = torch.randint(0, 20, (2, 9))
    logits = model(tokens)
    assert logits.shape == (2, 9, 20) and model.num_params() == madsl.account(_spec(5)).totals["params"]
    with torch.no_grad():
        model.meta_tokens.add_(1.0)
    assert (model(tokens) - logits).abs().max() > 1e-3


@pytest.mark.parametrize("topology", ["Mb:A-Sg", "A>M2-none:(Mb:A{window=3})"])
def test_recurrent_inference_starts_after_the_meta_tokens(topology):
    spec = _spec(4, topology, **({"layers": {"Mb": {"d_state": 4}, "M2": {"d_state": 8}}}))
    torch.manual_seed(0)
    model = compiler.compile_spec(spec, max_seq_len=16).double()
    tokens = torch.randint(0, 20, (2, 8))
    full = model(tokens)
    assert (model_steps(model, tokens)[0] - full).abs().max() < 1e-10
    logits, state = model.prefill(tokens[:, :5])
    assert (logits - full[:, :5]).abs().max() < 1e-10
    rest = [model.step(tokens[:, t], state)[0] for t in [5]]
    assert (rest[0] - full[:, 5]).abs().max() < 1e-10
    sizes = madsl.account(spec, seq_len=5).totals
    assert model.state_size(state) == {k: sizes[k] for k in ("fixed_state", "conv_state", "kv_cache")}


@pytest.mark.parametrize("value, message", [(-1, "from 0 to 65,536"), (70_000, "from 0 to 65,536"), (True, "integer")])
def test_a_bad_meta_tokens_is_a_located_error(tmp_path, value, message):
    path = tmp_path / "bad.mad"
    path.write_text(f"name: bad\ndim: 16\ntopology: A\nmeta_tokens: {str(value).lower()}\n")
    with pytest.raises(MadslError) as err:
        madsl.load_spec(path)
    assert message in err.value.message and err.value.location.line == 4


def test_a_spec_without_meta_tokens_keeps_its_identity():
    assert _spec(None).hash == _spec(0).hash != _spec(1).hash
