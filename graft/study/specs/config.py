"""The study's configs: :class:`DatasetConfig` (what dataset to generate),
:class:`ExperimentConfig` (the options every experiment shares) and :class:`ModelSource`
(where each model of an experiment comes from)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graft.errors import DatasetError, ExperimentError
from graft.models import DEFAULT_MODEL
from graft.ranges import COUNT, MAX_SEED, SEED, Range, first_problem
from graft.remote.config import RemoteConfig
from graft.study.specs.presets import STEPS
from graft.study.specs.protocol import GRAFT, Protocol, protocol_of
from graft.study.specs.templates import DEFAULT_RELATIONS, Relation, TemplateSet

#: The ranges of :class:`DatasetConfig`'s numbers (None: the default, not checked).
DATASET_RANGES: dict[str, Range] = {"n_facts": COUNT, "seed": SEED}
#: The two readings of ``real_movies_shuffled`` (:attr:`DatasetConfig.shuffle`): the paper's
#: text (``relations``, the default) and the authors' dataset code (``pairs``).
SHUFFLES = ("relations", "pairs")


@dataclass
class DatasetConfig:
    """What to generate.

    Args:
        kind: one of :data:`KINDS`. ``custom`` needs ``facts_path``, ``articles`` needs
            ``articles_path``, ``relation`` needs ``relation_path``.
        n_facts: facts per set (per A and per B when ``split``). ``None``: 50 for the
            generated kinds, every usable row of a custom facts file. ``articles``: the
            first ``n_facts`` articles (``None``: all); ``relation``: the first ``n_facts``
            facts (``None``: all).
        seed: seeds Faker and every shuffle; the same config gives byte-identical files.
        direction: ``"one"`` (first_actor always before second_actor) or ``"both"`` (also
            the swapped renderings).
        split: two disjoint fact sets ``A`` (task model) and ``B`` (relation model); test
            prompts come from B. Without it the single set is named ``all``.
        relations: (relation, relation_preposition, preposition) triples of the headline and
            QA test prompts, e.g. ``("starred", "in", "with")``; ``None``: the protocol's
            (graft: ``starred in ... with`` for both; paper: ``stars in ... alongside`` for
            the headline, ``stars in ... with`` for QA).
        facts_path: CSV or JSONL with columns movie_title, first_actor, second_actor and
            optionally main_character, city, genre, release_year, box_office_millions
            (missing metadata is filled with seeded fakes).
        corpus_path: generic text (one document per line, or JSONL with ``text``), stored
            with the dataset as ``corpus.jsonl``; finetuning with generic text (the gentle
            preset) mixes it in instead of the shipped text.
        protocol: the :class:`~graft.study.specs.protocol.Protocol` it is made under (a name
            given here is looked up): graft's (its training templates and test wording,
            metadata ranges 1970-2024 and $2-900M) or the paper's (the paper code's templates
            verbatim, its Table 1 filling, release year 1990-2030, box office $1-10M); see
            :mod:`graft.study.specs.templates`.
        articles_path: JSONL of the user's articles, rephrases and questions (kind
            ``articles``, the real-text variant; format: :mod:`graft.study.data.articles`).
        shuffle: how ``real_movies_shuffled`` shuffles the real casts (one of
            :data:`SHUFFLES`): ``"relations"`` (the paper's text, the default: each title gets
            two actors who never starred together and are not in its real cast) or
            ``"pairs"`` (the authors' dataset code: each real co-star pair stays together and
            moves to another real movie). Other kinds take only the default.
        relation_path: TOML file of facts of any relation: a facts table (subject, object)
            and the train and test templates (kind ``relation``; format:
            :mod:`graft.study.data.relation`).
    """

    kind: str = "fake_movies_real_actors"
    n_facts: int | None = None
    seed: int = 0
    direction: str = "one"
    split: bool = False
    relations: tuple[Relation, ...] | None = None
    facts_path: Path | None = None
    corpus_path: Path | None = None
    protocol: Protocol = GRAFT
    articles_path: Path | None = None
    shuffle: str = "relations"
    relation_path: Path | None = None

    def __post_init__(self) -> None:
        found = first_problem(DATASET_RANGES, self)
        if found:
            raise DatasetError(found[1], found[0])
        try:
            self.protocol = protocol_of(self.protocol)
        except ExperimentError:
            raise DatasetError(
                f"protocol must be 'graft' or 'paper', not {self.protocol!r}", "protocol"
            ) from None

    @property
    def texts(self) -> TemplateSet:
        """The training and test templates of the dataset's protocol."""
        return self.protocol.templates

    def relations_for(self, template: str) -> tuple[Relation, ...]:
        """The relation fillings of test template ``template``."""
        if self.relations is not None:
            return tuple(self.relations)
        return self.texts.relations.get(template, DEFAULT_RELATIONS)

    @classmethod
    def inferred(cls, kind: str | None = None, **fields: Any) -> DatasetConfig:
        """The config of ``fields``; a ``kind`` of None follows the input file given:
        ``relation`` with ``relation_path``, ``articles`` with ``articles_path``, ``custom``
        with ``facts_path``, else the default kind."""
        if kind is None:
            inputs = {"relation": "relation_path", "articles": "articles_path"}
            found = [
                k
                for k, f in (inputs | {"custom": "facts_path"}).items()
                if fields.get(f) is not None
            ]
            kind = found[0] if found else cls.kind
        return cls(kind=kind, **fields)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as given, relations as lists; the protocol only when it
        is not graft's, so graft datasets keep the config they were made with)."""
        if self.relations is not None or self.protocol == GRAFT:
            relations: Any = [list(r) for r in self.relations_for("headline")]
        else:
            relations = {t: [list(r) for r in rs] for t, rs in self.texts.relations.items()}
        data = {
            "kind": self.kind,
            "n_facts": self.n_facts,
            "seed": self.seed,
            "direction": self.direction,
            "split": self.split,
            "relations": relations,
            "facts_path": None if self.facts_path is None else str(self.facts_path),
            "corpus_path": None if self.corpus_path is None else str(self.corpus_path),
        }
        if self.protocol != GRAFT:
            data["protocol"] = self.protocol.name
        if self.articles_path is not None:  # absent otherwise: older datasets keep their config
            data["articles_path"] = str(self.articles_path)
        if self.shuffle != SHUFFLES[0]:  # likewise
            data["shuffle"] = self.shuffle
        if self.relation_path is not None:  # likewise
            data["relation_path"] = str(self.relation_path)
        return data


