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
