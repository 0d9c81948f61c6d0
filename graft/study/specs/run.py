"""A run resolved once: :func:`resolve` turns an :class:`~graft.study.specs.config.
ExperimentConfig` (the options a command or a notebook gives) into frozen, typed specs, one
per concern, and the run's :class:`~graft.study.specs.protocol.Protocol`. The run-wide
defaults that depend on the protocol or on another option (preset, head policy, dtype, the
data seeds) are applied here; what differs by experiment (a donor's variant, the run folder's
tag, test prompts from the donor's own dataset) each design reads from the protocol's fields
(:mod:`graft.study.designs`), and a dataset's size from its kind
(:mod:`graft.study.data.datasets`). A function takes the one spec it reads.

:meth:`RunSpecs.record` is what a run folder's ``config.json`` stores under ``options`` (with
the record's schema version, :data:`RECORD_SCHEMA`), and :meth:`RunSpecs.from_record` reads
such a record back into the same specs. :meth:`RunSpecs.out_folder` is the run's folder
(:func:`default_out` when no ``out`` is given).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from graft.models import model_slug
from graft.remote.config import RemoteConfig
from graft.study.specs.config import SHUFFLES, ExperimentConfig, Replicate
from graft.study.specs.donor import DatasetRequest
from graft.study.specs.protocol import Protocol

#: The version of the record :meth:`RunSpecs.record` writes (1: the options as written before
#: records had a version; 2: with ``schema``).
RECORD_SCHEMA = 2
#: Options that do not change the results: not recorded.
UNRECORDED = ("remote", "progress", "overwrite")
#: Options recorded (and checked on resume) only when a run has several replicates.
REPLICATE_OPTIONS = ("finetune_seeds", "data_seeds", "control")


@dataclass(frozen=True)
class DataSpec:
    """The run's test prompts and the facts behind them.

    Args:
        dataset: a data kind (generated into the workspace) or a dataset folder.
        split: the dataset has disjoint fact sets A and B.
        n_facts: facts per set when the dataset is generated (None: the kind's default, or
            the paper's size under its protocol).
        shuffle: how ``real_movies_shuffled`` shuffles the real casts.
        data_seeds: the generated datasets' seeds, one replicate each.
        templates: the test templates (None: all the dataset has).
        directions: the test prompts' directions.
        n: prompts per template (None: all), sampled with ``sample_seed``.
        sample_seed: the seed of that sample.
        score_full_name: the whole target name is scored too (prompts whose prompt and name
            do not fit the model are dropped).
        protocol: the protocol its datasets are made under.
    """

    dataset: str
    split: bool
    n_facts: int | None
    shuffle: str
    data_seeds: tuple[int, ...]
    templates: tuple[str, ...] | None
    directions: tuple[str, ...]
    n: int | None
    sample_seed: int
    score_full_name: bool
    protocol: Protocol

    @property
    def data_seed(self) -> int:
        """The first data seed: the run's own dataset (and its only one without replicates)."""
        return self.data_seeds[0]

    def where(self, direction: str = "one", data_seed: int | None = None) -> DatasetRequest:
        """The test prompts' dataset of ``direction`` and ``data_seed`` (default:
        :attr:`data_seed`; a dataset folder takes no direction), as the workspace finds it
        (:meth:`~graft.study.training.workspace.Workspace.find_dataset`) and the planner
        plans it: the runner's and the planner's alike."""
        return DatasetRequest(
            self.dataset,
            None if Path(self.dataset).is_dir() else direction,
            split=self.split,
            n_facts=self.n_facts,
            seed=self.data_seed if data_seed is None else data_seed,
            protocol=self.protocol,
            shuffle=self.shuffle,
        )


@dataclass(frozen=True)
class DonorSpec:
    """Which model the run grafts into and how its finetuned donors are made.

    Args:
        model: the pretrained model (registry name, hub id or folder).
        preset: the finetune preset (None: the device's default).
        finetune_max_steps: a cap on finetune steps (None: the preset's).
        generic_corpus: the generic text of a preset that mixes it in.
        finetune_seeds: the finetune seeds, one replicate each.
        control: control donors trained on other facts run beside the real ones.
        allow_weak_donor: graft from a finetuned model that does not know its facts.
    """

    model: str
    preset: str | None
    finetune_max_steps: int | None
    generic_corpus: str | None
    finetune_seeds: tuple[int, ...]
    control: bool
    allow_weak_donor: bool = False


@dataclass(frozen=True)
class AnalysisSpec:
    """What is computed from the rows and how it is summarised.

    Args:
        experiment: the experiment's name, recorded in the run folder.
        head_policy: the head policy of grafts that name none.
        score_full_name: score the whole target name, teacher-forced, beside its first token.
        n_boot: bootstrap resamples of every interval.
        seed: the bootstrap seed.
    """

    experiment: str
    head_policy: str
    score_full_name: bool
    n_boot: int
    seed: int


@dataclass(frozen=True)
class ExecutionSpec:
    """Where and how the rows run, and where their results go.

    Args:
        device: the device (None: CUDA if available, else the CPU).
        dtype: the models' dtype (None: the device's default).
        batch_size: (prompt, graft) rows per forward pass.
        workspace: where datasets and finetuned models live (None: the default workspace).
        out: the run folder (None: ``runs/<experiment>/...``).
        overwrite: discard a previous run in ``out`` instead of resuming it.
        remote: a remote server's settings (None: this machine).
        progress: show progress bars.
        skip_memory_check: run even when the memory plan says the run does not fit.
    """

    device: str | None
    dtype: str | None
    batch_size: int
    workspace: str | None
    out: str | None
    overwrite: bool
    remote: RemoteConfig | None
    progress: bool
    skip_memory_check: bool

    @property
    def remote_run(self) -> RemoteConfig | None:
        """:attr:`remote` where the rows leave this machine (remote or simulated), else
        None."""
        return self.remote if self.remote is not None and self.remote.enabled else None


@dataclass(frozen=True)
class RunSpecs:
    """A run, resolved: one spec per concern, the protocol, and its replicates.

    Args:
        data: the test prompts and the facts behind them.
        donors: the pretrained model and how the finetuned ones are made.
        analysis: what is computed and summarised.
        execution: where and how the rows run, and where the results go.
        protocol: every protocol-dependent choice.
        replicates: every (data seed, finetune seed) pair, then their control twins.
        options: the :class:`ExperimentConfig` it was resolved from.
    """

    data: DataSpec
    donors: DonorSpec
    analysis: AnalysisSpec
    execution: ExecutionSpec
    protocol: Protocol
    replicates: tuple[Replicate, ...]
    options: ExperimentConfig

    @property
    def experiment(self) -> str:
        """The experiment's name."""
        return self.analysis.experiment

    def out_folder(self, tag: str = "") -> Path:
        """The run folder: :attr:`ExecutionSpec.out` when given, else :func:`default_out`
        (``tag``: a part of its name); the one place a run, a design and a study take it
        from."""
        return Path(self.execution.out) if self.execution.out else default_out(self, tag)

    @property
    def replicated(self) -> bool:
        """Whether the run has more than one replicate (several seeds, or control models)."""
        return len(self.replicates) > 1

    def record(self) -> dict[str, Any]:
        """What ``config.json`` stores under ``options``: every option that changes the
        numbers (the replicate options only when the run has several replicates, so a run of
        one is recorded as runs were before replicates existed, and resumes them), and the
        record's ``schema``."""
        given = {f.name: getattr(self.options, f.name) for f in fields(ExperimentConfig)}
        options = {k: v for k, v in given.items() if k not in UNRECORDED}
        options["protocol"] = self.protocol.name  # the record holds the name
        # the resolved defaults, as records have always held them
        options |= {"head_policy": self.analysis.head_policy, "dtype": self.execution.dtype}
        if not self.replicated:
            for name in REPLICATE_OPTIONS:
                options.pop(name, None)
        return options | {"schema": RECORD_SCHEMA}

    @classmethod
    def from_record(cls, options: dict[str, Any], **execution: Any) -> RunSpecs:
        """The specs of a stored record's ``options`` (either schema); ``execution`` sets what a
        record does not hold (``remote``, ``progress``, ``overwrite``)."""
        known = {f.name for f in fields(ExperimentConfig)}
        given = {k: v for k, v in options.items() if k in known}
        for name in ("templates", "directions", "finetune_seeds", "data_seeds"):
            if isinstance(given.get(name), list):
                given[name] = tuple(given[name])
        return resolve(ExperimentConfig(**(given | execution)))


def resolve(cfg: ExperimentConfig | RunSpecs) -> RunSpecs:
    """``cfg`` as frozen specs with every default applied (a :class:`RunSpecs` is returned as
    it is)."""
    if isinstance(cfg, RunSpecs):
        return cfg
    protocol = cfg.protocol
    data_seeds = cfg.data_seeds or (cfg.data_seed,)
    return RunSpecs(
        data=DataSpec(
            dataset=cfg.dataset,
            split=cfg.split,
            n_facts=cfg.n_facts,
            shuffle=cfg.shuffle,
            data_seeds=tuple(data_seeds),
            templates=cfg.templates,
            directions=tuple(cfg.directions),
            n=cfg.n,
            sample_seed=cfg.seed,
            score_full_name=cfg.score_full_name,
            protocol=protocol,
        ),
        donors=DonorSpec(
            model=cfg.model,
            preset=cfg.preset or protocol.preset,
            finetune_max_steps=cfg.finetune_max_steps,
            generic_corpus=cfg.generic_corpus,
            finetune_seeds=tuple(cfg.finetune_seeds or (0,)),
            control=cfg.control,
            allow_weak_donor=cfg.allow_weak_donor,
        ),
        analysis=AnalysisSpec(
            experiment=cfg.experiment,
            head_policy=cfg.head_policy or protocol.head_policy,
            score_full_name=cfg.score_full_name,
            n_boot=cfg.n_boot,
            seed=cfg.seed,
        ),
        execution=ExecutionSpec(
            device=cfg.device,
            dtype=cfg.dtype if cfg.dtype is not None else protocol.dtype,
            batch_size=cfg.batch_size,
            workspace=cfg.workspace,
            out=cfg.out,
            overwrite=cfg.overwrite,
            remote=cfg.remote,
            progress=cfg.progress,
            skip_memory_check=cfg.skip_memory_check,
        ),
        protocol=protocol,
        replicates=cfg.replicates,
        options=cfg,
    )


def default_out(cfg: ExperimentConfig | RunSpecs, tag: str = "") -> Path:
    """``runs/<experiment>/<model>-<dataset>[-pairs][-tag][-replicates]-seed<seed>`` (``-pairs``:
    ``real_movies_shuffled`` with the pair-keeping shuffle); the replicate
    part names several finetune seeds (``-fseeds0-1-2``), several data seeds
    (``-dseeds0-1``) and control models (``-control``)."""
    run = resolve(cfg)
    data = Path(run.data.dataset).name if Path(run.data.dataset).is_dir() else run.data.dataset
    if run.data.shuffle != SHUFFLES[0]:  # real_movies_shuffled-pairs, as its dataset folder
        data += f"-{run.data.shuffle}"
    tags = [tag] if tag else []
    if run.donors.finetune_seeds != (0,):
        tags.append("fseeds" + "-".join(map(str, run.donors.finetune_seeds)))
    if len(run.data.data_seeds) > 1:
        tags.append("dseeds" + "-".join(map(str, run.data.data_seeds)))
    if run.donors.control:
        tags.append("control")
    parts = "".join("-" + t for t in tags)
    name = f"{model_slug(run.donors.model)}-{data}{parts}-seed{run.analysis.seed}"
    return Path("runs") / run.experiment / name
