"""Session-wide test setup.

On a machine without CUDA, Triton kernels (flash-linear-attention's) can only run in Triton's
interpreter, and Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when fla is first
imported: so it is set here, before any test imports it (tests/triton_interpreter.py,
tests/test_fla_interpreted.py). On a CUDA machine the kernels compile as they do in training.

madsl's caches (the machine's measured training rates, the token files checked) go to a folder of
this session's own, unless MADSL_CACHE_DIR is set: the suite never reads what an earlier run or the
user left in ~/.cache/madsl, nor writes there.
"""

import atexit
import os
import shutil
import tempfile

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if not os.environ.get("MADSL_CACHE_DIR"):
    os.environ["MADSL_CACHE_DIR"] = tempfile.mkdtemp(prefix="madsl-test-cache-")
    atexit.register(shutil.rmtree, os.environ["MADSL_CACHE_DIR"], True)


def _transformers_keeps_its_own_model_types() -> None:
    """flash-linear-attention's models (the dev extra's, for tests/fla_reference.py) register with
    transformers' Auto classes when `fla` is first imported, by any test (madsl's fla kernels import
    fla.ops): its own `mamba` over transformers' Mamba, whose tests would then load fla's Triton kernels.
    So fla is imported here, once, and every model type transformers ships is given back to it: no test
    depends on which test imported fla first. fla's own types (rwkv7, ...) stay registered."""
    from importlib import metadata

    try:
        metadata.version("flash-linear-attention")
        import fla  # noqa: F401 - its registrations, made now
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES
    except (metadata.PackageNotFoundError, ImportError):
        return
    for model_type in [key for key in CONFIG_MAPPING._extra_content if key in CONFIG_MAPPING_NAMES]:
        del CONFIG_MAPPING._extra_content[model_type]


_transformers_keeps_its_own_model_types()
