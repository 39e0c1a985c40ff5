"""The topology language's public face at its first address: `madsl.topology` is `madsl.lang.topology`
(madsl/lang/topology/__init__.py says what each name is)."""

from __future__ import annotations

from madsl.lang.topology import *  # noqa: F403 (the same names, listed once in the package)
from madsl.lang.topology import __all__  # noqa: F401
