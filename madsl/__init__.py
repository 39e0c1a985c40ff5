"""madsl: a declarative architecture DSL and compiler for mechanistic architecture design.

    import madsl
    spec = madsl.load_spec("specs/paper/striped-hyena-moe.mad")
    print(madsl.account(spec).totals)                  # analytic: params, fixed state, KV cache, FLOPs
    model = madsl.compile(spec, vocab_size=16, max_seq_len=128)   # a torch.nn.Module

Importing madsl does not import torch; `compile` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import MadslError
from .graph import account, build_graph
from .lang.spec import Spec, load_spec, spec_from_topology

if TYPE_CHECKING:  # only for the annotations: importing madsl does not import torch
    from .model import Model
    from .runner.train.heads import TaskModel


def compile(spec: "Spec | str", **kwargs: Any) -> "Model":  # noqa: A001 - the verb users expect
    """Compile a spec (a Spec, or a path to a .mad file) to a torch.nn.Module.

    Keyword arguments: vocab_size, max_seq_len, num_classes, device, seed. `print(model)` is
    one line (name, topology, sizes); `print(model.body)` shows the module tree."""
    from .compiler import compile_spec

    return compile_spec(spec, **kwargs)


def load_run(directory: str, **kwargs: Any) -> "TaskModel":
    """The trained model of a run exported with `madsl export` (safetensors + JSON; never unpickles).

    Keyword arguments: device."""
    from .runner.store.kept import load_run as load

    return load(directory, **kwargs)


def load_pretrained(directory: str, **kwargs: Any) -> "Model":
    """The madsl model of a local Hugging Face checkpoint folder (config.json + safetensors; never
    a pickle), every weight loaded by its family's name map (docs/weights.md).

    Keyword arguments: device."""
    from .weights import load_pretrained as load

    return load(directory, **kwargs)


__all__ = [
    "MadslError",
    "Spec",
    "account",
    "build_graph",
    "compile",
    "load_pretrained",
    "load_run",
    "load_spec",
    "spec_from_topology",
    "__version__",
]
