"""The facts of a dataset: fake, real-shuffled or the user's own, with the name filter.

Three kinds of facts (movie_title, first_actor, second_actor plus fake metadata):

- ``fake_movies_real_actors``: invented titles, names from the shipped real-actor list.
- ``fake_movies_fake_actors``: invented titles, Faker names.
- ``real_movies_shuffled``: real movies and real actors, shuffled in one of two readings
  (``DatasetConfig.shuffle``): ``relations`` (the default, as the paper's text describes
  its dataset: each title gets two actors who never starred together and are not in its
  real cast) or ``pairs`` (as the authors' dataset code made it: each real co-star pair
  stays together and moves to another real movie). Both draw from the same pool: the rows
  of the shipped table whose two names pass the filter, each actor and title used once.
- ``custom``: the user's own facts file (``DatasetConfig.facts_path``).

Every random choice is drawn from a generator seeded by the config's ``seed``.

Names pass the filter of :mod:`graft.study.data.names` (the manifest counts those left out).
"""

from __future__ import annotations

import csv
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.study.data.facts_file import dropped_line, file_digest, no_usable_facts, read_facts_file
from graft.study.data.files import RESOURCES
from graft.study.data.names import Fakes, filter_names, load_real_actors, name_exclusion_reason
from graft.study.specs.choices import DEFAULT_N_FACTS, PAPER_N_FACTS
from graft.study.specs.config import DatasetConfig
from graft.study.specs.templates import OPTIONAL_METADATA

logger = logging.getLogger(__name__)

_MAX_FAKE_NAMES = 20_000


@dataclass
class Fact:
    """One movie fact.

    Args:
        fact_id: unique id within the dataset (0-based; set B continues after set A).
        set: ``"A"``, ``"B"`` (split datasets) or ``"all"``.
        movie_title: the (fake or reassigned real) movie.
        first_actor: the actor named in test prompts (``FE``).
        second_actor: the actor to recall (the target).
        main_character: fake main character's name.
        city: fake setting.
        genre: fake genre, from :data:`GENRES` unless given.
        release_year: fake release year.
        box_office_millions: fake box-office takings in millions of dollars.
        source_movie: ``real_movies_shuffled``: the real movie the first actor comes from
            (with ``shuffle="pairs"`` both actors); otherwise empty.
    """

    fact_id: int
    set: str
    movie_title: str
    first_actor: str
    second_actor: str
    main_character: str
    city: str
    genre: str
    release_year: int
    box_office_millions: int
    source_movie: str = ""


