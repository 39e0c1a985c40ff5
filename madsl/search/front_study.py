"""From a found front to its scaling check: a study file whose architectures are the search's
front (the `.mad` files it wrote, each keeping its budget rule, so `madsl scale` solves it again
at every width) beside the baselines of a template study, with the template's data, budgets,
sizes and recipe (`madsl search FILE --then-scale TEMPLATE`; docs/search.md).

    path = write_front_study(search, state, "specs/scaling/stage-d.yaml", out)   # out/front-study.yaml
    madsl scale out/front-study.yaml --dry-run

STAR's point (Thomas et al. 2024) is that what a search finds at one size is checked at scale;
this is that step. A study reads nothing outside its own folder, so the template's data is
bundled and its specs given by path are copied beside the written study.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from madsl.errors import MadslError
from madsl.lang.yamlsource import load
from madsl.outputs import write_text_atomic
from madsl.scaling.study import load_study, study_location
from madsl.search.config import SearchFile
from madsl.search.record import front
from madsl.search.state import SearchState

FILE_NAME = "front-study.yaml"
BUNDLED = "bundled:"


def check_template(path: str | os.PathLike) -> Path:
    """The template study read and checked before the search trains (a located error); its path.
    Its data must be bundled: a token folder cannot follow the study into the output folder (a
    study reads no file outside its own folder)."""
    study = load_study(path)
    if not study.data.startswith(BUNDLED):
        raise MadslError(
            f"--then-scale: the study's data {study.data} is a token folder, which the study written to --out "
            "could not read (a study reads nothing outside its own folder)",
            study_location(study, "data"),
            hint="give a template whose data is bundled:NAME, or write the study by hand beside the front's "
            "NAME.mad files",
        )
    return Path(path)


def front_study_files(
    search: SearchFile, state: SearchState, template: str | os.PathLike, out: Path
) -> tuple[dict[str, Any], dict[str, str]]:
    """The study's data (the template's, renamed, the front added to its architectures) and the
    baseline specs to copy beside it (file name -> text): a template's spec given by path is
    copied into `out` as SEARCH-baseline-NAME.mad, so the study finds it in its own folder."""
    template = Path(template)
    study = load_study(template)
    data = dict(load(template).data)
    data["name"] = f"{search.name}-front"
    data["description"] = f"the front of search {search.name} beside the baselines of {template.name}"
    architectures, copies = {}, {}
    for name, ref in data["architectures"].items():
        if ref.startswith(BUNDLED):
            architectures[name] = ref
            continue
        source = Path(study.spec_paths[name])
        if "extends" in (load(source).data or {}):
            raise MadslError(
                f"--then-scale: architecture {name} ({ref}) extends another spec file, which its copy in --out "
                "would not find",
                study_location(study, "architectures", name),
                hint="give the template a spec without extends:, or a bundled:NAME",
            )
        file = f"{search.name}-baseline-{name}.mad"
        architectures[name], copies[file] = file, source.read_text(encoding="utf-8")
    for candidate in front(search, state):
        if candidate["name"] in architectures:
            raise MadslError(
                f"--then-scale: the template already has an architecture named {candidate['name']}",
                hint="rename it in the template",
            )
        architectures[candidate["name"]] = f"{candidate['name']}.mad"  # written beside it by write_specs
    data["architectures"] = architectures  # the template's groups: its own architectures, still there
    return data, copies


def write_front_study(search: SearchFile, state: SearchState, template: str | os.PathLike, out: Path) -> Path:
    """Write `out`/front-study.yaml (atomically) and read it back as `madsl scale` will; its path."""
    data, copies = front_study_files(search, state, template, out)
    for name, text in copies.items():
        write_text_atomic(out / name, text)
    header = f"# written by `madsl search {Path(search.path).name} --then-scale {Path(template).name}`\n"
    path = write_text_atomic(out / FILE_NAME, header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    load_study(path)  # every front spec and moved path resolves
    return path
