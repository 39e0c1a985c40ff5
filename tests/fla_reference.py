"""flash-linear-attention's RWKV-7 (RWKV7ForCausalLM, which transformers does not have), run in a process
of its own: importing fla registers its models with transformers' Auto classes, its own `mamba` over
transformers' (the Mamba tests would then load fla's Triton kernels), and its layers call torch.compile.
So the tests never import it: `run(command, ...)` runs this file as a script, with torch.compile off
(TORCHDYNAMO_DISABLE) and one thread, and reads what it writes.

    python tests/fla_reference.py make FOLDER '{"layers": 3, "key_scale": 1.0, ...config keys}' [IDS.json OUT.npy]
    python tests/fla_reference.py logits FOLDER IDS.json OUT.npy [interpret]   fla's forward, PyTorch paths
    python tests/fla_reference.py reload FOLDER IDS.json OUT.npy               AutoModelForCausalLM + loading info
    python tests/fla_reference.py count CONFIGS.json                           parameters, built on the meta device

fla's Triton kernels need a GPU: its recurrences, token shift and gates run their PyTorch references
(`torch_paths`); its fused norms (fuse_norm true) run in Triton's CPU interpreter with `interpret`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(command: str, *args: str, interpret: bool = False) -> str:
    """This file's `command` in a fresh interpreter; its standard output (a failure raises with its stderr)."""
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), command, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fla_reference.py {command} failed:\n{proc.stderr[-4000:]}")
    return proc.stdout


def available() -> bool:
    """Whether flash-linear-attention's models are installed (the dev extra), without importing them (a
    find_spec of fla.models would import fla, and with it every registration)."""
    from importlib import metadata

    try:
        metadata.version("flash-linear-attention")
    except metadata.PackageNotFoundError:
        return False
    return True


# ---- what the subprocess does ------------------------------------------------------------------------


def make(folder: Path, layers: int = 3, key_scale: float = 1.0, **extra: Any) -> None:
    """A tiny RWKV-7 (`layers` blocks of 4 heads of 16, LoRA ranks 8 / 8 / 16 and the value residual's 8, a
    channel mixer 224 wide, layer 0's pre_norm on the embeddings) with every weight random, norms included,
    k_k times `key_scale` (small: the keys kk normalises as small as the l2 norm's eps), saved into
    `folder`; fuse_norm false (torch's LayerNorm, GroupNorm and F.normalize) unless `extra` says otherwise."""
    import warnings

    import torch
    from fla.models import RWKV7Config, RWKV7ForCausalLM
    from hf_checkpoints import VOCAB, randomized

    args = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": layers,
        "head_dim": 16,
        "decay_low_rank_dim": 8,
        "a_low_rank_dim": 8,
        "gate_low_rank_dim": 16,
        "v_low_rank_dim": 8,
        "hidden_ratio": 3.5,
        "fuse_norm": False,
        **extra,
    }
    with warnings.catch_warnings():  # fla warns on every RWKV7Attention it builds
        warnings.simplefilter("ignore")
        model = RWKV7ForCausalLM(RWKV7Config(**args))
    randomized(model, folder)
    if key_scale != 1.0:
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if name.endswith("attn.k_k"):
                    parameter.mul_(key_scale)
        model.save_pretrained(folder)