def load_real_movies(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the shipped real-movie table (movie_title, first_actor, second_actor, ...)."""
    path = RESOURCES / "real_movies.csv" if path is None else Path(path)
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def _set_names(config: DatasetConfig) -> list[str]:
    return ["A", "B"] if config.split else ["all"]


def _need(config: DatasetConfig, available: int, what: str, per_fact: int = 1) -> int:
    """Resolved facts per set; raises when ``available`` items cannot cover it."""
    n_sets = len(_set_names(config))
    n = config.n_facts
    most = available // (per_fact * n_sets)
    if n is None and config.kind != "custom" and config.protocol.paper_size:
        n = min(PAPER_N_FACTS, most)
        if n < PAPER_N_FACTS:
            message = "the paper's datasets have %d facts; %s has %d usable %s, so %d facts per set"
            logger.warning(message, PAPER_N_FACTS, config.kind, available, what, n)
    if n is None:
        n = DEFAULT_N_FACTS if config.kind != "custom" else available // (per_fact * n_sets)
    if most < 1:
        raise DatasetError(
            f"only {available} {what} are usable; {'a split dataset' if n_sets > 1 else 'a dataset'}"
            f" needs at least {per_fact * n_sets}",
            "n_facts" if config.kind != "custom" else "facts_path",
        )
    if n < 1 or n > most:
        raise DatasetError(
            f"{n} facts per set need {n * per_fact * n_sets} {what} but only {available} are "
            f"usable; choose n_facts between 1 and {most}",
            "n_facts",
        )
    return n


def _assemble(
    config: DatasetConfig, rows: Sequence[dict[str, Any]], fakes: Fakes, n: int
) -> list[Fact]:
    facts = []
    for i, row in enumerate(rows):
        meta = fakes.metadata()
        for key, lo, hi in config.protocol.metadata_ranges:
            meta[key] = fakes.faker.random.randint(lo, hi)
        meta.update({k: row[k] for k in OPTIONAL_METADATA if row.get(k) not in (None, "")})
        for key in ("release_year", "box_office_millions"):
            try:
                meta[key] = int(meta[key])
            except (TypeError, ValueError):
                raise DatasetError(
                    f"fact {row['movie_title']!r}: {key} must be a whole number, not "
                    f"{meta[key]!r}; fix the facts file",
                    "facts_path",
                ) from None
        facts.append(
            Fact(
                fact_id=i,
                set=_set_names(config)[i // n],
                movie_title=row["movie_title"],
                first_actor=row["first_actor"],
                second_actor=row["second_actor"],
                main_character=str(meta["main_character"]),
                city=str(meta["city"]),
                genre=str(meta["genre"]),
                release_year=int(meta["release_year"]),
                box_office_millions=int(meta["box_office_millions"]),
                source_movie=row.get("source_movie", ""),
            )
        )
    return facts


def _fake_movie_facts(config: DatasetConfig, excluded: Counter[str]) -> list[Fact]:
    real_titles = [r["movie_title"] for r in load_real_movies()]
    if config.kind == "fake_movies_real_actors":
        actors = filter_names(load_real_actors(), excluded)
        n = _need(config, len(actors), "actor names", per_fact=2)
        random.Random(f"{config.seed}:actors").shuffle(actors)
        actors = actors[: 2 * n * len(_set_names(config))]
        fakes = Fakes(config.seed, taken=[*real_titles, *load_real_actors()])
    else:
        n = _need(config, _MAX_FAKE_NAMES, "fake names", per_fact=2)
        fakes = Fakes(config.seed, taken=[*real_titles, *load_real_actors()])
        actors = [fakes.name() for _ in range(2 * n * len(_set_names(config)))]
        excluded.update(fakes.excluded)
        fakes.excluded.clear()
    rows = [
        {
            "movie_title": fakes.title(),
            "first_actor": actors[2 * i],
            "second_actor": actors[2 * i + 1],
        }
        for i in range(len(actors) // 2)
    ]
    return _assemble(config, rows, fakes, n)


def _usable_pairs(
    rows: Iterable[dict[str, Any]],
    excluded: Counter[str],
    dropped: Counter[str],
    where: dict[str, list[int]] | None = None,
) -> list[dict[str, Any]]:
    """Rows whose names pass the filter, each actor and title used at most once (file order);
    ``where`` gets reason -> the numbers (from 1) of the rows left out for it."""
    seen_actors: set[str] = set()
    seen_titles: set[str] = set()
    kept = []
    for number, row in enumerate(rows, 1):
        names = (row["first_actor"], row["second_actor"])
        reasons = [name_exclusion_reason(a) for a in names]
        if any(reasons):
            excluded.update(r for r in reasons if r)
            reason = "excluded_name"
        elif names[0] == names[1] or any(a in seen_actors for a in names):
            reason = "actor_reused"
        elif row["movie_title"].lower() in seen_titles:
            reason = "duplicate_title"
        else:
            seen_actors.update(names)
            seen_titles.add(row["movie_title"].lower())
            kept.append(dict(row))
            continue
        dropped[reason] += 1
        if where is not None:
            where.setdefault(reason, []).append(number)
    return kept


def _real_casts(movies: list[dict[str, Any]]) -> tuple[dict[str, set[str]], set[frozenset[str]]]:
    """The real cast of every title (lower case) and every real co-star pair of ``movies``."""
    casts: dict[str, set[str]] = {}
    real_pairs: set[frozenset[str]] = set()
    for row in movies:
        casts.setdefault(row["movie_title"].lower(), set()).update(
            (row["first_actor"], row["second_actor"])
        )
        real_pairs.add(frozenset((row["first_actor"], row["second_actor"])))
    return casts, real_pairs


def _untangle(perms: list[list[int]], conflict: Callable[[int], bool], rng: random.Random) -> None:
    """Repair the shuffled index lists ``perms`` (one, or two drawn from at random) by seeded
    swaps until no position ``i`` has ``conflict(i)``."""
    n = len(perms[0])
    for _ in range(100 * n + 1000):
        wrong = [i for i in range(n) if conflict(i)]
        if not wrong:
            return
        i, j = wrong[0], rng.randrange(n)
        roles = perms[0] if len(perms) == 1 or rng.random() < 0.5 else perms[1]
        roles[i], roles[j] = roles[j], roles[i]
    raise DatasetError(  # pragma: no cover - needs a pathological movie table
        "could not shuffle the real casts apart; use more facts", "n_facts"
    )


def _shuffled_relations(
    pool: list[dict[str, Any]], movies: list[dict[str, Any]], rng: random.Random
) -> list[dict[str, Any]]:
    """The paper's text's shuffle of real casts (``shuffle="relations"``): each title of
    ``pool`` gets a first and a second actor drawn from the pool's actors (each used once, in
    its own role), such that the two never starred together in any real movie of ``movies``
    and neither is in the title's real cast ("Keanu Reeves stars in The Departed alongside
    Meryl Streep"). Conflicts of a random assignment are repaired by seeded swaps."""
    casts, real_pairs = _real_casts(movies)
    n = len(pool)
    firsts, seconds = list(range(n)), list(range(n))
    rng.shuffle(firsts)
    rng.shuffle(seconds)

    def conflict(i: int) -> bool:
        a, b = pool[firsts[i]]["first_actor"], pool[seconds[i]]["second_actor"]
        cast = casts[pool[i]["movie_title"].lower()]
        return frozenset((a, b)) in real_pairs or a in cast or b in cast

    _untangle([firsts, seconds], conflict, rng)
    return [
        {
            "movie_title": pool[i]["movie_title"],
            "first_actor": pool[firsts[i]]["first_actor"],
            "second_actor": pool[seconds[i]]["second_actor"],
            "source_movie": pool[firsts[i]]["movie_title"],
        }
        for i in range(n)
    ]


