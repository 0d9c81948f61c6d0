"""A study's runs: each (model, finetune seed, experiment) made into its design exactly as
the experiment's command makes it (resolved specs, then the design function), with its run
folder ``<out>/<model>/seed<S>/<experiment>``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graft.errors import InputError
from graft.models.registry import resolve_model_name
from graft.naming import slug
from graft.study.designs.design import Design
from graft.study.specs.config import ExperimentConfig
from graft.study.specs.run import resolve
from graft.study.studies.kinds import DESIGNS
from graft.study.studies.study_file import Study


@dataclass(frozen=True)
class StudyRun:
    """One run of a study.

    Args:
        model: the model, as the study file names it.
        finetune_seed: the finetune seed of its donors.
        experiment: the experiment's name.
        folder: its run folder (a design of several runs: the folder holding theirs).
        design: its design (:func:`graft.study.designs.design.run_design` runs it).
    """

    model: str
    finetune_seed: int
    experiment: str
    folder: Path
    design: Design

    @property
    def name(self) -> str:
        """``<model>/seed<S>/<experiment>``: how reports name the run."""
        return f"{self.model}/seed{self.finetune_seed}/{self.experiment}"

    def run_folders(self) -> dict[str, Path]:
        """Run name of the design -> the folder the runner writes it into."""
        return {
            name: request.specs.out_folder(request.out_tag)
            for name, request in self.design.runs.items()
        }


def study_runs(study: Study) -> list[StudyRun]:
    """Every run of ``study``, model by model, seed by seed, in the file's experiment order;
    nothing is written.

    Raises:
        InputError: an option or a design that cannot be made (one line naming the run).
    """
    runs = []
    for model, model_options in study.models.items():
        source = study.model_source(model)
        try:
            resolve_model_name(source)
        except InputError as err:  # said with the file, which names the model
            if source != model and not Path(source).exists():
                raise InputError(
                    f"{study.path}: models: {model!r} is no model folder ({source}: a "
                    "folder is relative to the study file's folder); fix the path"
                ) from None
            raise InputError(f"{study.path}: models: {err}") from None
        for seed in study.finetune_seeds:
            for experiment, options in study.experiments.items():
                folder = study.out / slug(model) / f"seed{seed}" / experiment
                try:
                    config = ExperimentConfig(
                        **{**study.options, **model_options},
                        experiment=experiment,
                        model=source,
                        finetune_seeds=(seed,),
                        workspace=str(study.workspace),
                        out=str(folder),
                    )
                    design = DESIGNS[experiment].design(resolve(config), options)
                except InputError as err:
                    raise InputError(
                        f"{study.path}: {model}, finetune seed {seed}, {experiment}: {err}"
                    ) from None
                except TypeError as err:  # a value of the wrong type for an option
                    raise InputError(
                        f"{study.path}: {model}, finetune seed {seed}, {experiment}: an option "
                        f"has a value of the wrong type ({err})"
                    ) from None
                runs.append(StudyRun(model, seed, experiment, folder, design))
    return runs