def torch_paths() -> None:
    """flash-linear-attention's RWKV-7 with PyTorch in place of its Triton kernels: its naive recurrence
    (fla.ops.generalized_delta_rule.dplr.naive, which scales the queries by key_dim^-0.5: undone here,
    RWKV-7's scale is 1) for the chunked and the recurrent kernel, and the token shift, mixes, key update
    and output gate by their torch references (fla's own *_ref functions where it has them)."""
    import torch
    import torch.nn.functional as F
    from fla.layers import rwkv7 as layer
    from fla.models.rwkv7 import modeling_rwkv7 as modeling
    from fla.ops.generalized_delta_rule.dplr.naive import dplr_recurrence
    from fla.ops.rwkv7.fused_addcmul import torch_addcmul_rwkv7
    from fla.ops.rwkv7.fused_k_update import k_update_ref
    from fla.ops.rwkv7.gate_output_correction import gate_output_correction_ref

    def recurrence(r, w, k, v, a, b, scale=1.0, initial_state=None, output_final_state=False, **_):
        q = r * (scale * r.shape[-1] ** 0.5)
        heads_first = [t.transpose(1, 2) for t in (q, k, v, a, b, w)]
        o, state = dplr_recurrence(*heads_first, initial_state=initial_state, output_final_state=output_final_state)
        return o.transpose(1, 2), state

    def recurrent(r, w, k, v, kk, a, scale=1.0, initial_state=None, output_final_state=False, **_):
        return recurrence(r, w, k, v, -kk, kk * a, scale, initial_state, output_final_state)

    def token_shift(x, cu_seqlens=None, cache=None, output_cache=False, chunk_indices=None):
        previous = F.pad(x, (0, 0, 1, -1))
        if cache is not None:
            previous = torch.cat([cache.reshape(x.shape[0], 1, -1).to(x.dtype), previous[:, 1:]], dim=1)
        delta = previous - x
        return (delta, x[:, -1]) if output_cache else delta

    layer.chunk_rwkv7, layer.fused_mul_recurrent_rwkv7 = recurrence, recurrent
    layer.fused_addcmul_rwkv7, layer.fused_k_rwkv7 = torch_addcmul_rwkv7, k_update_ref
    layer.gate_output_correction = gate_output_correction_ref
    layer.token_shift = modeling.token_shift = token_shift


def logits(folder: Path, ids: list, out: Path, interpret: bool = False) -> None:
    import numpy as np
    import torch
    from fla.models import RWKV7ForCausalLM

    torch_paths()
    if interpret:  # fla's fused norms in Triton's CPU interpreter (tests/triton_interpreter.py)
        import pytest
        import triton_interpreter

        patch = pytest.MonkeyPatch()
        triton_interpreter.bridge(patch)
    model = RWKV7ForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        np.save(out, model(torch.tensor(ids)).logits.numpy())


def reload(folder: Path, ids: list, out: Path) -> None:
    """The folder as transformers' AutoModelForCausalLM loads it (fla registers rwkv7 on import): its
    logits, and the loading info (missing, unexpected, mismatched keys) on standard output."""
    import fla  # noqa: F401 - registers RWKV7ForCausalLM with the Auto classes
    import numpy as np
    import torch
    import transformers

    torch_paths()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    with torch.no_grad():
        np.save(out, model.eval()(torch.tensor(ids)).logits.numpy())
    print(json.dumps({key: sorted(map(str, value)) for key, value in info.items()}))


def count(configs: list[dict]) -> None:
    import warnings

    import torch
    from fla.models import RWKV7Config, RWKV7ForCausalLM

    counts = []
    for config in configs:
        with warnings.catch_warnings(), torch.device("meta"):
            warnings.simplefilter("ignore")
            model = RWKV7ForCausalLM(RWKV7Config(**{k: v for k, v in config.items() if k != "model_type"}))
        counts.append(sum(p.numel() for p in model.parameters()))
    print(json.dumps(counts))


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "make":  # and its logits, where ids are given: one process (a start costs seconds)
        make(Path(rest[0]), **json.loads(rest[1]))
        if rest[2:]:
            logits(Path(rest[0]), json.loads(Path(rest[2]).read_text()), Path(rest[3]))
    elif command == "logits":
        logits(Path(rest[0]), json.loads(Path(rest[1]).read_text()), Path(rest[2]), interpret=rest[3:] == ["interpret"])
    elif command == "reload":
        reload(Path(rest[0]), json.loads(Path(rest[1]).read_text()), Path(rest[2]))
    elif command == "count":
        count(json.loads(Path(rest[0]).read_text()))
    else:
        raise SystemExit(f"unknown command {command!r}")
