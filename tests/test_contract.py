"""The primitive contract, checked for every primitive the stdlib registers.

A primitive is two halves joined only by its resolved hyperparameters: the accounting
(`madsl/primitives/<name>.py`, no torch) and the module (`madsl/layers/<name>.py`,
built by `Primitive.build()` from the primitive itself). For every registered
primitive, at the MAD width with the stdlib defaults, at a second width, and with each
hyperparameter moved away from its default (generated here from the primitive's
fields, not listed by hand), this test checks that

- the module's parameters equal the accounted `params()` to the unit;
- the module is built from the primitive alone and reads every one of its fields;
- a sequence mixer's recurrent state, measured from `step` after L tokens, equals the
  accounted fixed state, convolution state and KV cache (kv_cache(L));
- step mode over a sequence equals the parallel forward (float64, perturbed weights);
- a channel mixer mixes nothing across positions (its step is itself, token by token), unless
  it accounts a convolution state (RWKV's token shift): then it is checked like a sequence mixer;
- backward gives finite gradients to the input and to every parameter;
- the accounted active parameters (`active_params`, what one token's output reads) cover every
  parameter the gradient of one token's output reaches and never exceed the total; they equal the
  total except in the routed primitives (ROUTED below);
- the accounted FLOPs of a forward of one sequence, less the part no FLOP counter sees
  (`non_matmul_flops`: FFT long convolutions, filter featurization, scans and recurrences,
  softmax, gates), plus what the module computes beyond the accounted algorithm, equal to the
  FLOP the products with weights and attention's products that torch's FlopCounterMode
  measures in the module's forward (NOT_MEASURED and COUNTER_SEES_MORE below list both).

A primitive registered in stdlib/primitives.yaml that breaks any of these fails the suite.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

import pytest
import torch
from torch.utils import _pytree
from torch.utils._python_dispatch import TorchDispatchMode

from madsl.lang.stdlib import primitives
from madsl.primitives.base import ConfigError, Primitive, resolve_width_relative

torch.set_num_threads(1)

MAD_WIDTH = 128
SECOND_WIDTH = 40  # small, and not a power of two: divisibility rules get exercised
SEQ_LEN = 11
BATCH = 2
STATE_KEYS = {"fixed": "fixed_state", "conv": "conv_state", "k": "kv_cache", "v": "kv_cache", "cache": "kv_cache"}


# ---- generating settings from a primitive's fields ----------------------------------------------


def _valid(cls: type[Primitive], dim: int, config: dict[str, Any]) -> Primitive | None:
    try:
        return cls.create(dim, config)
    except ConfigError:
        return None


def _alternatives(annotation: Any, value: Any) -> list[Any]:
    """Values other than `value` that a field of this type can take, nearest first."""
    origin, options = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # Optional[...]: None and a value of the type
        inner = next(o for o in options if o is not type(None))
        return ([None] if value is not None else [8, 4, 6]) + (_alternatives(inner, value) if value is not None else [])
    if origin is Literal:
        return [o for o in options if o != value]
    if annotation is bool:
        return [not value]
    if annotation is int:
        return [v for v in (2 * value, value // 2, value + 1, value + 2) if v >= 1 and v != value]
    if annotation is float:
        return [2.0 * value, 0.5 * value] if value else [0.5]
    return []


def _at_width(entry, dim: int) -> Primitive | None:
    """The stdlib defaults at width `dim`; where they do not validate there (e.g. experts x
    expert_width must equal the width), the integer defaults are scaled with the width, one
    at a time and then all together, and the first setting that validates is taken."""
    fields = entry.cls.fields()
    candidates = [dict(entry.defaults)]  # width-relative defaults (`4 * dim`) scale by themselves
    ints = [k for k, t in fields.items() if t is int]
    at_mad_width = resolve_width_relative(entry.defaults, MAD_WIDTH)
    scaled = {k: max(1, round(at_mad_width[k] * dim / MAD_WIDTH)) for k in ints}
    candidates += [{**entry.defaults, k: scaled[k]} for k in ints]
    candidates.append({**entry.defaults, **scaled})
    for config in candidates:
        prim = _valid(entry.cls, dim, config)
        if prim is not None:
            return prim
    return None


def _accounting(prim: Primitive) -> tuple:
    return (prim.params(), prim.fixed_state(), prim.conv_state(), prim.kv_cache(SEQ_LEN), prim.flops(SEQ_LEN))


def _moved_with_another(cls: type[Primitive], start: Primitive, key: str, annotation: Any) -> list[Primitive]:
    """`key` moved where no value of it validates alone because another integer field must be
    a multiple of it (attention's heads % kv_heads): each value of `key` with the other field
    at 2 to 5 times that value, the first setting that validates for each value."""
    fields = cls.fields()
    others = [k for k, t in fields.items() if k != key and t is int]
    out = []
    for value in _alternatives(annotation, getattr(start, key)):
        if not isinstance(value, int):
            continue
        found = next(
            (
                p
                for other in others
                for factor in range(2, 6)
                if (p := _valid(cls, start.dim, {**start.config(), key: value, other: factor * value})) is not None
            ),
            None,
        )
        if found is not None:
            out.append(found)
    return out


def settings(name: str) -> list[Primitive]:
    """The settings a primitive is checked at: MAD-width defaults, a second width, and each field
    moved to up to two valid other values (with another field that must be a multiple of it,
    where it cannot move alone). For the non-default options of a choice field
    (e.g. Hyena's filter family), a moved field is kept only where it changes the accounting:
    fields that only another option reads are not rebuilt for every option."""
    entry = primitives()[name]
    out = [entry.cls.create(MAD_WIDTH, dict(entry.defaults))]
    base = _at_width(entry, SECOND_WIDTH)
    assert base is not None, f"{name}: no setting validates at width {SECOND_WIDTH}"
    out.append(base)
    fields = entry.cls.fields()
    choices = [k for k, t in fields.items() if typing.get_origin(t) is Literal]
    bases = [base] + [
        p
        for k in choices
        for v in _alternatives(fields[k], getattr(base, k))
        if (p := _valid(entry.cls, base.dim, {**base.config(), k: v})) is not None
    ]
    for index, start in enumerate(bases):
        for key, annotation in fields.items():
            if key in choices:
                continue
            moved = [
                p
                for v in _alternatives(annotation, getattr(start, key))
                if (p := _valid(entry.cls, start.dim, {**start.config(), key: v})) is not None
            ]
            if not moved:
                moved = _moved_with_another(entry.cls, start, key, annotation)
            if index > 0:  # a non-default choice: only what its accounting sees
                moved = [p for p in moved if _accounting(p) != _accounting(start)]
            out += moved[:2]
        if index > 0:
            out.append(start)
    unique = list(dict.fromkeys(out))  # primitives are frozen dataclasses: hashable, comparable
    return unique


CASES = [(name, prim) for name in sorted(primitives()) for prim in settings(name)]


def _case_id(case) -> str:
    name, prim = case
    return f"{name}[dim={prim.dim}," + ",".join(f"{k}={v}" for k, v in prim.config().items()) + "]"


# ---- the contract --------------------------------------------------------------------------------


def _build(prim: Primitive, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return prim.build()


def _perturbed(module: torch.nn.Module) -> torch.nn.Module:
    """Weights moved off their structured initialisation (zero biases, ones, exact ladders), so
    that every term of forward and step is exercised."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return module


def _linked(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """A module that reads the model's token embeddings (an `embeddings` attribute, Zs: the model links
    them) gets a link holding a fixed random e of x's shape; e, or None for every other module. A module
    that reads another layer's keys and values (`kv_from`, Hymba's KV consumer) gets a producer beside it
    (`_with_producer`)."""
    if hasattr(module, "kv_from"):
        _with_producer(module, x)
        return None
    if not hasattr(module, "embeddings"):
        return None
    from madsl.layers.zamba import EmbeddingLink

    module.embeddings = EmbeddingLink()
    module.embeddings.value = torch.randn(x.shape, dtype=x.dtype, generator=torch.Generator().manual_seed(3))
    return module.embeddings.value


def _with_producer(module: torch.nn.Module, x: torch.Tensor) -> None:
    """Hymba's KV consumer (Hb with kv_reuse) linked to a producer of the same settings built beside it (its
    weights perturbed, x's dtype), run here on x so that the consumer's forward reads the producer's keys and
    values (the FLOPs then measure the consumer alone); the consumer's `init_state` and `step` are wrapped to
    start and step the producer first, on the same tokens, as a model runs its producer first."""
    from madsl.layers.hymba import KVLink

    producer = _perturbed(_build(dataclasses.replace(module.primitive, kv_reuse=False), seed=1)).to(x.dtype)
    producer.kv_source = module.kv_from = KVLink()
    producer(x)
    own_init, own_step, held = module.init_state, module.step, {}

    def init_state(batch: int, device=None, dtype=None) -> dict:
        held["state"] = producer.init_state(batch, device=device, dtype=dtype)
        return own_init(batch, device=device, dtype=dtype)

    def step(x_t: torch.Tensor, state: dict) -> tuple:
        held["state"] = producer.step(x_t, held["state"])[1]
        return own_step(x_t, state)

    module.init_state, module.step = init_state, step


def _aux_loss(module: torch.nn.Module) -> torch.Tensor | float:
    aux = getattr(module, "aux_loss", None)
    return aux if aux is not None else 0.0


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_parameters_equal_the_accounting(case):
    name, prim = case
    module = _build(prim)
    assert sum(p.numel() for p in module.parameters()) == prim.params(), name


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_forward_step_state_and_backward(case):
    name, prim = case
    module = _perturbed(_build(prim)).double()
    x = torch.randn(BATCH, SEQ_LEN, prim.dim, dtype=torch.float64, requires_grad=True)
    embeddings = _linked(module, x)
    y = module(x)
    assert y.shape == x.shape

    if prim.role == "channel" and prim.conv_state() == 0:
        # no state, and position-wise: each token alone gives the same output
        assert (prim.fixed_state(), prim.conv_state(), prim.kv_cache(SEQ_LEN)) == (0, 0, 0)
        alone = torch.cat([module(x[:, t : t + 1]) for t in range(SEQ_LEN)], dim=1)
        torch.testing.assert_close(alone, y, rtol=1e-10, atol=1e-10)
    else:
        with torch.no_grad():
            state = module.init_state(BATCH, dtype=torch.float64)
            outputs = []
            for t in range(SEQ_LEN):
                before = {k: v.clone() for k, v in state.items()}
                if embeddings is not None:
                    module.embeddings.value = embeddings[:, t]
                y_t, new_state = module.step(x[:, t].detach(), state)
                assert all(torch.equal(state[k], before[k]) for k in state), "step modified its input state"
                state = new_state
                outputs.append(y_t)
        torch.testing.assert_close(torch.stack(outputs, 1), y.detach(), rtol=1e-9, atol=1e-9)
        measured = {"fixed_state": 0, "conv_state": 0, "kv_cache": 0}
        for key, value in state.items():
            kind = key.partition(".")[0]  # "fixed.stabilizer": a further part of the fixed state
            if kind in STATE_KEYS:
                measured[STATE_KEYS[kind]] += value[0].numel()
            else:  # bookkeeping only (attention's next position): one number per sequence at most
                assert value[0].numel() <= 1 and not value.is_floating_point(), f"unaccounted state {key!r}"
        assert measured == {
            "fixed_state": prim.fixed_state(),
            "conv_state": prim.conv_state(),
            "kv_cache": prim.kv_cache(SEQ_LEN),
        }

    (y.square().mean() + _aux_loss(module)).backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for pname, p in module.named_parameters():
        assert p.grad is not None, f"{name}: {pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"


class _Reads:
    """Records which fields of a primitive a module's constructor reads."""

    def __init__(self, prim: Primitive):
        self.read: set[str] = set()
        names = {f.name for f in dataclasses.fields(prim)}
        read = self.read

        class Recording(type(prim)):
            def __getattribute__(self, attr):
                if attr in names:
                    read.add(attr)
                return object.__getattribute__(self, attr)

        self.prim = Recording(**{f.name: getattr(prim, f.name) for f in dataclasses.fields(prim)})


@pytest.mark.parametrize("name", sorted(primitives()))
def test_the_module_is_built_from_the_primitive_and_reads_every_field(name):
    """`build()` hands the module the primitive and nothing else, and over the checked
    settings the module reads every hyperparameter: none is ignored, and none has a second
    default inside the module."""
    cases = [prim for n, prim in CASES if n == name]
    read: set[str] = set()
    for prim in cases:
        reads = _Reads(prim)
        torch.manual_seed(0)
        reads.prim.build()
        read |= reads.read
    fields = {f.name for f in dataclasses.fields(cases[0])}
    assert read == fields, f"{name}: the module never reads {sorted(fields - read)}"
    cls = primitives()[name].cls
    module_cls = type(cases[0].build())
    import inspect

    parameters = list(inspect.signature(module_cls.__init__).parameters.values())[1:]
    assert len(parameters) == 1 and parameters[0].default is inspect.Parameter.empty, (
        f"{module_cls.__name__}.__init__ must take the resolved {cls.__name__} primitive alone"
    )


def test_every_registered_primitive_is_checked_at_several_settings():
    counts = {name: sum(1 for n, _ in CASES if n == name) for name in primitives()}
    assert all(count >= 4 for count in counts.values()), counts
    assert math.prod(counts.values()) > 0


# ---- FLOPs: the matmul class, measured --------------------------------------------------------------
#
# The accounting's `flops(L)` splits into `non_matmul_flops(L)` and the rest, the matmul class:
# products of activations with weights (projections, routers, experts, low-rank maps, short
# convolutions) and attention's q.k and p.v products. The matmul class is measured on the module's
# forward of one sequence with torch's FlopCounterMode (2 FLOPs per multiply-add, as the accounting),
# keeping the counted ops (mm, addmm, bmm, baddbmm, convolution, SDPA) of which exactly one factor
# derives from the input (a product with weights), and SDPA; and must equal the accounted matmul class
# to the FLOP, after the corrections of COUNTER_SEES_MORE. The counter does not see the rest.

# primitive -> what of its accounted FLOPs (non_matmul_flops) the counter cannot measure, and why
NOT_MEASURED = {
    "attention": "softmax 2·H·L² (elementwise; FlopCounterMode's SDPA formula counts q.k and p.v only)",
    "hyena": "FFT long convolutions (torch.fft is not counted), filter featurization S·L·D (its taps are made "
    "from weights alone, and the paper's S·L·D is an estimate), gates (elementwise)",
    "multihead_hyena": "as hyena: FFT convolutions of the outer products, featurization, gates and q readout",
    "hyena_experts": "as hyena, for the weighted experts",
    "mamba": "selective scan 2·L·D·E·S (elementwise recurrence; the chunked CPU scan's products are "
    "between activations)",
    "mamba2": "SSD scan 5·L·E·N, skip and gated norm 7·L·E (chunked form: products between activations)",
    "gla": "recurrence 4·L·H·dk·dv, counted in its recurrent form; the module runs a chunked form",
    "gated_conv": "the two gates 2·L·D (elementwise)",
    "delta_net": "delta rule 6·L·H·K·V (+ decay), recurrent form; the module runs a chunked form",
    "retention": "retention 5·L·H·K·V, recurrent form; the module runs a chunked form",
    "mlstm": "memory and normaliser 6·L·H·hd² + 6·L·H·hd, recurrent form; the module runs the quadratic "
    "parallel form (products between activations)",
    "linear_attention": "state update and readout 4·L·H·K·(V [+1]), recurrent form; the module runs a chunked form",
    "rwkv": "WKV 5·L·A·head_dim (chunked form) and token shift 8·L·D (elementwise)",
    "rwkv_channel": "token shift and gate 4·L·D (elementwise)",
    "swiglu": "nothing (the activation and the product are not accounted)",
    "mlp": "nothing (the activation is not accounted)",
    "kda": "delta rule 6·L·Hv·K·V and per-channel decay L·Hv·K·V, recurrent form; the module runs a chunked form",
    "rwkv7": "the recurrence 9·L·D·head_dim (recurrent form; the module runs a chunked form) and the "
    "token-shift mixes 12·L·D (elementwise)",
    "rglru": "the recurrence 2·L·W (elementwise; the module runs a log-depth scan)",
    "lightning": "recurrence 5·L·H·hd², recurrent form; the module runs a chunked form",
    "mla": "softmax 2·H·L² (elementwise; the SDPA formula counts q.k and p.v only)",
    "moe": "nothing (routing, activation and weighting are not accounted)",
    "zamba_shared": "softmax 2·H·L² (elementwise; the SDPA formula counts q.k and p.v only)",
    "hymba": "selective scan 2·L·E·N (elementwise recurrence) and softmax 2·H·L·min(L, window + sinks)",
}


def _router_at_one_flop(prim) -> int:
    """App. C.4.7 and C.4.8 print the router as L·D·A (the accounting follows them); the counter
    counts its multiply-adds twice."""
    return SEQ_LEN * prim.dim * prim.experts


# primitive -> (what the module computes beyond the accounted algorithm, its FLOPs at SEQ_LEN): the
# counter sees these too, exactly, and the comparison adds them to the accounted matmul class.
COUNTER_SEES_MORE = {
    "attention": (
        "with window w < L, SDPA runs dense with a banded mask: all L² (query, key) pairs, "
        "where the accounting counts the L·min(L, w) a windowed kernel computes",
        lambda p: 4 * p.inner * SEQ_LEN * (SEQ_LEN - p.attended(SEQ_LEN)),
    ),
    "moe": (
        "dense dispatch (set for the measurement) runs every expert's down projection on every "
        "token, the accounting the weighted experts' only; the router at 1 FLOP per multiply-add",
        lambda p: (
            2 * SEQ_LEN * p.expert_dim * p.down_inputs * (p.experts - p.weighted_experts) + _router_at_one_flop(p)
        ),
    ),
    "hyena_experts": ("the router at 1 FLOP per multiply-add", _router_at_one_flop),
    "hymba": (
        "SDPA takes one head width (the narrower of q.k and v zero-padded to the wider) and, with a window "
        "w + sinks < L, runs dense with the mask: all L² pairs where the accounting counts L·min(L, w + sinks)",
        lambda p: (
            2 * p.heads * SEQ_LEN * SEQ_LEN * 2 * max(p.qk_head_dim, p.v_head_dim)
            - 2 * p.heads * SEQ_LEN * p.attended(SEQ_LEN) * (p.qk_head_dim + p.v_head_dim)
        ),
    ),
    "mla": (
        "SDPA takes one head width: the narrower of q.k (nope + rope) and v is zero-padded to the wider",
        lambda p: 2 * SEQ_LEN * SEQ_LEN * p.heads * abs(p.qk_head_dim - p.v_head_dim),
    ),
}

_aten = torch.ops.aten
# the factors of each counted product: (input, weight) positions in the op's arguments
_PRODUCTS = {_aten.mm: (0, 1), _aten.addmm: (1, 2), _aten.bmm: (0, 1), _aten.baddbmm: (1, 2), _aten.convolution: (0, 1)}
_SDPA = {
    _aten._scaled_dot_product_flash_attention_for_cpu,
    _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_efficient_attention,
    _aten._scaled_dot_product_cudnn_attention,
}


def _cpu_sdpa_flop(query, key, value, *args, out_shape=None, **kwargs) -> int:
    """FlopCounterMode has no formula for SDPA's CPU kernel: the one of its CUDA kernels."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


class _ByFactor(TorchDispatchMode):
    """Runs inside FlopCounterMode and sorts the FLOPs it counts, with its formulas, by what the
    factors of each product derive from: the input (anything computed from it, followed op by op)
    or not (weights, buffers, constants). A product of one of each is a product with weights."""

    def __init__(self, x: torch.Tensor, registry: dict):
        super().__init__()
        self.registry = registry
        self.keep = [x]  # held, so that no storage of the input's descendants is reused meanwhile
        self.derived = {x.untyped_storage().data_ptr()}
        self.flops: dict[str, int] = {
            "weights": 0,
            "attention": 0,
            "between activations": 0,
            "weights alone": 0,
            "other": 0,
            "padding": 0,
        }

    def _from_input(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.numel() > 0 and t.untyped_storage().data_ptr() in self.derived

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(self._from_input(t) for t in _pytree.tree_leaves((args, kwargs))):
            for t in _pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.numel() > 0:
                    self.keep.append(t)
                    self.derived.add(t.untyped_storage().data_ptr())
        op = func.overloadpacket
        if op in self.registry:
            flops = self.registry[op](*args, **kwargs, out_val=out)
            if op in _SDPA:
                self.flops["attention"] += flops
            elif op in _PRODUCTS:
                a, b = (self._from_input(args[i]) for i in _PRODUCTS[op])
                kind = "weights" if a != b else "between activations" if a else "weights alone"
                self.flops[kind] += flops
                if op is _aten.convolution and kind == "weights" and out.dim() == 3:
                    # a causal conv returns L outputs; one padded on both sides computes k - 1 more, then cuts them
                    kept = min(args[0].shape[-1], out.shape[-1])
                    self.flops["padding"] += flops - flops * kept // out.shape[-1]
            else:
                self.flops["other"] += flops
        return out


def measured_matmul_flops(prim: Primitive) -> tuple[int, dict[str, int]]:
    """The matmul-class FLOPs of the module's forward of one sequence of SEQ_LEN (batch 1): products
    with weights (over the L outputs of a causal conv) plus SDPA, and the whole sorted count. The
    Hyena family runs its FFT convolution (`conv_method`: the Toeplitz matmul picked for short
    sequences is a CPU speed choice), MoE its dense dispatch (the same for any routing)."""
    from torch.utils.flop_counter import FlopCounterMode

    module = _build(prim)
    if hasattr(module, "conv_method"):
        module.conv_method = "fft"
    if hasattr(module, "dense_dispatch"):
        module.dense_dispatch = True
    x = torch.randn(1, SEQ_LEN, prim.dim)
    _linked(module, x)  # made before the count: e derives from no input
    counter = FlopCounterMode(
        display=False, custom_mapping={_aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop}
    )
    with counter:
        sorter = _ByFactor(x, counter.flop_registry)
        with sorter:
            module(x)
    flops = sorter.flops
    assert sum(v for k, v in flops.items() if k != "padding") == counter.get_total_flops(), (
        f"{prim.name}: FlopCounterMode counted FLOPs the sorting did not see: {flops}"
    )
    return flops["weights"] - flops["padding"] + flops["attention"], flops


def flop_contract_error(prim: Primitive) -> str | None:
    """None where the accounted matmul class, flops(L) - non_matmul_flops(L) (L = SEQ_LEN), plus what
    the module computes beyond it (COUNTER_SEES_MORE), equals the measured one to the FLOP; else why not."""
    total, rest = prim.flops(SEQ_LEN), prim.non_matmul_flops(SEQ_LEN)
    if rest is None:
        return f"{prim.name}: non_matmul_flops is not stated, so no part of its FLOPs can be measured"
    if not 0 <= rest <= total:
        return f"{prim.name}: non_matmul_flops({SEQ_LEN}) = {rest:,} is not a part of flops = {total:,}"
    extra = COUNTER_SEES_MORE[prim.name][1](prim) if prim.name in COUNTER_SEES_MORE else 0
    expected = total - rest + extra
    measured, sorted_flops = measured_matmul_flops(prim)
    if measured != expected:
        return (
            f"{prim.name}: the accounted matmul class is {total - rest:,} FLOPs (flops {total:,} - "
            f"non_matmul_flops {rest:,}){f' + {extra:,} the module computes beyond it' if extra else ''}, "
            f"but the module's forward measures {measured:,} ({measured - expected:+,}); counted: {sorted_flops}"
        )
    return None


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_flops_of_the_matmul_class_equal_the_measured_ones(case):
    _, prim = case
    error = flop_contract_error(prim)
    assert error is None, error


def test_every_primitive_states_what_the_flop_counter_misses():
    assert set(NOT_MEASURED) == set(primitives()), set(primitives()) ^ set(NOT_MEASURED)
    assert set(COUNTER_SEES_MORE) <= set(primitives())


def test_a_wrong_flop_formula_fails_the_flop_contract(monkeypatch):
    """The check sees a coefficient off and a term dropped, in primitives with and without a part
    the counter cannot see."""
    cases = {name: next(prim for n, prim in CASES if n == name) for name in ("swiglu", "hyena", "attention")}
    swiglu, hyena, attention = cases["swiglu"], cases["hyena"], cases["attention"]
    assert [flop_contract_error(prim) for prim in cases.values()] == [None] * 3

    right = {name: type(prim).flops for name, prim in cases.items()}
    # SwiGLU 10% over
    monkeypatch.setattr(type(swiglu), "flops", lambda self, L: round(1.1 * right["swiglu"](self, L)))
    # Hyena without its output projection, 2·L·I·D
    monkeypatch.setattr(type(hyena), "flops", lambda self, L: right["hyena"](self, L) - 2 * L * self.inner * self.dim)
    # attention counting q.k but not p.v: 2·L²·I where App. C.4.1 has 4·L²·D
    monkeypatch.setattr(
        type(attention), "flops", lambda self, L: right["attention"](self, L) - 2 * L * self.attended(L) * self.inner
    )
    for prim in cases.values():
        error = flop_contract_error(prim)
        assert error is not None and error.startswith(f"{prim.name}: the accounted matmul class"), error


# ---- active parameters: what one token's output reads -------------------------------------------------
#
# A parameter one token's output reads gets a gradient from that output (weights perturbed off their
# structured initialisation, float64): the nonzero gradients of the last position's output of one
# sequence count a lower bound of the token's active parameters. Only a lower bound: a ReLU that is 0
# for this token, a filter tap past the sequence or a router row outside the chosen experts' softmax is
# read (or may be, by another token) but gets no gradient.

# primitive -> what of its parameters a token does not read: the primitives whose active_params are
# below params (every other one's equal them at every setting)
ROUTED = {
    "moe": "the experts its router does not choose for the token (all are weighted under leaky routing)",
    "hyena_experts": "the in_proj rows, short-conv and long-filter channels of the experts its router does "
    "not weight for the token",
}


def parameters_one_token_reaches(prim: Primitive) -> int:
    """The parameter entries with a nonzero gradient of one token's output: the last position of one
    sequence of SEQ_LEN tokens (batch 1: one token's routing), in a random direction."""
    module = _perturbed(_build(prim)).double()
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(1, SEQ_LEN, prim.dim, dtype=torch.float64, generator=generator)
    _linked(module, x)
    (module(x)[0, -1] * torch.randn(prim.dim, dtype=torch.float64, generator=generator)).sum().backward()
    return sum(int((p.grad != 0).sum()) for p in module.parameters() if p.grad is not None)


def _router_rows_unseen(prim) -> int:
    """The router entries a token reads without a gradient reaching them: the rows of the experts outside
    its softmax (with one active expert, its weight is 1 whatever the logit: every row)."""
    rows = prim.experts - prim.active if prim.active > 1 else prim.experts
    return rows * (prim.dim + (1 if prim.router_bias else 0))


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_active_parameters_cover_what_a_token_reads_and_no_more_than_the_total(case):
    name, prim = case
    active, total = prim.active_params(), prim.params()
    reached = parameters_one_token_reaches(prim)
    assert reached <= active <= total, f"{name}: reached {reached:,}, active {active:,}, total {total:,}"
    if name not in ROUTED:
        assert active == total, f"{name} routes nothing, yet counts {active:,} of {total:,} parameters active"


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_a_routed_primitive_counts_exactly_the_chosen_experts(name):
    """At the stdlib defaults (no filter tap past the sequence, no activation that zeroes a gradient),
    every active parameter but the router rows outside the softmax gets one token's gradient, and fewer
    parameters are active than the layer has."""
    prim = next(p for n, p in CASES if n == name)
    assert prim.active_params() < prim.params(), f"{name}: {ROUTED[name]}, yet every parameter is active"
    assert prim.active_params() == parameters_one_token_reaches(prim) + _router_rows_unseen(prim)


def test_every_routed_primitive_is_registered():
    assert set(ROUTED) <= set(primitives())
