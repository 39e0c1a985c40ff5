"""Pretraining on text: a compiled spec trained with a next-token objective for a FLOP budget
(MAD paper Sec. 4 and App. C), the unit of an IsoFLOP study (madsl.scaling).

    recipe.py   PretrainSettings: the paper's recipe as defaults; a FLOP budget as steps
    loop.py     one run: train steps, validation along the way, checkpoints and resume
    job.py      the run as a job of the runner's executors (local workers, Ray)
"""
