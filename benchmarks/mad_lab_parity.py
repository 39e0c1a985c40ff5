"""Layer parity with the MAD reference implementation (github athms/mad-lab), weights copied across.

For every layer type of specs/mad-lab/ (base.mad: H, mH, He, A, mA, Alg, mAlg, Mb, Sg, MoE) this
builds the reference's own module from a local checkout of its code, configured by its
configs/layers/*.yml with `dim` 128 and `max_length` = the sequence length (as its benchmark.py's
make_model_fn builds every layer for a task setting), builds madsl's layer for the same length
(base.mad's symbol, `filter_length: seq_len` resolved at that length), copies the reference's
weights into madsl's layer, and prints, per layer and length, both parameter counts and the
relative error (Frobenius norm of the difference over the reference's) of the output and of the
gradient with respect to the input (of the sum of the output times a fixed random tensor).

    python benchmarks/mad_lab_parity.py                               # .gpu/reference/mad-lab; L = 128, 1024
    python benchmarks/mad_lab_parity.py --mad-lab PATH --lengths 128,512 --layers H,He --dtype float64
    python benchmarks/mad_lab_parity.py --layers H,mH,He --lengths 1024 --madsl-set filter_length=128   # the old specs
    python benchmarks/mad_lab_parity.py --flash-attn-source DIR       # attention without flash-attn installed

Not a test (CI does not run it): the reference needs einops, and some of its layers more.
- The Hyena family, SwiGLU and MoE are plain torch (with einops): they run anywhere.
- Mamba: without mamba-ssm's compiled `selective_scan_cuda` the reference's module cannot call
  its scan; here it then runs the reference's own `selective_scan_ref` (the pure-torch scan of
  the same file, which mamba-ssm tests its kernel against), and without causal-conv1d its own
  nn.Conv1d path. Each row says which path ran.
- Gated linear attention: the reference's triton kernels (chunk mode) and its triton RMSNorm need
  CUDA and a triton that still has block pointers (triton 3.9 removed them, in its interpreter
  too). `--gla naive` (the default off CUDA) runs the reference's own pure-torch paths
  instead: ops/gla/naive.py's `naive_recurrent_gla` for `chunk_gla`, and ops/norm/rmsnorm.py's
  `rms_norm_ref` for its RMSNorm's forward. Each row says which path ran.
- Attention is flash-attn's `MHA`. Where flash-attn is installed it runs as configured
  (use_flash_attn: its CUDA kernels). Without it, `--flash-attn-source DIR` (a directory
  holding flash-attention's `flash_attn/` Python sources, e.g. `git archive` of a checkout)
  loads `flash_attn.modules.mha` from those sources and runs its pure-torch paths:
  `use_flash_attn: false` (MHA's `SelfAttention`) and flash_attn/layers/rotary.py's
  `apply_rotary_emb_torch` for its triton rotary kernel (the yml's `window_size: [-1, -1]`, no
  window, passed as the tuple MHA compares it with); otherwise the row says it was skipped.
- transformers is imported by the GLA module for one activation table; where it is not
  installed a stand-in holds the one entry the layer reads (swish: SiLU).

Importing the reference: its package __init__ files import every layer and PyTorch Lightning;
this script loads only the layer modules (mad, mad.model and mad.model.layers are registered as
bare packages over the checkout's directories).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.machinery
import importlib.util
import math
import os
import platform
import sys
import types
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REFERENCE = ROOT / ".gpu" / "reference" / "mad-lab"
DIM = 128
NAIVE_GLA = True  # --gla naive: the reference's pure-torch GLA and RMSNorm instead of its triton kernels
FLASH_ATTN_NOTE: str | None = None  # set where flash-attn's MHA runs from its sources' pure-torch paths
SYMBOLS = ("H", "mH", "He", "A", "mA", "Alg", "mAlg", "Mb", "Sg", "MoE")
# the reference's module and its configuration file for each layer of specs/mad-lab/base.mad
REFERENCE_LAYERS = {
    "H": ("mad.model.layers.hyena", "HyenaOperator", "hyena.yml"),
    "mH": ("mad.model.layers.hyena", "MultiHeadHyenaOperator", "mh-hyena.yml"),
    "He": ("mad.model.layers.hyena", "HyenaExpertsOperator", "hyena-experts.yml"),
    "A": ("mad.model.layers.attention", "Attention", "attention.yml"),
    "mA": ("mad.model.layers.attention", "Attention", "mh-attention.yml"),
    "Alg": ("mad.model.layers.attention_gated_linear", "GatedLinearAttention", "gated-linear-attention.yml"),
    "mAlg": ("mad.model.layers.attention_gated_linear", "GatedLinearAttention", "mh-gated-linear-attention.yml"),
    "Mb": ("mad.model.layers.mamba", "Mamba", "mamba.yml"),
    "Sg": ("mad.model.layers.mlp", "SwiGLU", "swiglu.yml"),
    "MoE": ("mad.model.layers.mlp", "MoeMlp", "moe-mlp.yml"),
}


# ---- importing the reference ---------------------------------------------------------------------


def _bare_package(name: str, directory: Path) -> None:
    module = types.ModuleType(name)
    module.__path__ = [str(directory)]
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__spec__.submodule_search_locations = module.__path__
    sys.modules[name] = module


def _stand_in(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    for key, value in attributes.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


def prepare_reference(path: Path) -> dict[str, str]:
    """Make the reference's layer modules importable from `path` without its package __init__
    files; returns what was stood in for, by library."""
    if not (path / "mad" / "model" / "layers" / "hyena.py").is_file():
        raise SystemExit(f"{path} is not a checkout of athms/mad-lab (no mad/model/layers/hyena.py)")
    if importlib.util.find_spec("einops") is None:
        raise SystemExit(
            "the reference's layers need einops: pip install einops (a benchmark dependency, not one of madsl's)"
        )
    _bare_package("mad", path / "mad")
    _bare_package("mad.model", path / "mad" / "model")
    _bare_package("mad.model.layers", path / "mad" / "model" / "layers")
    stood_in = {}
    if importlib.util.find_spec("transformers") is None:
        import torch.nn.functional as F

        _stand_in("transformers")
        _stand_in("transformers.activations", ACT2FN={"swish": F.silu})
        stood_in["transformers"] = "ACT2FN = {swish: SiLU}"
    if importlib.util.find_spec("selective_scan_cuda") is None:
        # selective_scan_interface.py imports it at the top; its selective_scan_ref needs nothing
        _stand_in("selective_scan_cuda")
        stood_in["selective_scan_cuda"] = "Mamba runs the reference's selective_scan_ref"
    return stood_in


def prepare_flash_attn(source: Path | None) -> str | None:
    """flash-attn's MHA importable: the installed package (None returned), or its sources under
    `source` with the pure-torch paths (a note for the rows); SystemExit where neither."""
    if importlib.util.find_spec("flash_attn") is not None:
        return None
    if source is None:
        return "absent"
    if not (source / "flash_attn" / "modules" / "mha.py").is_file():
        raise SystemExit(f"--flash-attn-source {source}: no flash_attn/modules/mha.py there")
    _bare_package("flash_attn", source / "flash_attn")  # its __init__ imports the CUDA extension
    rotary = importlib.import_module("flash_attn.layers.rotary")
    torch_rotary = rotary.apply_rotary_emb_torch

    def apply_rotary_emb_qkv(
        qkv, cos, sin, cos_k=None, sin_k=None, interleaved=False, seqlen_offsets=0, num_heads_q=None
    ):
        """apply_rotary_emb_qkv_ (a triton kernel, in place) for qkv (batch, seqlen, 3, heads, headdim)
        at offset 0, with the module's own apply_rotary_emb_torch."""
        import torch

        if qkv.dim() != 5 or not isinstance(seqlen_offsets, int) or seqlen_offsets != 0:
            raise NotImplementedError("the stand-in rotary covers packed qkv at offset 0 only")
        length = qkv.shape[1]
        cos_k = cos if cos_k is None else cos_k
        sin_k = sin if sin_k is None else sin_k
        q = torch_rotary(qkv[:, :, 0], cos[:length], sin[:length], interleaved)
        k = torch_rotary(qkv[:, :, 1], cos_k[:length], sin_k[:length], interleaved)
        return torch.stack([q, k, qkv[:, :, 2]], dim=2)

    rotary.apply_rotary_emb_qkv_ = apply_rotary_emb_qkv
    return "SelfAttention (use_flash_attn false), apply_rotary_emb_torch"


