"""madsl's version: the package's (pyproject.toml reads it here) and part of every run id
(docs/runner.md, "Run identity"). Raised when training computes something else under the same
settings, so that a results database does not serve what an older madsl computed.
0.2.0: mad-lab compression zeroes every Linear bias, as the reference does."""

__version__ = "0.2.0"
