"""Convention sets: whose reading of the MAD tasks and training a run follows.

    madsl    the paper's text: its vocabulary counts, single noise tokens, Table B.1's
             AdamW betas, class-averaged accuracy over the whole evaluation set
    mad-lab  the public reference implementation (github athms/mad-lab) as its code runs:
             its vocabulary layouts and sequence layouts, AdamW's default betas with decay
             on every parameter, the cosine schedule stepped per epoch, an untied LM head
             with a bias, and the accuracy its logger reports (the batch-size-weighted mean
             of per-batch class-averaged accuracies)

docs/tasks.md ("Conventions") lists every difference, task by task. `madsl` is what
runs made before conventions existed used, so it is left out of run identities.
"""

from __future__ import annotations

from madsl.errors import Location, MadslError, did_you_mean

MADSL = "madsl"
MAD_LAB = "mad-lab"
CONVENTIONS = (MAD_LAB, MADSL)


def check_conventions(name: object, where: Location | None = None, source: str = "--conventions") -> str:
    """`name` if it is a convention set; a located MadslError otherwise."""
    if name not in CONVENTIONS:
        raise MadslError(
            f"{source}: unknown conventions {name!r}",
            where,
            expected=" or ".join(CONVENTIONS),
            hint=did_you_mean(str(name), CONVENTIONS)
            or "mad-lab: the reference implementation's; madsl: the paper's text",
        )
    return str(name)