def load_yml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text())


def reference_layer(path: Path, symbol: str, length: int):
    """The reference's module of `symbol` as benchmark.py's make_model_fn builds it for a task
    setting of sequence length `length`: its yml, with dim and max_length set."""
    module_name, class_name, yml = REFERENCE_LAYERS[symbol]
    module = importlib.import_module(module_name)
    config = load_yml(path / "configs" / "layers" / yml)
    config.update(dim=DIM, max_length=length)
    note = ""
    if symbol in ("A", "mA") and FLASH_ATTN_NOTE is not None:
        config["use_flash_attn"] = False
        # the yml's [-1, -1] (no window) as the tuple MHA compares it with: a list reads as a window
        config["window_size"] = tuple(config.get("window_size", (-1, -1)))
        note = FLASH_ATTN_NOTE
    if symbol in ("Alg", "mAlg") and NAIVE_GLA:
        naive = importlib.import_module("mad.model.layers.ops.gla.naive")
        norm = importlib.import_module("mad.model.layers.ops.norm.rmsnorm")
        module.chunk_gla = naive.naive_recurrent_gla

        def reference_rms_norm(self, x, residual=None, prenorm=False, residual_in_fp32=False):
            return norm.rms_norm_ref(x, self.weight, self.bias, residual=residual, eps=self.eps, prenorm=prenorm)

        module.RMSNorm.forward = reference_rms_norm
        note = "naive_recurrent_gla, rms_norm_ref"
    if symbol == "Mb":
        if not hasattr(sys.modules.get("selective_scan_cuda"), "fwd"):  # stood in for: no compiled scan
            interface = importlib.import_module("mad.model.layers.ops.mamba_ssm.selective_scan_interface")
            module.selective_scan_fn = interface.selective_scan_ref
            note = "selective_scan_ref"
        config["use_fast_path"] = False  # mamba_inner_fn needs the CUDA kernels
        if module.causal_conv1d_fn is None:
            note += (", " if note else "") + "nn.Conv1d"
    return getattr(module, class_name)(**config), note