#: A control donor of data seed ``d`` is trained on the dataset of data seed
#: ``d + CONTROL_DATA_SEED_OFFSET``: same kind, size and templates, other facts.
CONTROL_DATA_SEED_OFFSET = 1000
#: The ranges of :class:`ExperimentConfig`'s numbers (None: the default, not checked).
EXPERIMENT_RANGES: dict[str, Range] = {
    "n_facts": COUNT,
    "data_seed": SEED,
    "finetune_max_steps": STEPS,
    "n": COUNT,
    "batch_size": COUNT,
    "seed": SEED,
    "n_boot": Range(10, 100_000, integer=True),
}


@dataclass(frozen=True)
class Replicate:
    """One set of donors of a run: which data seed its test prompts come from, which finetune
    seed its donors were trained with, and whether they are the control donors.

    Args:
        data_seed: seed of the generated dataset whose test prompts the replicate scores (and
            whose facts its donors learned, unless ``control``).
        finetune_seed: ``FinetuneConfig.seed`` of every model finetuned for it (validation
            split, data order, initialisation).
        control: the donors are trained on the dataset of data seed
            ``data_seed + CONTROL_DATA_SEED_OFFSET`` (other facts of the same kind), so they
            changed as much as the real donors but learned nothing about the test facts.
    """

    data_seed: int = 0
    finetune_seed: int = 0
    control: bool = False

    @property
    def train_data_seed(self) -> int:
        """Data seed of the dataset the replicate's finetuned models are trained on."""
        return self.data_seed + (CONTROL_DATA_SEED_OFFSET if self.control else 0)

    @property
    def label(self) -> str:
        """``d<data seed>-f<finetune seed>[-control]``: the replicate's batch-id prefix."""
        return f"d{self.data_seed}-f{self.finetune_seed}" + ("-control" if self.control else "")


def _seeds(value: Any, what: str) -> tuple[int, ...] | None:
    """``value`` as a tuple of distinct seeds 0..:data:`MAX_SEED` (None stays None)."""
    if value is None:
        return None
    seeds = (value,) if isinstance(value, int) else tuple(value)
    if not seeds or any(SEED.problem(what, s) for s in seeds):
        raise ExperimentError(
            f"{what} must be one or more whole numbers from 0 to {MAX_SEED}, got {value!r}",
            param=what,
        )
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ExperimentError(
            f"{what} lists {', '.join(map(str, repeated))} more than once; give each seed once",
            param=what,
        )
    return seeds


