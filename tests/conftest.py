"""Session-wide test setup.

On a machine without CUDA, Triton kernels (flash-linear-attention's) can only run in Triton's
interpreter, and Triton reads TRITON_INTERPRET when a kernel is defined, i.e. when fla is first
imported: so it is set here, before any test imports it (tests/triton_interpreter.py,
tests/test_fla_interpreted.py). On a CUDA machine the kernels compile as they do in training.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