# ---- copying the reference's weights into madsl's layer ----------------------------------------


def _filter_weights(prefix: str, ref) -> dict:
    """The implicit filter (featurization/hyena_filter.py HyenaFilter, nested: false) -> madsl's
    HyenaFilter: the positional features z, the MLP (one Sin shared by its activations) and the
    long conv's bias (madsl's skip)."""
    mlp = ref.filter.implicit_filter
    return {
        f"{prefix}skip": ref.bias,
        f"{prefix}features_table": ref.filter.pos_emb.z[0],
        f"{prefix}sin.freq": mlp[1].freq.reshape(-1),
        f"{prefix}mlp_in.weight": mlp[0].weight,
        f"{prefix}mlp_in.bias": mlp[0].bias,
        f"{prefix}mlp_hidden.0.weight": mlp[2].weight,
        f"{prefix}mlp_hidden.0.bias": mlp[2].bias,
        f"{prefix}mlp_hidden.1.weight": mlp[4].weight,
        f"{prefix}mlp_hidden.1.bias": mlp[4].bias,
        f"{prefix}mlp_out.weight": mlp[6].weight,
    }


def mapped_weights(symbol: str, ref) -> dict:
    """madsl's parameter name -> the reference's tensor holding it."""
    if symbol in ("H", "mH", "He"):
        out = {
            "in_proj.weight": ref.in_proj.weight,
            "in_proj.bias": ref.in_proj.bias,
            "short_conv.weight": ref.short_filter.weight,
            "short_conv.bias": ref.short_filter.bias,
            "out_proj.weight": ref.out_proj.weight,
            "out_proj.bias": ref.out_proj.bias,
            **_filter_weights("long_filter.", ref.long_conv),
        }
        if symbol == "He":
            out.update({"router.weight": ref.router.weight, "router.bias": ref.router.bias})
        return out
    if symbol in ("A", "mA"):
        return {
            "qkv.weight": ref.Wqkv.weight,
            "qkv.bias": ref.Wqkv.bias,
            "out.weight": ref.out_proj.weight,
            "out.bias": ref.out_proj.bias,
        }
    if symbol == "Sg":  # GLU: w3(act(w1 x) * w2 x); madsl's SwiGLU: w2(silu(w1 x) * w3 x)
        return {"w1.weight": ref.w1.weight, "w3.weight": ref.w2.weight, "w2.weight": ref.w3.weight}
    if symbol == "MoE":  # up1, up2: unit e*W + j of expert e; down1: output d*E + e from all E*W units
        experts, width = ref.num_experts, ref.dim_inner

        def up(w):
            return w.t().reshape(DIM, experts, width).permute(1, 0, 2)

        return {
            "w_up": up(ref.up1.weight),
            "w_gate": up(ref.up2.weight),
            "w_down": ref.down1.weight.t().reshape(experts * width, DIM, experts).permute(2, 0, 1),
            "router.weight": ref.router.weight,
            "router.bias": ref.router.bias,
        }
    # GLA and Mamba: madsl's names are the reference's
    return dict(ref.named_parameters())