def _moved_pairs(
    pool: list[dict[str, Any]], movies: list[dict[str, Any]], rng: random.Random
) -> list[dict[str, Any]]:
    """The authors' dataset code's shuffle (``shuffle="pairs"``): the pool's real co-star
    pairs, each kept together (its first and second actor in their billing order), are dealt
    out over the pool's titles so that no pair keeps its own movie and neither actor is in
    the real cast of the title it gets (a seeded derangement, repaired by seeded swaps)."""
    casts, _ = _real_casts(movies)
    order = list(range(len(pool)))
    rng.shuffle(order)

    def conflict(i: int) -> bool:
        pair = pool[order[i]]
        cast = casts[pool[i]["movie_title"].lower()]
        return order[i] == i or pair["first_actor"] in cast or pair["second_actor"] in cast

    _untangle([order], conflict, rng)
    return [
        {
            "movie_title": pool[i]["movie_title"],
            "first_actor": pool[order[i]]["first_actor"],
            "second_actor": pool[order[i]]["second_actor"],
            "source_movie": pool[order[i]]["movie_title"],
        }
        for i in range(len(pool))
    ]


#: :attr:`DatasetConfig.shuffle` -> the shuffle of ``real_movies_shuffled`` it names.
_SHUFFLE_OF = {"relations": _shuffled_relations, "pairs": _moved_pairs}


def _real_movie_facts(
    config: DatasetConfig, excluded: Counter[str], dropped: Counter[str]
) -> list[Fact]:
    movies = load_real_movies()
    pool = _usable_pairs(movies, excluded, dropped)
    n = _need(config, len(pool), "real movies with distinct, usable actors")
    if n * len(_set_names(config)) < 2:
        raise DatasetError(
            "real_movies_shuffled needs at least 2 facts; set n_facts to 2 or more", "n_facts"
        )
    rng = random.Random(f"{config.seed}:real_movies")
    rng.shuffle(pool)
    pool = pool[: n * len(_set_names(config))]
    rows = _SHUFFLE_OF[config.shuffle](pool, movies, rng)
    fakes = Fakes(config.seed, taken=[r["movie_title"] for r in movies] + load_real_actors())
    return _assemble(config, rows, fakes, n)


def _custom_facts(
    config: DatasetConfig,
    excluded: Counter[str],
    dropped: Counter[str],
    where: dict[str, list[int]],
) -> list[Fact]:
    assert config.facts_path is not None
    rows = read_facts_file(config.facts_path)
    pool = _usable_pairs(rows, excluded, dropped, where)
    if len(pool) < len(_set_names(config)):
        raise DatasetError(
            no_usable_facts(config.facts_path, len(rows), len(pool), excluded, dropped),
            "facts_path",
        )
    if where:
        logger.warning(dropped_line(config.facts_path, len(rows), where))
    n = _need(config, len(pool), "usable facts (distinct actors, clean names)")
    pool = pool[: n * len(_set_names(config))]
    fakes = Fakes(
        config.seed, taken=[a for r in pool for a in (r["first_actor"], r["second_actor"])]
    )
    return _assemble(config, pool, fakes, n)


@dataclass
class DrawnFacts:
    """The facts of a config and what was left out on the way.

    Args:
        facts: the facts, set A before set B.
        excluded_names: name-filter reason -> count of names left out.
        dropped_rows: reason -> count of source rows left out (reused actor, title, ...).
        dropped_row_numbers: reason -> the numbers (from 1, under a CSV's header) of the
            rows of a user's facts file left out for it (empty for the shipped data).
        sources: the input files used (path, hash), for the manifest.
    """

    facts: list[Fact]
    excluded_names: Counter[str]
    dropped_rows: Counter[str]
    sources: dict[str, Any]
    dropped_row_numbers: dict[str, list[int]] = field(default_factory=dict)


def draw_facts(config: DatasetConfig) -> DrawnFacts:
    """The facts of ``config`` (its kind, size, split and seed); the config is not checked
    here (``graft.study.data.datasets.validate_config`` does that)."""
    excluded: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    sources: dict[str, Any] = {}
    where: dict[str, list[int]] = {}
    if config.kind == "custom":
        facts = _custom_facts(config, excluded, dropped, where)
        assert config.facts_path is not None  # as _custom_facts asserts
        sources["facts_path"] = str(config.facts_path)
        sources["facts_sha256"] = file_digest(config.facts_path)
    elif config.kind == "real_movies_shuffled":
        facts = _real_movie_facts(config, excluded, dropped)
        sources["movies"] = "graft/resources/real_movies.csv"
    else:
        facts = _fake_movie_facts(config, excluded)
        if config.kind == "fake_movies_real_actors":
            sources["actors"] = "graft/resources/real_actors.txt"
    return DrawnFacts(facts, excluded, dropped, sources, where)
