"""A workspace: the folder where datasets and finetuned donors live, found or made on demand.

Layout::

    <root>/datasets/<kind>[-paper]-<direction>[-split]-n<N>-seed<S>/
    <root>/finetuned/<model>/<dataset>/<set>/<config key>/
    <root>/corpora/          the paper's generic corpus, once downloaded (gentle preset)

A dataset is named by its data kind (generated into the workspace) or given as a folder;
a donor by (model, dataset, variant, preset). :meth:`Workspace.find_or_finetune` returns the
donor's folder, finetuning it first when it is missing, so an experiment need not know where
anything lives.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from graft.errors import DatasetError, FinetuneError, StorageError
from graft.models import model_slug, resolve_model_name
from graft.naming import slug
from graft.study.data.datasets import (
    default_dataset_name,
    generate_dataset,
    generator_version,
    load_manifest,
    validate_config,
)
from graft.study.data.generic_corpus import PaperCorpusHub, settle
from graft.study.specs.choices import FILE_KINDS, GENERATED_KINDS, VARIANT_ALIASES
from graft.study.specs.config import DatasetConfig
from graft.study.specs.donor import DatasetRequest, DonorRequest
from graft.study.specs.presets import FinetuneConfig, resolve_config
from graft.study.specs.protocol import GRAFT, Protocol
from graft.study.specs.templates import DIRECTIONS
from graft.study.training.donors import check_trained_on
from graft.study.training.finetune import finetune
from graft.study.training.partial_folder import drop_leftover_partial, is_finished

logger = logging.getLogger(__name__)

#: Environment variable naming the default workspace folder.
WORKSPACE_ENV = "GRAFT_WORKSPACE"


def _older(folder: Path, config: DatasetConfig) -> bool:
    """Whether ``folder`` holds a dataset of ``config`` made by another generator version."""
    if not (folder / "manifest.json").is_file():
        return False
    manifest = load_manifest(folder)
    return manifest.get("config") == config.to_json() and manifest.get(
        "generator_version"
    ) != generator_version(config)


def default_workspace() -> Path:
    """``$GRAFT_WORKSPACE``, else ``./workspace``."""
    return Path(os.environ.get(WORKSPACE_ENV) or "workspace")


def parse_variant(variant: str) -> tuple[str, str | None]:
    """``"one"``, ``"both"``, ``"<direction>-A"``/``"-B"``, ``"task"``, ``"relation"`` ->
    (direction, train set or ``None`` for an unsplit dataset)."""
    direction, _, train_set = VARIANT_ALIASES.get(variant, variant).partition("-")
    if direction not in DIRECTIONS or train_set not in ("", "A", "B"):
        raise FinetuneError(
            f"unknown data variant {variant!r}; use one, both, one-A, one-B, both-A, both-B, "
            "task (= one-A) or relation (= one-B)"
        )
    return direction, train_set or None


def donor_dataset(request: DonorRequest) -> tuple[str | None, DatasetRequest]:
    """The fact set the donor of ``request`` learns (None: all) and the dataset it learns
    from (the runner's and the planner's alike)."""
    direction, train_set = parse_variant(request.variant)
    return train_set, DatasetRequest(
        request.dataset,
        direction,
        split=request.split or train_set is not None,
        n_facts=request.n_facts,
        seed=request.data_seed,
        protocol=request.protocol,
        shuffle=request.shuffle,
    )


@dataclass(frozen=True)
class DonorLocation:
    """Where a donor is (or will be, once finetuned).

    Args:
        model: the pretrained model it is finetuned from.
        dataset_dir: the dataset folder it is trained on.
        train_set: ``"A"``/``"B"`` of a split dataset, ``None`` for an unsplit one.
        config: the finetune config.
        path: its folder in the workspace.
    """

    model: str
    dataset_dir: Path
    train_set: str | None
    config: FinetuneConfig
    path: Path

    @property
    def finished(self) -> bool:
        """Whether the donor is already finetuned."""
        return is_finished(self.path)


@dataclass(frozen=True)
class Workspace:
    """Datasets and finetuned donors on disk, under one folder (see the module docstring).

    Args:
        root: the folder; default ``$GRAFT_WORKSPACE``, else ``./workspace``.
        hub: asks the hub for the paper's generic corpus, once for all the donors this
            workspace locates (:class:`~graft.study.data.generic_corpus.PaperCorpusHub`).
    """

    root: Path = field(default_factory=default_workspace)
    hub: PaperCorpusHub = field(
        default_factory=PaperCorpusHub, compare=False, hash=False, repr=False
    )

    @property
    def lock_dir(self) -> Path:
        """``<root>/.locks``: the lock files of datasets, donors and runs built by several
        processes at once (:mod:`graft.storage.locks`)."""
        return self.root / ".locks"

    @property
    def corpus_dir(self) -> Path:
        """``<root>/corpora``: the paper's generic corpus, kept after its first download
        (:mod:`graft.study.data.generic_corpus`)."""
        return self.root / "corpora"

    @classmethod
    def at(cls, root: str | os.PathLike[str] | None) -> Workspace:
        """The workspace at ``root`` (``None``: the default one)."""
        return cls() if root is None else cls(Path(root))

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """Turns a disk failure inside into a one-line :class:`~graft.errors.StorageError`
        naming the workspace."""
        try:
            yield
        except OSError as err:
            where = f" ({err.filename})" if err.filename else ""
            raise StorageError(
                f"cannot {what} in the workspace {self.root}: {err.strerror or err}{where}; "
                "choose a writable workspace"
            ) from None

    def dataset_folder(self, config: DatasetConfig) -> Path:
        """``<root>/datasets/<name>``: where ``config``'s dataset lives in this workspace
        (:func:`~graft.study.data.datasets.default_dataset_name`; a relation file is read and
        checked for it)."""
        return self.root / "datasets" / default_dataset_name(config)

    def generated_dataset(
        self,
        kind: str,
        direction: str = "one",
        split: bool = False,
        *,
        n_facts: int | None = None,
        seed: int = 0,
        protocol: Protocol = GRAFT,
        shuffle: str = "relations",
    ) -> Path:
        """The dataset folder of this config under ``<root>/datasets``, generated if missing."""
        data = DatasetRequest(kind, direction, split, n_facts, seed, protocol, shuffle)
        return self._generated(_checked_config(data))

    def _generated(self, config: DatasetConfig) -> Path:
        folder = self.dataset_folder(config)
        with self._writing("generate the dataset"):
            try:
                return generate_dataset(config, folder, lock_dir=self.lock_dir)
            except StorageError as err:
                if isinstance(err.__cause__, OSError):  # said in the workspace's words
                    raise err.__cause__ from None
                raise
            except DatasetError:
                if _older(folder, config):  # no overwrite option here: say what to delete
                    raise DatasetError(
                        f"{folder} was made by an older graft from this config (found "
                        f"{load_manifest(folder).get('generator_version')!r}, graft now makes "
                        f"{generator_version(config)!r}); delete it and graft generates it "
                        "again (a model finetuned on it is then refused until deleted too)",
                        "workspace",
                    ) from None
                raise

    def planned_dataset(self, data: DatasetRequest) -> Path:
        """The folder :meth:`find_dataset` gives for ``data``, generating and checking
        nothing: a dataset folder as it is, a data kind's folder under ``<root>/datasets``
        (which may not exist yet)."""
        if data.is_folder or str(data.dataset) not in GENERATED_KINDS:
            return Path(data.dataset)
        return self.dataset_folder(_checked_config(data))

    def dataset(
        self,
        dataset: str | os.PathLike[str],
        direction: str | None = None,
        *,
        split: bool = False,
        n_facts: int | None = None,
        seed: int = 0,
        protocol: Protocol | None = None,
        shuffle: str = "relations",
    ) -> Path:
        """The folder of ``dataset``: a dataset folder as it is, a data kind generated into the
        workspace (``direction`` default ``"one"``, ``split``, ``n_facts``, ``seed``,
        ``protocol`` default graft's, ``shuffle`` for ``real_movies_shuffled``): the
        :class:`~graft.study.specs.donor.DatasetRequest` of these arguments found
        (:meth:`find_dataset`).

        Raises:
            DatasetError: as :meth:`find_dataset`.
        """
        data = DatasetRequest(dataset, direction, split, n_facts, seed, protocol, shuffle)
        return self.find_dataset(data)

    def find_dataset(self, data: DatasetRequest) -> Path:
        """The folder of ``data``: a dataset folder as it is, a data kind generated into the
        workspace if missing.

        Raises:
            DatasetError: ``data.dataset`` is neither, or a folder whose manifest has another
                direction or another protocol than ``data`` asks for.
        """
        folder = Path(data.dataset)
        direction, protocol = data.direction, data.protocol
        if data.is_folder:
            has_manifest = (folder / "manifest.json").is_file()
            manifest = load_manifest(folder) if has_manifest else {}
            stored = manifest.get("direction")
            if direction is not None and stored not in (None, direction):
                raise DatasetError(
                    f"dataset {folder} has direction {stored!r}, the variant asks for {direction!r}",
                    "dataset",
                )
            # a manifest without a protocol predates the paper protocol: graft's
            made_with = manifest.get("protocol", GRAFT.name) if has_manifest else None
            if protocol is not None and made_with not in (None, protocol.name):
                raise DatasetError(
                    f"dataset {folder} was made with the {made_with!r} protocol, the run asks "
                    f"for {protocol.name!r}; pass a data kind or a dataset made with that protocol",
                    "dataset",
                )
            return folder
        kind = str(data.dataset)
        if kind in FILE_KINDS:
            raise DatasetError(
                f"data kind {kind!r} needs your file: run graft-exp data "
                f"{FILE_KINDS[kind]} and give the folder it prints as dataset",
                "dataset",
            )
        if kind not in GENERATED_KINDS:
            raise DatasetError(
                f"dataset {kind!r} is neither a dataset folder nor a data kind "
                f"({', '.join(GENERATED_KINDS)})",
                "dataset",
            )
        return self._generated(_checked_config(data))

    def dataset_label(self, dataset_dir: str | os.PathLike[str]) -> str:
        """Folder name of a dataset among the donors: its own name for datasets generated in
        the workspace, else its name plus a hash of its manifest (so two folders of one name
        never collide).

        Raises:
            DatasetError: a folder outside the workspace with neither a manifest nor a
                ``train.jsonl``.
        """
        path = Path(dataset_dir).resolve()
        if path.parent == (self.root / "datasets").resolve():
            return path.name
        key = path / ("manifest.json" if (path / "manifest.json").is_file() else "train.jsonl")
        if not key.is_file():
            raise DatasetError(
                f"{path} has no train.jsonl, which a donor is finetuned on; pass a data kind "
                "or a dataset folder graft-exp data wrote",
                "dataset",
            )
        return f"{slug(path.name)}-{hashlib.sha256(key.read_bytes()).hexdigest()[:8]}"

    def donor_dir(
        self,
        model: str,
        dataset_dir: str | os.PathLike[str],
        train_set: str | None,
        config: FinetuneConfig,
    ) -> Path:
        """``<root>/finetuned/<model>/<dataset>/<set>/<config key>``."""
        label = self.dataset_label(dataset_dir)
        return (
            self.root
            / "finetuned"
            / model_slug(model)
            / label
            / (train_set or "all")
            / config.key()
        )

    def locate_donor(self, request: DonorRequest) -> DonorLocation:
        """Where the donor of ``request`` is; generates its dataset if missing, trains
        nothing. A preset that mixes in generic text has its corpus fixed first
        (:func:`graft.study.data.generic_corpus.settle`: the paper's corpus is downloaded into
        :attr:`corpus_dir` if missing), so the folder names it."""
        config = request.config
        train_set, data = donor_dataset(request)
        resolve_model_name(request.model)
        dataset_dir = self.find_dataset(data)
        with self._writing("keep the generic corpus"):
            config = settle(config, dataset_dir, self.corpus_dir, hub=self.hub)
        path = self.donor_dir(request.model, dataset_dir, train_set, config)
        return DonorLocation(request.model, dataset_dir, train_set, config, path)

    def find_or_finetune(
        self,
        model: str,
        dataset: str | os.PathLike[str] = "fake_movies_real_actors",
        variant: str = "one",
        preset: str | FinetuneConfig | None = None,
        *,
        split: bool = False,
        n_facts: int | None = None,
        data_seed: int = 0,
        device: str | None = None,
        quiet: bool = False,
        protocol: Protocol | None = None,
        shuffle: str = "relations",
    ) -> Path:
        """The finetuned model folder for (model, dataset, variant, preset); finetunes first
        if missing. ``preset`` None: the default preset of ``device``; the other arguments are
        :class:`~graft.study.specs.donor.DonorRequest`'s fields; ``quiet``: no progress
        bars."""
        config = resolve_config(preset, device=device)
        data = (split, n_facts, data_seed, shuffle)  # DonorRequest's fields, in its order
        request = DonorRequest(model, str(dataset), variant, config, *data, device, protocol)
        return self.finetune_donor(self.locate_donor(request), device=device, quiet=quiet)

    def finetune_donor(
        self, donor: DonorLocation, *, device: str | None = None, quiet: bool = False
    ) -> Path:
        """``donor``'s folder, finetuning it first when it is not finished; a finished one
        trained on other texts than its dataset holds now is refused
        (:func:`graft.study.training.donors.check_trained_on`)."""
        if donor.finished:
            check_trained_on(donor.path, donor.dataset_dir)
            drop_leftover_partial(donor.path)
            return donor.path
        logger.info(
            "no finetuned %s for this data in %s; finetuning it (%s)",
            donor.model,
            self.root,
            donor.config.key(),
        )
        with self._writing("finetune the model"):
            return finetune(
                donor.model,
                donor.dataset_dir,
                donor.path,
                donor.config,
                train_set=donor.train_set,
                device=device,
                quiet=quiet,
                lock_dir=self.lock_dir,
                corpus_dir=self.corpus_dir,
            )


def _checked_config(data: DatasetRequest) -> DatasetConfig:
    """The validated config of the generated dataset ``data`` asks for (what
    :meth:`Workspace.find_dataset` makes and :meth:`Workspace.planned_dataset` plans)."""
    config = data.generated_config()
    validate_config(config)
    return config