def copy_weights(symbol: str, ref, ours) -> None:
    import torch

    mapped = mapped_weights(symbol, ref)
    own = dict(ours.named_parameters())
    missing, extra = set(own) - set(mapped), set(mapped) - set(own)
    if missing or extra:
        raise RuntimeError(
            f"{symbol}: weight mapping does not cover madsl's parameters: missing {sorted(missing)}, "
            f"unknown {sorted(extra)}"
        )
    with torch.no_grad():
        for name, tensor in mapped.items():
            if name.endswith("features_table") and own[name].shape[0] < tensor.shape[0]:
                tensor = tensor[: own[name].shape[0]]  # --madsl-set filter_length=M < L: the first M positions
            if own[name].shape != tensor.shape:
                raise RuntimeError(
                    f"{symbol}: {name} is {tuple(own[name].shape)} in madsl, {tuple(tensor.shape)} in the reference"
                )
            own[name].copy_(tensor)
    if symbol in ("H", "mH", "He"):  # the decay window: a buffer each computes alike
        deltas = ref.long_conv.filter.modulation.deltas.reshape(-1).abs()
        if not torch.equal(deltas.to(ours.long_filter.decay), ours.long_filter.decay):
            raise RuntimeError(f"{symbol}: the decay windows differ")


# ---- comparing --------------------------------------------------------------------------------


def relative_error(ours, theirs) -> float:
    ours, theirs = ours.double(), theirs.double()
    return float((ours - theirs).norm() / theirs.norm().clamp_min(1e-300))


def compare(path: Path, symbol: str, length: int, batch: int, dtype, device, seed: int, overrides: tuple = ()) -> dict:
    import torch

    import madsl
    from madsl.topology import Layer

    torch.manual_seed(seed)
    ref, note = reference_layer(path, symbol, length)
    ref = ref.to(device=device, dtype=dtype)
    spec = madsl.load_spec(ROOT / "specs" / "mad-lab" / "base.mad")
    fields = spec.symbols[symbol].params
    layer = Layer(symbol, tuple((key, value) for key, value in overrides if key in fields))
    prim = spec.primitive_for(layer).at_length(length)
    ours = prim.build().to(device=device, dtype=dtype)
    # move the weights off their structured init (zero biases, ones), then copy them across
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_((0.02 * torch.randn(p.shape, generator=generator)).to(p))
    copy_weights(symbol, ref, ours)
    u = torch.randn(batch, length, DIM, generator=generator).to(device=device, dtype=dtype)
    weights = torch.randn(batch, length, DIM, generator=generator).to(device=device, dtype=dtype)
    outputs, grads = [], []
    for module in (ref, ours):
        x = u.clone().requires_grad_(True)
        y = module(x)
        (y * weights).sum().backward()
        outputs.append(y.detach())
        grads.append(x.grad.detach())
    return {
        "symbol": symbol,
        "L": length,
        "reference_params": sum(p.numel() for p in ref.parameters()),
        "madsl_params": prim.params(),
        "built_params": sum(p.numel() for p in ours.parameters()),
        "out": relative_error(outputs[1], outputs[0]),
        "grad": relative_error(grads[1], grads[0]),
        "note": note,
    }