@dataclass(frozen=True)
class ModelSource:
    """Where a model of an experiment comes from.

    Args:
        variant: ``"pretrained"`` for the model itself, else a finetune data variant
            (``one``, ``both``, ``task``, ``relation``; see
            :func:`graft.study.training.workspace.parse_variant`).
        path: an explicit model folder (or name) that overrides ``variant``.
    """

    variant: str = "pretrained"
    path: str | None = None


@dataclass(frozen=True)
class ExperimentConfig:
    """Options every experiment shares, as given: :func:`graft.study.specs.run.resolve` turns
    them into the run's typed specs, applying every default that depends on the protocol or
    on another option.

    Args:
        experiment: experiment name (position, component, ...), recorded in the run folder
            (a design sets its own).
        model: registry name, hub id or local folder of the pretrained model.
        dataset: a data kind (generated into the workspace) or a dataset folder.
        split: whether the dataset has disjoint fact sets A and B (hybrid experiment).
        n_facts: facts per set when the dataset is generated.
        data_seed: seed of the generated dataset.
        shuffle: the shuffle of a generated ``real_movies_shuffled`` (one of
            :data:`SHUFFLES`; :attr:`DatasetConfig.shuffle`): ``"relations"`` (the paper's
            text, the default) or ``"pairs"`` (the authors' dataset code); only the default
            with any other dataset.
        preset: finetune preset of donors that must be finetuned first (None: paper on
            CUDA, else cpu).
        finetune_max_steps: cap on finetune steps (quick runs and tests); None = the preset's.
        generic_corpus: the generic text of a preset that mixes it in (gentle): a file (one
            passage per line, or JSONL with ``text``) or ``"stand-in"``; None = the paper's
            openwebtext + IMDB sample from the hub, else the shipped stand-in, with a warning
            (:attr:`graft.study.specs.presets.FinetuneConfig.generic_corpus`).
        templates: test templates to use (None = all the dataset has).
        directions: test prompt directions (``forward``; ``reverse`` for reversal).
        n: examples per template (sampled with ``seed``); None = all.
        batch_size: (prompt, graft) rows per forward pass.
        device: ``cpu``, ``cuda`` ... (default: CUDA if available).
        dtype: model dtype; ``None``: the protocol's (float32 on every device under the
            paper's: the authors grafted in float32), else float32 on CPU and bfloat16 on
            CUDA (:func:`graft.models.resolve_dtype`); ``config.json`` records the resolved
            one.
        seed: sampling and bootstrap seed.
        out: run folder (default ``runs/<experiment>/<model>-<dataset>-...``).
        head_policy: default head policy of the grafts (base, donor, paper); ``None``: the
            protocol's (base under graft's, paper under the paper's).
        protocol: the :class:`~graft.study.specs.protocol.Protocol` (a name given here is
            looked up): graft's defaults, or the paper code's setup (its training templates
            and test wording, both-direction donors, the paper head policy, its layer groups,
            ``all`` without ``pos_embed``, its metadata ranges, float32 unless ``dtype`` says
            otherwise).
        workspace: where datasets and finetuned models live (None: the default workspace).
        overwrite: discard a previous run in ``out`` instead of resuming it.
        n_boot: bootstrap resamples for the confidence intervals.
        finetune_seeds: one replicate per seed: every finetuned model of the run (donor or
            base) is the preset with ``seed`` set to it, found in or finetuned into the
            workspace; ``None``: the preset's own seed (0), one replicate.
        data_seeds: one replicate per generated dataset seed (test prompts and the facts
            the donors learn), crossed with ``finetune_seeds``; ``None``: ``(data_seed,)``.
            When given, it replaces ``data_seed``, which is set to its first entry.
        control: also run every graft that reads a finetuned model with control models:
            per replicate, the same variants, preset and finetune seed trained on the
            dataset of data seed + :data:`CONTROL_DATA_SEED_OFFSET`; their grafts are named
            ``<graft> [control]``.
        remote: where the grafts run: a :class:`graft.remote.config.RemoteConfig`, or None
            for this machine.
        progress: show progress bars.
        score_full_name: also score the whole target name, teacher-forced token by token
            (its log-probability and whether greedy decoding reproduces it exactly), next to
            the first-token metrics; costs one row per target token after the first.
        skip_memory_check: run even when the memory plan
            (:func:`graft.study.planning.run_plan.plan_experiment`) says the run does not fit the
            device's free memory; by default such a run is refused before anything loads.
        allow_weak_donor: graft from a finetuned model that does not know its facts (acc@5 on
            its trained direction less than
            :data:`~graft.study.training.recall.MIN_GAIN` above the pretrained model's, by
            its ``eval.json``); by default such a run stops before grafting.

    Numbers outside their range (:data:`EXPERIMENT_RANGES`: seeds 0 to 2**32-1, counts >= 1,
    ``n_boot`` 10 to 100,000, ``finetune_max_steps`` 1 to
    :data:`~graft.study.specs.presets.MAX_STEPS`) raise a one-line
    :class:`~graft.errors.ExperimentError` naming the field.
    """

    experiment: str = "custom"
    model: str = DEFAULT_MODEL
    dataset: str = "fake_movies_real_actors"
    split: bool = False
    n_facts: int | None = None
    data_seed: int = 0
    shuffle: str = "relations"
    preset: str | None = None
    finetune_max_steps: int | None = None
    generic_corpus: str | None = None
    templates: tuple[str, ...] | None = None
    directions: tuple[str, ...] = ("forward",)
    n: int | None = None
    batch_size: int = 32
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    out: str | None = None
    head_policy: str | None = None
    workspace: str | None = None
    overwrite: bool = False
    n_boot: int = 1000
    remote: RemoteConfig | None = None
    progress: bool = True
    protocol: Protocol = GRAFT
    score_full_name: bool = False
    finetune_seeds: tuple[int, ...] | None = None
    data_seeds: tuple[int, ...] | None = None
    control: bool = False
    skip_memory_check: bool = False
    allow_weak_donor: bool = False

    def __post_init__(self) -> None:
        # normalised in place (frozen: through object.__setattr__); defaults are resolve()'s
        seeds = _seeds(self.finetune_seeds, "finetune_seeds"), _seeds(self.data_seeds, "data_seeds")
        object.__setattr__(self, "finetune_seeds", seeds[0])
        object.__setattr__(self, "data_seeds", seeds[1])
        for name in ("templates", "directions"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, tuple):
                object.__setattr__(self, name, tuple(value))
        if self.data_seeds is not None:
            object.__setattr__(self, "data_seed", self.data_seeds[0])
        found = first_problem(EXPERIMENT_RANGES, self)
        if found:
            raise ExperimentError(found[1], param=found[0])
        self._check_control_seeds()
        # a name is looked up (an unknown one: one line naming the choices)
        object.__setattr__(self, "protocol", protocol_of(self.protocol))
        self._check_shuffle()

    def _check_shuffle(self) -> None:
        """``shuffle`` is one of :data:`SHUFFLES`, and other than the default only for a
        generated ``real_movies_shuffled`` (a dataset folder keeps the shuffle it was made
        with)."""
        if self.shuffle not in SHUFFLES:
            raise ExperimentError(
                f"shuffle must be {' or '.join(map(repr, SHUFFLES))}, not {self.shuffle!r}",
                param="shuffle",
            )
        if self.shuffle != SHUFFLES[0] and self.dataset != "real_movies_shuffled":
            raise ExperimentError(
                f"shuffle {self.shuffle!r} goes with the data kind real_movies_shuffled only "
                f"(dataset here: {self.dataset!r}; a dataset folder keeps the shuffle it was "
                "made with); drop it or pass that kind",
                param="shuffle",
            )

    def _check_control_seeds(self) -> None:
        """A control model's data seed (data seed + :data:`CONTROL_DATA_SEED_OFFSET`) must be
        a seed too."""
        highest = max(self.data_seeds or (self.data_seed,))
        if self.control and highest + CONTROL_DATA_SEED_OFFSET > MAX_SEED:
            raise ExperimentError(
                f"with control, data seeds must be at most {MAX_SEED - CONTROL_DATA_SEED_OFFSET}"
                f" (the control data seed adds {CONTROL_DATA_SEED_OFFSET}), got {highest}",
                param="data_seed",
            )

    @property
    def replicates(self) -> tuple[Replicate, ...]:
        """Every (data seed, finetune seed) pair, then their control twins with ``control``."""
        main = [
            Replicate(d, s)
            for d in self.data_seeds or (self.data_seed,)
            for s in self.finetune_seeds or (0,)
        ]
        controls = [Replicate(r.data_seed, r.finetune_seed, True) for r in main]
        return tuple(main + (controls if self.control else []))

    @property
    def remote_run(self) -> RemoteConfig | None:
        """:attr:`remote` where the grafts leave the local path (remote or simulated), else
        ``None``."""
        return self.remote if self.remote is not None and self.remote.enabled else None

    @property
    def replicated(self) -> bool:
        """Whether the run has more than one replicate (several seeds, or control models)."""
        return len(self.replicates) > 1
