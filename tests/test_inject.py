"""Injectors, `Zs#a>M2`: a layer written before `>` reads the block's input, and its output is added to the
input of the mixer's pre-norm, not to the stream (Zamba2's hybrid layer: h + M2(norm(h + z))).

Checked here with ordinary layers as injectors (tests/test_zamba_shared.py checks Zamba2's own block): the
syntax and its canonical form, the plan (an injector node with its "inject" edges, no pre-norm of its own,
counted as built), the arithmetic of the block, recurrent inference equal to the forward, a tagged injector
counted once, and every target that cannot express an injector refusing it by name.
"""

from __future__ import annotations

import pytest
import torch

from madsl import compiler
from madsl import topology as topo
from madsl.convert import to_megatron_pattern
from madsl.errors import MadslError
from madsl.graph import account, build_graph
from madsl.model_parts import Inject, PreNorm
from madsl.spec import spec_from_topology
from madsl.structure import plan_blocks, sources

torch.set_num_threads(1)


def test_an_injector_parses_prints_and_keeps_its_place_in_the_canonical_form():
    parsed = topo.parse("M2-none:A#a>M2-none:(A#a>[M2 | H])x2")
    block = parsed[1]
    assert block.inject == topo.Layer("A", (), "a") and block.mixer == topo.Layer("M2")
    assert topo.canonical(parsed) == "M2-none:A#a>M2-none:2A#a>[M2 | H]"
    assert topo.expand(topo.parse(topo.canonical(parsed))) == topo.expand(parsed)
    assert topo.size(parsed) == 1 + 2 + 2 * 3  # an injector counts as a layer against the block limit
    assert [layer.symbol for layer in topo.layers(topo.parse("A>M2-Sg"))] == ["A", "M2", "Sg"]


@pytest.mark.parametrize(
    "text, column",
    [("A>", 3), (">M2", 1), ("A>>M2", 3), ("A>M2>H", 5), ("M2-A>H", 5)],
)
def test_a_misplaced_injector_is_a_located_syntax_error(text, column):
    with pytest.raises(topo.TopologySyntaxError) as err:
        topo.parse(text)
    assert err.value.span.column == column


def test_the_plan_holds_the_injector_without_a_norm_and_counts_what_is_built():
    spec = spec_from_topology("A>M2-Sg", dim=32, vocab=20)
    plan = build_graph(spec)
    assert plan.nodes["b0.inject"]["injects"] and sources(plan, "b0.mixer", "inject") == ["b0.inject"]
    assert sources(plan, "b0.inject", "inject") == ["embedding"]
    (block,) = plan_blocks(plan)
    assert block.inject["layer"].symbol == "A" and [node["layer"].symbol for node in block.mixers] == ["M2"]
    rows = {row.node: row for row in account(spec).layers}
    assert rows["b0.inject"].norm_params == 0 and rows["b0.mixer"].norm_params == 32
    model = compiler.compile_spec(spec, max_seq_len=16)
    assert isinstance(model.body[0].mixer, Inject)
    assert model.num_params() == account(spec).totals["params"]


def test_the_block_computes_h_plus_mixer_of_norm_of_h_plus_the_injection():
    spec = spec_from_topology("A>M2-none", dim=32, vocab=11)
    model = compiler.compile_spec(spec, max_seq_len=8).double()
    block = model.body[0]
    injector, unit = block.mixer.injector, block.mixer.unit
    assert isinstance(unit, PreNorm)
    h = torch.randn(2, 7, 32, dtype=torch.float64)
    expected = h + unit.layer(unit.norm(h + injector(h)))
    assert torch.allclose(block(h), expected, atol=1e-12, rtol=0)
    # and it is not the sum the parallel form [A | M2] or a plain A-block would give
    assert (block(h) - (h + injector(unit.norm(h)) + unit.layer(unit.norm(h)))).abs().max() > 1e-3


def test_recurrent_inference_through_injectors_equals_the_forward():
    spec = spec_from_topology("M2-none:A#a>M2-none:A#a>[M2 | H]-Sg", dim=32, vocab=20)
    torch.manual_seed(0)
    model = compiler.compile_spec(spec, max_seq_len=16).double()
    tokens = torch.randint(0, 20, (2, 9))
    full = model(tokens)
    logits, state = model.prefill(tokens[:, :5])
    out = [logits]
    for t in range(5, 9):
        step, state = model.step(tokens[:, t], state)
        out.append(step[:, None])
    assert (torch.cat(out, 1) - full).abs().max() < 1e-10
    assert model.state_size(state) == {
        key: account(spec, seq_len=9).totals[key] for key in ("fixed_state", "conv_state", "kv_cache")
    }


def test_a_tagged_injector_is_one_module_counted_once():
    spec = spec_from_topology("A#a>M2-none:A#a>M2-none", dim=32, vocab=20)
    rows = [row for row in account(spec).layers if row.symbol == "A"]
    assert [row.shared for row in rows] == [False, True] and rows[1].params == 0
    model = compiler.compile_spec(spec, max_seq_len=16)
    assert model.body[0].mixer.injector is model.body[1].mixer.injector
    assert model.num_params() == account(spec).totals["params"]


def test_targets_that_cannot_express_an_injector_refuse_it_by_name():
    spec = spec_from_topology("A>M2-Mlp", dim=32, vocab=20, channel_mixer="Mlp")
    with pytest.raises(MadslError, match=r"'A': injectors \('>'\) have no Megatron pattern"):
        to_megatron_pattern(spec)
    # (a search's references: tests/test_search_calibration.py)
