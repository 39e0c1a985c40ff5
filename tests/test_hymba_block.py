"""Hymba's hybrid-head mixer as a madsl primitive (`Hb`, madsl/primitives/hymba.py, madsl/layers/hymba.py).

- Hymba-1.5B's mixer: parameters of a producer and of a KV consumer equal the report's per-tensor table
  (/work/notes/hymba/REPORT.md §3: a layer 46,700,932 / 45,164,932 less its two layer norms and its MLP), tensor
  by tensor, and the layers add up to the model's 1,522,797,824.
- The module equals a float64 reference written here from the report's formulas (plain torch: its own rotary,
  RMSNorm and conv, naive O(T^2) attention with the mask written out, a Python-loop scan), for a producer and
  a consumer linked to it, with grouped keys, a window and sinks: TOLERANCE 1e-12 (float64; measured ~1e-15).
- prefill + step equals forward (producer and consumer linked, window + sinks, past the window).
- The mask matters: without sinks, or without the window, the output moves by far more than the tolerance.
- A consumer without a link, or linked to a producer of other widths, is a clear RuntimeError; the settings a
  primitive refuses are ConfigErrors by key.
- GQA + window + sinks settings, which tests/test_contract.py's generated settings do not reach, pass its
  parameter, state, step, backward, FLOP and active-parameter checks (a consumer with its producer beside it).
- The rate measurement times a consumer alone, with random keys and values of its producer's shapes.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import test_contract as contract
import torch
import torch.nn.functional as F

from madsl.lang.stdlib import primitive
from madsl.layers.hymba import KVLink
from madsl.primitives.base import ConfigError

torch.set_num_threads(1)
f64 = torch.float64
TOLERANCE = 1e-12
SMALL = {"heads": 4, "kv_heads": 2, "d_state": 4, "window": 5, "sinks": 2, "rope_theta": 300.0}
DIM, LENGTH, BATCH = 32, 13, 2


def hymba(dim: int = DIM, **overrides):
    return primitive("hymba", dim, **{**SMALL, **overrides})


def built(prim, seed: int = 0) -> torch.nn.Module:
    """The module in float64 with every weight moved off its initialisation (norm weights off one)."""
    torch.manual_seed(seed)
    module = prim.build().double()
    generator = torch.Generator().manual_seed(seed + 10)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=generator, dtype=f64))
    return module


def pair(**overrides) -> tuple[torch.nn.Module, torch.nn.Module]:
    """A producer and a consumer of the same settings, linked."""
    producer = built(hymba(**overrides), seed=0)
    consumer = built(hymba(**overrides, kv_reuse=True), seed=1)
    producer.kv_source = consumer.kv_from = KVLink()
    return producer, consumer


def inputs(seed: int) -> torch.Tensor:
    return torch.randn(BATCH, LENGTH, DIM, dtype=f64, generator=torch.Generator().manual_seed(seed))


# ---- Hymba-1.5B's parameter count (REPORT.md §3) ----------------------------------------------------

H, DI, NH, NKV, DQ, DV, R, N, K = 1600, 3200, 25, 5, 64, 128, 100, 16, 4
HYMBA_15B = {"heads": NH, "kv_heads": NKV, "expand": 2, "d_state": N, "d_conv": K, "dt_rank": R}
# the report's table, by tensor ([out, in] shapes; madsl's names): the producer's in_proj [q|k|v|x|z]
TABLE = {
    "in_proj.weight": (DI + H + NKV * DQ + NKV * DV + DI, H),
    "out_proj.weight": (H, DI),
    "conv1d.weight": (DI, 1, K),
    "conv1d.bias": (DI,),
    "x_proj.weight": (R + 2 * N, DI),
    "dt_proj.weight": (DI, R),
    "dt_proj.bias": (DI,),
    "A_log": (DI, N),
    "D": (DI,),
    "dt_layernorm.weight": (R,),
    "B_layernorm.weight": (N,),
    "C_layernorm.weight": (N,),
    "pre_avg_layernorm1.weight": (DI,),
    "pre_avg_layernorm2.weight": (DI,),
}
LAYER_NORMS, MLP = 2 * 1600, 3 * 1600 * 5504  # input_layernorm + pre_moe_layernorm; gate, up, down


def test_hymba_15b_mixer_parameters_equal_the_report():
    assert MLP == 26_419_200
    producer_mixer = 46_700_932 - LAYER_NORMS - MLP
    consumer_mixer = 45_164_932 - LAYER_NORMS - MLP
    assert sum(math.prod(shape) for shape in TABLE.values()) == producer_mixer == 20_278_532
    assert producer_mixer - consumer_mixer == (NKV * DQ + NKV * DV) * H == 1_536_000  # the k, v rows
    producer, consumer = (primitive("hymba", H, **HYMBA_15B, kv_reuse=reuse) for reuse in (False, True))
    assert (producer.qk_head_dim, producer.v_head_dim, producer.d_inner) == (DQ, DV, DI)
    assert (producer.params(), consumer.params()) == (producer_mixer, consumer_mixer)
    # the module holds exactly the report's tensors
    shapes = {name: tuple(p.shape) for name, p in producer.build().named_parameters()}
    assert shapes == TABLE
    consumer_shapes = {name: tuple(p.shape) for name, p in consumer.build().named_parameters()}
    assert consumer_shapes == {**TABLE, "in_proj.weight": (DI + H + DI, H)}
    # 17 layers compute their keys and values, 15 reuse them; embeddings + meta tokens + final norm
    total = 17 * (producer.params() + LAYER_NORMS + MLP) + 15 * (consumer.params() + LAYER_NORMS + MLP)
    assert total + 51_201_600 + 204_800 + 1_600 == 1_522_797_824
    # Hymba's caches (§4): conv 3200 x 4 held by Hymba, of which madsl keeps the d_conv - 1 it reads
    assert (producer.fixed_state(), producer.conv_state()) == (DI * N, DI * (K - 1))
    assert (producer.kv_cache(10), consumer.kv_cache(10)) == (10 * 960, 0)


# ---- a float64 reference from the report's formulas --------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x (B, T, heads, d) at positions 0..T-1, rotate-half: channel i pairs with i + d/2."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=f64) / d)
    angle = torch.arange(x.shape[1], dtype=f64)[:, None] * inv_freq  # (T, d/2)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    a, b = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def _allowed(q: int, k: int, window: int | None, sinks: int) -> bool:
    return k <= q and (window is None or q - k < window or k < sinks)


def _ssm(w: dict, x: torch.Tensor, z: torch.Tensor, p) -> torch.Tensor:
    """Conv + SiLU, the dt/B/C norms and the Mamba-1 scan, token by token: S (B, T, E)."""
    B_, T, E = x.shape
    taps = w["conv1d.weight"][:, 0, :]  # (E, d_conv): tap j reads x[t - (d_conv - 1) + j]
    x_c = torch.stack(
        [
            F.silu(
                w["conv1d.bias"]
                + sum(taps[:, j] * x[:, t - p.d_conv + 1 + j] for j in range(p.d_conv) if t - p.d_conv + 1 + j >= 0)
            )
            for t in range(T)
        ],
        dim=1,
    )
    dt, Bm, Cm = (x_c @ w["x_proj.weight"].T).split([p.rank, p.d_state, p.d_state], dim=-1)
    dt, Bm, Cm = (_rms(t, w[f"{n}_layernorm.weight"], p.norm_eps) for t, n in ((dt, "dt"), (Bm, "B"), (Cm, "C")))
    delta = F.softplus(dt @ w["dt_proj.weight"].T + w["dt_proj.bias"])  # (B, T, E)
    A = -torch.exp(w["A_log"])  # (E, N)
    h = torch.zeros(B_, E, p.d_state, dtype=f64)
    out = []
    for t in range(T):
        h = torch.exp(delta[:, t, :, None] * A) * h + (delta[:, t] * x_c[:, t])[..., None] * Bm[:, t, None, :]
        y = (h * Cm[:, t, None, :]).sum(-1) + w["D"] * x_c[:, t]
        out.append(y * F.silu(z[:, t]))
    return torch.stack(out, dim=1)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p) -> torch.Tensor:
    """q (B, T, H, dq), k (B, T, KV, dq), v (B, T, KV, dv), post-rotary -> (B, T, H dv), the mask written out."""
    T = q.shape[1]
    mask = torch.tensor([[_allowed(i, j, p.window, p.sinks) for j in range(T)] for i in range(T)])
    heads = []
    for head in range(p.heads):
        kv = head // (p.heads // p.key_value_heads)
        scores = torch.einsum("bqd,bkd->bqk", q[:, :, head], k[:, :, kv]) / math.sqrt(p.qk_head_dim)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        heads.append(weights @ v[:, :, kv])
    return torch.cat(heads, dim=-1)


def reference(module: torch.nn.Module, u: torch.Tensor, shared: tuple | None = None) -> tuple:
    """(out, (K, V)) of one mixer from its weights (`shared`: a consumer's producer's K, V)."""
    p, w = module.primitive, {n: t.detach() for n, t in module.named_parameters()}
    B_, T, _ = u.shape
    E, H_, KV = p.d_inner, p.heads, p.key_value_heads
    P = u @ w["in_proj.weight"].T
    widths = [H_ * p.qk_head_dim] + ([] if p.kv_reuse else [KV * p.qk_head_dim, KV * p.v_head_dim]) + [E, E]
    parts = P.split(widths, dim=-1)
    q, x, z = parts[0], parts[-2], parts[-1]
    q = _rope(q.reshape(B_, T, H_, p.qk_head_dim), p.rope_theta)
    if shared is None:
        k = _rope(parts[1].reshape(B_, T, KV, p.qk_head_dim), p.rope_theta)
        shared = (k, parts[2].reshape(B_, T, KV, p.v_head_dim))
    a = _attention(q, *shared, p)
    s = _ssm(w, x, z, p)
    fused = _rms(a, w["pre_avg_layernorm1.weight"], p.norm_eps) + _rms(s, w["pre_avg_layernorm2.weight"], p.norm_eps)
    return (fused / 2) @ w["out_proj.weight"].T, shared


@pytest.mark.parametrize("settings", [{}, {"window": None, "sinks": 0}, {"kv_heads": None, "expand": 1}])
def test_the_module_equals_the_reference_producer_and_consumer(settings):
    producer, consumer = pair(**settings)
    u_producer, u_consumer = inputs(1), inputs(2)
    with torch.no_grad():
        got_producer = producer(u_producer)
        got_consumer = consumer(u_consumer)
    want_producer, kv = reference(producer, u_producer)
    want_consumer, _ = reference(consumer, u_consumer, shared=kv)
    torch.testing.assert_close(got_producer, want_producer, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(got_consumer, want_consumer, rtol=0, atol=TOLERANCE)
    # the consumer reads its producer's keys: with another producer's it computes something else
    other, _ = reference(consumer, u_consumer, shared=reference(producer, inputs(3))[1])
    assert (other - want_consumer).abs().max() > 1e-3


def test_the_window_and_the_sinks_matter():
    """The same weights under another mask move the output by far more than the tolerance, and each mask's
    output is the reference's under that mask."""
    u = inputs(4)
    outputs = {}
    for name, settings in {"window+sinks": {}, "window": {"sinks": 0}, "causal": {"window": None, "sinks": 0}}.items():
        module = built(hymba(**settings))
        with torch.no_grad():
            outputs[name] = module(u)
        torch.testing.assert_close(outputs[name], reference(module, u)[0], rtol=0, atol=TOLERANCE)
    assert (outputs["window+sinks"] - outputs["window"]).abs().max() > 1e-3
    assert (outputs["window"] - outputs["causal"]).abs().max() > 1e-3
    # only the positions past window + sinks see a different set of keys
    early = SMALL["window"] + SMALL["sinks"]
    torch.testing.assert_close(outputs["window+sinks"][:, :early], outputs["causal"][:, :early], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("prompt", [1, 4, 9])
def test_prefill_and_step_equal_forward(prompt):
    producer, consumer = pair()
    u_producer, u_consumer = inputs(5), inputs(6)
    with torch.no_grad():
        want = producer(u_producer), consumer(u_consumer)
        first_producer, producer_state = producer.prefill(u_producer[:, :prompt])
        first_consumer, consumer_state = consumer.prefill(u_consumer[:, :prompt])
        got_producer, got_consumer = [first_producer], [first_consumer]
        for t in range(prompt, LENGTH):
            y, producer_state = producer.step(u_producer[:, t], producer_state)
            got_producer.append(y[:, None])
            y, consumer_state = consumer.step(u_consumer[:, t], consumer_state)
            got_consumer.append(y[:, None])
    torch.testing.assert_close(torch.cat(got_producer, 1), want[0], rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(torch.cat(got_consumer, 1), want[1], rtol=0, atol=TOLERANCE)
    # the producer's cache holds every past token; the consumer holds none
    assert producer_state["k"].shape == (BATCH, 2, LENGTH, 8) and producer_state["v"].shape == (BATCH, 2, LENGTH, 16)
    assert set(consumer_state) == {"fixed", "conv", "pos"}


# ---- errors -------------------------------------------------------------------------------------------


def test_a_consumer_without_its_producer_is_a_clear_error():
    _, consumer = pair()
    consumer.kv_from = None
    with pytest.raises(RuntimeError, match="kv_reuse reads the keys and values of an earlier Hb"):
        consumer(inputs(1))
    consumer.kv_from = KVLink()
    with pytest.raises(RuntimeError, match="kv_reuse reads the keys and values of an earlier Hb"):
        consumer.step(inputs(1)[:, 0], consumer.init_state(BATCH))
    other = built(hymba(kv_heads=None))  # 4 key/value heads where the consumer reads 2
    other.kv_source = consumer.kv_from
    other(inputs(1))
    with pytest.raises(RuntimeError, match="a producer of other heads or widths"):
        consumer(inputs(1))


@pytest.mark.parametrize(
    "settings, key",
    [
        ({"window": None, "sinks": 2}, "sinks"),
        ({"sinks": -1}, "sinks"),
        ({"heads": 3, "head_dim": 8}, "heads"),  # d_inner 64 is no multiple of 3 value heads
        ({"kv_heads": 3}, "kv_heads"),
        ({"head_dim": 7}, "head_dim"),  # rotary needs an even head
        ({"heads": 5}, "heads"),  # 32 / 5
        ({"rope_theta": 0.0}, "rope_theta"),
        ({"norm_eps": 0.0}, "norm_eps"),
        ({"window": 0}, "window"),
    ],
)
def test_refused_settings_name_their_key(settings, key):
    with pytest.raises(ConfigError) as error:
        hymba(**settings)
    assert error.value.key == key


# ---- the contract at settings its generated ones do not reach ---------------------------------------------

CONTRACT_SETTINGS = [
    {},  # GQA (4 heads reading 2), window 5 + 2 sinks
    {"kv_reuse": True},
    {"kv_reuse": True, "kv_heads": 1, "window": 3, "sinks": 4, "rotary": False},
    {"heads": 2, "kv_heads": 1, "head_dim": 20, "window": 20},  # dq 20, dv 40; a window longer than L
]


@pytest.mark.parametrize("settings", CONTRACT_SETTINGS)
def test_the_contract_holds_with_grouped_keys_windows_and_sinks(settings):
    prim = hymba(40, **settings)
    case = ("hymba", prim)
    contract.test_parameters_equal_the_accounting(case)
    contract.test_forward_step_state_and_backward(case)
    contract.test_active_parameters_cover_what_a_token_reads_and_no_more_than_the_total(case)
    assert contract.flop_contract_error(prim) is None


def test_a_wrong_attention_count_fails_the_flop_contract(monkeypatch):
    """The FLOP check sees a consumer counting its producer's key/value projections, and a windowed layer
    counting every pair."""
    consumer, windowed = hymba(40, kv_reuse=True), hymba(40)
    right = type(consumer).flops
    monkeypatch.setattr(
        type(consumer),
        "flops",
        lambda self, L: right(self, L) + (2 * L * self.dim * self.kv_width if self.kv_reuse else 0),
    )
    assert contract.flop_contract_error(consumer) is not None
    monkeypatch.setattr(type(consumer), "flops", right)
    assert contract.flop_contract_error(windowed) is None
    every_pair = 2 * windowed.heads * (windowed.qk_head_dim + windowed.v_head_dim)
    monkeypatch.setattr(
        type(windowed), "flops", lambda self, L: right(self, L) + every_pair * L * (L - self.attended(L))
    )
    assert contract.flop_contract_error(windowed) is not None


def test_the_rate_measurement_times_a_consumer_alone(monkeypatch):
    from madsl.runner.plan import rate_measure

    monkeypatch.setattr(rate_measure, "TIMED_STEPS", 1)
    monkeypatch.setattr(
        rate_measure, "family_primitive", lambda family, width: primitive("hymba", width, kv_heads=2, kv_reuse=True)
    )
    overhead, rate = rate_measure._family_line("hymba", torch.device("cpu"), 32)
    assert overhead >= 0 and rate > 0


def test_the_producer_writes_its_link_in_forward_prefill_and_step():
    producer = built(hymba())
    producer.kv_source = KVLink()
    u = inputs(7)
    with torch.no_grad():
        producer(u)
        k, v = producer.kv_source.value
        assert k.shape == (BATCH, 2, LENGTH, 8) and v.shape == (BATCH, 2, LENGTH, 16)
        _, state = producer.prefill(u[:, :3])
        assert producer.kv_source.value[0].shape[2] == 3
        _, state = producer.step(u[:, 3], state)
        assert producer.kv_source.value[0] is state["k"] and state["k"].shape[2] == 4
    assert dataclasses.replace(producer.primitive, kv_reuse=True).kv_cache(LENGTH) == 0
