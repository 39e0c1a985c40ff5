"""The plan is the one description of a model's structure: the compiler builds the nesting and the
wiring from its graph, the converters and `madsl expand` read it, and one walker
(`madsl.structure`) says what a plain stack lacks. State dicts keep their names: every bundled
spec's state-dict keys and shapes equal those recorded before the compiler read its wiring from
the plan (tests/data/state_dict_keys.json.gz, written by the compiler of commit b15a2eb)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

import madsl
from madsl import topology as topo
from madsl.compiler import _Compiler
from madsl.convert import to_megatron_pattern
from madsl.graph import build_graph
from madsl.hf_config import to_hf_config
from madsl.model_parts import Block, Fork, GroupConnection, Stack
from madsl.plan_layout import plan_structure
from madsl.spec import spec_from_topology
from madsl.structure import GROUP, PARALLEL, SETTINGS, TAG, beyond_stack, plan_blocks, sources

ROOT = Path(__file__).resolve().parent.parent
with gzip.open(Path(__file__).parent / "data" / "state_dict_keys.json.gz", "rt", encoding="utf-8") as _file:
    RECORDED: dict[str, list[str]] = json.load(_file)["specs"]


def _keys(model: torch.nn.Module) -> list[str]:
    return [f"{key} {'x'.join(map(str, value.shape))}" for key, value in model.state_dict().items()]


@pytest.mark.parametrize("path", sorted(RECORDED))
def test_every_bundled_spec_keeps_its_state_dict_keys_and_shapes(path):
    if not (ROOT / path).exists():
        pytest.skip(f"{path} is no longer bundled")
    spec = madsl.load_spec(ROOT / path)
    with torch.device("meta"):  # names and shapes only: a 52B model builds in milliseconds
        model = madsl.compile(spec, vocab_size=spec.vocab or 16)
    keys = _keys(model)
    assert keys == RECORDED[path], (
        f"missing: {[k for k in RECORDED[path] if k not in keys][:5]}, "
        f"new: {[k for k in keys if k not in RECORDED[path]][:5]}"
    )


def _joins(plan) -> list[tuple[tuple[str, str], ...]]:
    """Each block's (part, join kind), in stack order, as the plan's join nodes hold them."""
    by_block: dict[int, list[tuple[str, str]]] = {}
    for _, node in plan.nodes(data=True):
        if node["kind"] == "add":
            by_block.setdefault(node["block"], []).append((node["part"], node["kind"]))
    return [tuple(joins) for _, joins in sorted(by_block.items())]


def test_each_block_is_wired_as_its_plan_joins_say():
    spec = spec_from_topology("H:Mb:[H | mA]-Sg:(A:2Mb){residual=gated}:(A-none | Mb-MoE)", dim=32)
    model = madsl.compile(spec, vocab_size=8)
    blocks = [module for module in model.modules() if isinstance(module, Block)]  # depth first: stack order
    assert [block.wiring for block in blocks] == _joins(model.plan)
    assert blocks[1].wiring == (("mixer", "add"),)  # Mamba mixes channels itself: no channel part


def test_the_nesting_is_read_from_the_plan_groups():
    spec = spec_from_topology("(A:(Mb){norm=layer}){residual=add}:((A | Mb:H){split=res}){residual=gated}", dim=16)
    model = madsl.compile(spec, vocab_size=8)
    outer, gated = model.body
    assert isinstance(outer, GroupConnection) and outer.residual == "add"
    assert isinstance(outer.body[1], Stack) and isinstance(outer.body[1][0], Block)  # (Mb){norm=layer}
    assert isinstance(gated, GroupConnection) and gated.residual == "gated"
    fork = gated.body[0]
    assert isinstance(fork, Fork) and [len(branch) for branch in fork.branches] == [1, 2]
    kinds = [node["kind"] for _, node in model.plan.nodes(data=True) if "group" in node]
    assert kinds.count("group") == 4 and {"group_add", "group_none", "group_gated"} <= set(kinds)


def test_a_block_takes_its_parts_from_the_plan():
    """Take the channel mixer out of a plan: the block it belonged to is built with its mixer alone."""
    spec = spec_from_topology("A-Sg:A-Sg", dim=16)
    plan = build_graph(spec, vocab=8)
    plan.add_edge("b0.add0", "b1.mixer", kind="data")
    plan.add_edge("b0.add0", "b1.add0", kind="residual")
    plan.remove_nodes_from(["b0.channel", "b0.add1"])
    first, second = _Compiler(spec, plan).body()
    assert first.wiring == (("mixer", "add"),) and not hasattr(first, "channel")
    assert second.wiring == (("mixer", "add"), ("channel", "add"))
    x = torch.randn(1, 4, 16)
    torch.testing.assert_close(first(x), x + first.mixer(x))


def test_the_structure_is_laid_out_from_the_syntax_alone():
    plan = plan_structure(topo.parse("(Foo:Bar-none | Baz#t{x=1}){split=res}"))  # symbols never looked up
    assert plan.nodes["g0"]["attrs"] == {"residual": "none", "split": "res", "combine": "mean", "branches": 2}
    assert plan.nodes["g0.none"]["entry"] == "g0" and sources(plan, "g0.none", "data") == ["g0.combine"]
    assert sources(plan, "g0.combine", "branch") == ["b1.add1", "b2.add0"]  # as written: Bar-none has a part
    assert [[topo.layer_text(n["layer"]) for n in (*b.mixers, b.channel) if n] for b in plan_blocks(plan)] == [
        ["Foo"],
        ["Bar", "none"],
        ["Baz#t{x=1}"],
    ]
    # a spec's plan is that structure (its channel mixers, norms, final norm) with every layer resolved
    spec = spec_from_topology("(H#a:A | Mb){split=res, residual=gated}:[H#a | mA]", dim=16, vocab=8)
    resolved = build_graph(spec)
    laid_out = plan_structure(spec.topology, channel_for=spec.channel_for, norm=spec.norm, final_norm=spec.final_norm)
    assert list(resolved.nodes) == list(laid_out.nodes)
    assert [e for e in resolved.edges(data=True) if e[2]["kind"] != "shares"] == list(laid_out.edges(data=True))
    assert [(u, v) for u, v, kind in resolved.edges(data="kind") if kind == "shares"] == [("b0.mixer", "b3.mixer0")]


def test_one_walker_names_what_a_plain_stack_lacks_in_stack_order():
    spec = spec_from_topology("A{heads=2}:[A | Mb]:(A:Mb){residual=gated}:(Mb){norm=layer}:Mb#t", dim=32)
    found = list(beyond_stack(build_graph(spec)))
    assert [s.kind for s in found] == [SETTINGS, PARALLEL, GROUP, GROUP, TAG]
    assert [s.text for s in found][1:4] == [
        "parallel mixers '[A | Mb]'",
        "a group connection (residual=gated)",
        "a group's norm=layer",
    ]


@pytest.mark.parametrize(
    "topology, message",
    [
        ("[M2 | A]-Sg", "parallel mixers '[M2 | A]' have no"),
        ("M2#t-Sg:M2#t-Sg", "'M2#t': shared tags (tied layers) have no"),
        ("(M2-Sg:A-Sg){residual=add}", "a group connection (residual=add) has no"),
        ("(M2-Sg | A-Sg)", "a group of branches (X | Y) has no"),
        ("(M2-Sg){linear_std=0.02}:A-Sg", "a group's linear_std=0.02 has no"),
    ],
)
def test_every_converter_refuses_a_structure_with_the_same_reason(topology, message):
    spec = spec_from_topology(topology, dim=64, vocab=100)
    for convert, target in (
        (to_megatron_pattern, "Megatron pattern"),
        (lambda s: to_hf_config(s, "granitemoehybrid"), "Granite 4.0 hybrid config.json"),
        (lambda s: to_hf_config(s, "jamba"), "Jamba config.json"),
    ):
        with pytest.raises(madsl.MadslError) as err:
            convert(spec)
        assert err.value.message == f"{spec.name}: {message} {target}"


def test_layer_settings_are_refused_by_megatron_alone():
    spec = spec_from_topology("M2{expand=4}-Sg:A-Sg", dim=64, vocab=100)
    with pytest.raises(madsl.MadslError, match="per-layer settings have no Megatron pattern"):
        to_megatron_pattern(spec)
    assert to_hf_config(spec, "granitemoehybrid")["layer_types"] == ["mamba", "attention"]