def unavailable(symbol: str) -> str | None:
    """Why the reference's `symbol` cannot run here, or None."""
    if symbol in ("A", "mA") and FLASH_ATTN_NOTE == "absent":
        return (
            "skipped: the reference's attention is flash-attn's MHA; flash-attn is not installed "
            "(--flash-attn-source DIR runs its sources' pure-torch paths)"
        )
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mad-lab", type=Path, default=DEFAULT_REFERENCE, help="a checkout of athms/mad-lab")
    parser.add_argument("--lengths", default="128,1024", help="sequence lengths (max_length), comma-separated")
    parser.add_argument("--layers", default=",".join(SYMBOLS), help="base.mad symbols, comma-separated")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--madsl-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="build madsl's layers with this parameter changed, where they have it (e.g. "
        "filter_length=128, expert_layout=blocked: what differs then); repeatable",
    )
    parser.add_argument(
        "--flash-attn-source",
        type=Path,
        default=None,
        help="a directory holding flash-attention's flash_attn/ sources, for attention where "
        "flash-attn is not installed",
    )
    parser.add_argument(
        "--gla",
        choices=("kernels", "naive"),
        default=None,
        help="the reference's GLA through its triton kernels, or its pure-torch naive_recurrent_gla "
        "and rms_norm_ref (default: kernels on CUDA, naive elsewhere)",
    )
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    overrides = []
    for text in args.madsl_set:
        key, sep, value = text.partition("=")
        if not sep:
            parser.error(f"--madsl-set {text!r}: expected KEY=VALUE")
        overrides.append((key.strip(), int(value) if value.strip().isdigit() else value.strip()))
    symbols = [s.strip() for s in args.layers.split(",") if s.strip()]
    unknown = [s for s in symbols if s not in SYMBOLS]
    if unknown:
        parser.error(f"unknown layers {unknown}; base.mad's: {', '.join(SYMBOLS)}")

    global NAIVE_GLA, FLASH_ATTN_NOTE
    NAIVE_GLA = (args.gla or ("kernels" if args.device.startswith("cuda") else "naive")) == "naive"
    import torch

    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore", category=FutureWarning)  # the reference's torch.cuda.amp decorators
    stood_in = prepare_reference(args.mad_lab.resolve())
    if any(s in ("A", "mA") for s in symbols):
        FLASH_ATTN_NOTE = prepare_flash_attn(args.flash_attn_source.resolve() if args.flash_attn_source else None)
        if FLASH_ATTN_NOTE not in (None, "absent"):
            stood_in["flash_attn"] = f"its Python sources from {args.flash_attn_source}"
    dtype = getattr(torch, args.dtype)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    now = datetime.datetime.now().isoformat(timespec="seconds")
    print(f"# madsl vs the MAD reference's modules, weights copied; {now}")
    print(
        f"# reference: {args.mad_lab}; torch {torch.__version__}; {args.dtype}; device {args.device}; "
        f"{platform.machine()} {platform.processor() or ''}".rstrip()
    )
    for library, what in stood_in.items():
        print(f"# stood in for {library}: {what}")
    if overrides:
        print("# madsl's layers changed from base.mad: " + ", ".join(f"{k}={v}" for k, v in overrides))
    print(
        f"{'layer':<5} {'L':>5} {'reference params':>16} {'madsl params':>12} {'out rel err':>12} "
        f"{'grad rel err':>12}  note"
    )
    worst = 0.0
    for symbol in symbols:
        reason = unavailable(symbol)
        for length in lengths:
            if reason is not None:
                print(f"{symbol:<5} {length:>5} {'':>16} {'':>12} {'':>12} {'':>12}  {reason}")
                continue
            try:
                row = compare(
                    args.mad_lab.resolve(), symbol, length, args.batch, dtype, args.device, args.seed, tuple(overrides)
                )
            except Exception as err:  # a layer that cannot run here: say why, go on with the others
                first = (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
                print(
                    f"{symbol:<5} {length:>5} {'':>16} {'':>12} {'':>12} {'':>12}  failed: "
                    f"{type(err).__name__}: {first}"
                )
                continue
            worst = max(worst, row["out"], row["grad"])
            note = row["note"]
            if row["reference_params"] != row["madsl_params"]:
                note = (note + "; " if note else "") + (
                    f"reference holds {row['reference_params'] - row['madsl_params']} unused parameters"
                    if symbol == "MoE"
                    else "parameter counts differ"
                )
            assert row["built_params"] == row["madsl_params"], f"{symbol}: madsl's module and accounting differ"
            print(
                f"{symbol:<5} {length:>5} {row['reference_params']:>16,} {row['madsl_params']:>12,} "
                f"{row['out']:>12.2e} {row['grad']:>12.2e}  {note}"
            )
    print(f"# largest relative error: {worst:.2e}" + ("" if math.isfinite(worst) else " (not finite)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
