"""Architecture search (`madsl search`, docs/search.md): evolve topologies inside a space, under
budgets, scored on the MAD tasks by the runner; resumable, and never training an identity twice.

Its modules, one concern each (data flows down the list; nothing here imports the command line):

    config.py         what a search file says, as checked data: Space, Objectives, Algorithm, SearchFile
    reading.py        search files (YAML) -> SearchFile, every error located; reading_space.py: the space
    genome.py         a candidate before it is built: its shape and blocks as topology nodes
    operators.py      mutations and crossover, on topology nodes
    candidates.py     genome -> candidate: checked, solved into the budget, accounted; its identity
    nsga2.py          non-dominated sorting, crowding distance, tournaments, survivors
    algorithms.py     NSGA-II, regularized evolution, random search: proposing and selecting
    evaluation.py     scoring batches through madsl.runner.api.evaluate
    state.py          the saved state a search resumes from; state_check.py the one gate it passes
                      (state_values.py: the checks of its values)
    loop.py           run_search and plan_search (the dry run)
    record.py         the front, the lineage, the JSON record, the .mad files; figures.py: the figures
"""
