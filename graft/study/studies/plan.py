"""The plan of a study before anything is loaded or written: each run's plan (rows, the
donors it needs, memory), the donors the runs share (each once: a donor is its folder), a
rough finetune time per run and in total, and the most memory any step needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from graft.study.designs.design import plan_design
from graft.study.planning.finetune_plan import FinetunePlan
from graft.study.planning.memory import count_text, gib
from graft.study.planning.run_plan import ExperimentPlan
from graft.study.specs.donor import DonorRequest
from graft.study.specs.request import RunRequest
from graft.study.studies.runs import StudyRun, study_runs
from graft.study.studies.study_file import Study
from graft.study.training.finetune import duration_text
from graft.study.training.sources import donor_request, needs_finetune


@dataclass(frozen=True)
class Donor:
    """A donor a study needs.

    Args:
        request: what it is finetuned from, on and with (``run_donor_job`` trains it).
        plan: its plan (folder, steps, rough duration, memory; finished or not).
        runs: the runs that need it (:attr:`StudyRun.name`).
    """

    request: DonorRequest
    plan: FinetunePlan
    runs: list[str] = field(default_factory=list)


@dataclass
class StudyRunPlan:
    """A run's plan.

    Args:
        run: the run.
        plans: run name of its design -> that run's plan.
        donors: the folders of the donors it needs.
        seconds: the rough finetune time of the donors it is the first run to need (and
            which are not finetuned yet).
    """

    run: StudyRun
    plans: dict[str, ExperimentPlan]
    donors: list[Path]
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return sum(p.rows for p in self.plans.values())

    @property
    def needed(self) -> int:
        """The most memory a step of the run needs."""
        return max((p.needed for p in self.plans.values()), default=0)


@dataclass
class StudyPlan:
    """What a study will do and need.

    Args:
        study: the study.
        runs: each run's plan, in run order.
        donors: donor folder -> the donor, each once, in the order the runs first need them.
    """

    study: Study
    runs: list[StudyRunPlan]
    donors: dict[Path, Donor]

    @property
    def pending(self) -> list[Donor]:
        return [d for d in self.donors.values() if not d.plan.finished]

    @property
    def seconds(self) -> float:
        return sum(d.plan.seconds for d in self.pending)

    def lines(self) -> list[str]:
        """The plan in words: the totals, each donor, each run."""
        runs, pending = self.runs, self.pending
        out = [
            f"plan of study {self.study.path} (nothing loaded, nothing written):",
            f"{count_text(len(runs), 'run')}: {count_text(len(self.study.models), 'model')} x "
            f"{count_text(len(self.study.finetune_seeds), 'finetune seed')} x "
            f"{count_text(len(self.study.experiments), 'experiment')}, into {self.study.out}",
            f"donors: {len(self.donors)} ({len(pending)} to finetune, roughly "
            f"{duration_text(self.seconds)} in all; {len(self.donors) - len(pending)} "
            f"finetuned already), in {self.study.workspace}",
        ]
        for folder, donor in self.donors.items():
            state = "finetuned" if donor.plan.finished else duration_text(donor.plan.seconds)
            out.append(f"  {folder} ({state}; for {count_text(len(donor.runs), 'run')})")
        for plan in runs:
            out.append(
                f"{plan.run.name}: {plan.rows} rows, {count_text(len(plan.donors), 'donor')} "
                f"(finetuning first: {duration_text(plan.seconds) if plan.seconds else 'none'})"
                f", needs about {gib(plan.needed)} -> {plan.run.folder}"
            )
        most = max((p.needed for p in runs), default=0)
        verdicts = sorted({v for p in runs for v in (x.verdict for x in p.plans.values())})
        out.append(
            f"total: {sum(p.rows for p in runs)} rows; finetuning roughly "
            f"{duration_text(self.seconds)} (grafting time is not estimated); the most any "
            f"step needs: about {gib(most)} ({', '.join(verdicts)})"
        )
        return out


def donor_requests(request: RunRequest) -> list[DonorRequest]:
    """The donors ``request`` finetunes first, in the order its plan lists its finetunes
    (:attr:`ExperimentPlan.finetunes`): per replicate, the base, then each donor."""
    run = request.specs
    sources = dict.fromkeys([request.base, *request.donors.values()])
    return [
        donor_request(run, source, rep)
        for rep in run.replicates
        for source in sources
        if needs_finetune(source)
    ]


def plan_study(study: Study) -> StudyPlan:
    """The plan of every run of ``study`` and of the donors they share; nothing is loaded or
    written (datasets the workspace lacks are generated into a scratch folder)."""
    plans: list[StudyRunPlan] = []
    donors: dict[Path, Donor] = {}
    for run in study_runs(study):
        designed = plan_design(run.design)
        plan = StudyRunPlan(run, designed, [])
        for name, request in run.design.runs.items():
            finetunes = designed[name].finetunes
            for want, finetune in zip(donor_requests(request), finetunes, strict=True):
                if finetune.folder not in donors:
                    donors[finetune.folder] = Donor(want, finetune)
                    plan.seconds += 0.0 if finetune.finished else finetune.seconds
                if run.name not in donors[finetune.folder].runs:
                    donors[finetune.folder].runs.append(run.name)
                    plan.donors.append(finetune.folder)
        plans.append(plan)
    return StudyPlan(study, plans, donors)
