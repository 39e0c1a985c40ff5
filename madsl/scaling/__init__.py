"""Scaling laws: IsoFLOP studies of specs pretrained on text (`madsl scale`), their fits and the
MAD correlation (`madsl report --study`): stages C and D of the MAD paper's pipeline (Fig. 1.1).

    study.py        a study file read and checked: architectures, budgets, sizes, data, recipe
    grid.py         its runs: each architecture sized, accounted, given its budget's steps
    api.py          plan, cost, train (`scale`) and read back (`study_points`) a study
    stacks.py       its runs as jobs: same-shape runs grouped into stacks where stacking pays
    fits.py         approach 2: IsoFLOP parabolas, frontiers N*(C), D*(C) with bootstrap; state-optimal
    parametric.py   approach 3: L(N, D) = E + A/N^α + B/D^β by Huber loss, bootstrap intervals
    correlation.py  MAD score against compute-optimal perplexity (Pearson, Spearman, Kendall;
                    exact permutation tests, BCa intervals)
    report.py       a study's results fitted, as records
    report_text.py  the report as text (extrapolated optima marked)
    figures.py      the figures (IsoFLOP curves, frontier, state-optimal, correlation, ladder)

Torch-free except the runs themselves (madsl.runner.pretrain) and the rate's measurement.
"""
