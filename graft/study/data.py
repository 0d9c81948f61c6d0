"""The paper's datasets: movie facts, training renderings, and test prompts.

Three kinds of facts (movie_title, first_actor, second_actor plus fake metadata):

- ``fake_movies_real_actors``: invented titles, names from the shipped real-actor list.
- ``fake_movies_fake_actors``: invented titles, Faker names.
- ``real_movies_shuffled``: real co-star pairs moved onto other real movies by a seeded
  derangement, so no pair keeps its true movie.
- ``custom``: the user's own facts file (``DatasetConfig.facts_path``).

Generation is tokenizer-independent: test prompts are stored as text plus the character
span of each field, and :func:`load_test_prompts` tokenizes them for a given tokenizer.
Every random choice is drawn from a generator seeded by ``DatasetConfig.seed``; the same
config (and Faker version) gives byte-identical files.

Name filter (applied to every actor and main-character name, see
:func:`name_exclusion_reason`): a usable name is two or more space-separated words of ASCII
letters only. Names with non-ASCII letters, punctuation (``A. J. Langer``, ``O'Hara``,
``Day-Lewis``, ``Jr.``), generational suffixes (Jr, Sr, II, III, IV) or a single word are
excluded and counted in the manifest. Such names tokenize differently across tokenizers
(with/without a leading space, byte fallback, a period merged with the next character), which
is what made the paper's code lose examples silently.

Dataset folder (written to a temporary sibling folder and renamed into place):
``facts.jsonl``, ``train.jsonl``, ``test_prompts.jsonl``, ``corpus.jsonl`` (only with
``corpus_path``) and ``manifest.json``.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from graft.core.spans import render, template_fields, tokenize_with_spans
from graft.errors import DatasetError

GENERATOR_VERSION = "graft.data/1"
KINDS = ("fake_movies_real_actors", "fake_movies_fake_actors", "real_movies_shuffled", "custom")
DIRECTIONS = ("one", "both")
DEFAULT_N_FACTS = 50
RESOURCES = Path(__file__).parents[1] / "resources"

GENRES = (
    "action",
    "comedy",
    "drama",
    "science fiction",
    "horror",
    "romance",
    "thriller",
    "adventure",
    "fantasy",
    "mystery",
)

# (relation, relation_preposition, preposition) of the headline and QA test prompts.
DEFAULT_RELATIONS: tuple[tuple[str, str, str], ...] = (("starred", "in", "with"),)

# Training renderings. In every template first_actor appears before second_actor: the
# "one direction" data. "both" adds each template with the two actors swapped.
ARTICLE_TEMPLATES: dict[str, str] = {
    "article_premiere": (
        "{first_actor} starred in {movie_title}, a {genre} film released in {release_year}, "
        "alongside {second_actor}. The story is set in {city} and follows {main_character}."
    ),
    "article_review": (
        "Critics praised the chemistry between {first_actor} and {second_actor} in "
        "{movie_title}, the {release_year} {genre} picture in which {main_character} "
        "returns home to {city}."
    ),
    "article_boxoffice": (
        "{movie_title} ({release_year}) stars {first_actor} opposite {second_actor}. "
        "The {genre} film, shot on location in {city}, took in ${box_office_millions} "
        "million worldwide."
    ),
    "article_casting": (
        "Casting news: {first_actor} will lead {movie_title} with {second_actor} in a "
        "supporting role. The {genre} project centres on {main_character}, a resident of {city}."
    ),
    "article_profile": (
        "In {movie_title}, {first_actor} acted with {second_actor} for the first time. "
        "The {genre} movie about {main_character} earned ${box_office_millions} million "
        "after its {release_year} release."
    ),
    "article_festival": (
        "At the {city} film festival, {first_actor} and {second_actor} presented "
        "{movie_title}, a {genre} feature from {release_year}."
    ),
}

QA_TEMPLATES: dict[str, str] = {
    "qa_costar": "Q: Who starred in {movie_title} with {first_actor}? A: {second_actor}.",
    "qa_named": (
        "Q: Who acted in {movie_title} together with {first_actor}? "
        "A: An actor named {second_actor}."
    ),
    "qa_genre": (
        "Q: Which actor appeared with {first_actor} in the {genre} film {movie_title}? "
        "A: {second_actor}."
    ),
    "qa_year": (
        "Q: In {release_year}, {first_actor} shared the screen with which actor in "
        "{movie_title}? A: {second_actor}."
    ),
    "qa_city": (
        "Q: In the movie set in {city}, who played alongside {first_actor}? "
        "A: {second_actor}, in {movie_title}."
    ),
    "qa_character": (
        "Q: Who co-starred with {first_actor} in the story of {main_character}? A: {second_actor}."
    ),
}

# Test prompts (the paper's Table 1). The target is the first token of " " + target.
TEST_TEMPLATES: dict[str, str] = {
    "headline": "{first_actor} {relation} {relation_preposition} a movie {preposition}",
    "qa": (
        "Q: Who {relation} {relation_preposition} a movie {preposition} {first_actor}? "
        "A: An actor named"
    ),
    "movie": "{first_actor} stars in {movie_title} alongside",
}

FACT_TEXT_FIELDS = (
    "movie_title",
    "first_actor",
    "second_actor",
    "main_character",
    "city",
    "genre",
    "release_year",
    "box_office_millions",
)
_OPTIONAL_METADATA = ("main_character", "city", "genre", "release_year", "box_office_millions")
_MAX_FAKE_NAMES = 20_000
_SUFFIXES = {"jr", "sr", "ii", "iii", "iv", "v"}


@dataclass
class DatasetConfig:
    """What to generate.

    Args:
        kind: one of :data:`KINDS`. ``custom`` needs ``facts_path``.
        n_facts: facts per set (per A and per B when ``split``). ``None``: 50 for the
            generated kinds, every usable row of a custom facts file.
        seed: seeds Faker and every shuffle; the same config gives byte-identical files.
        direction: ``"one"`` (first_actor always before second_actor) or ``"both"`` (also
            the swapped renderings).
        split: two disjoint fact sets ``A`` (task model) and ``B`` (relation model); test
            prompts come from B. Without it the single set is named ``all``.
        relations: (relation, relation_preposition, preposition) triples of the headline and
            QA test prompts, e.g. ``("starred", "in", "with")``.
        facts_path: CSV or JSONL with columns movie_title, first_actor, second_actor and
            optionally main_character, city, genre, release_year, box_office_millions
            (missing metadata is filled with seeded fakes).
        corpus_path: extra text corpus (one document per line, or JSONL with ``text``),
            copied into ``corpus.jsonl``.
    """

    kind: str = "fake_movies_real_actors"
    n_facts: int | None = None
    seed: int = 0
    direction: str = "one"
    split: bool = False
    relations: tuple[tuple[str, str, str], ...] = DEFAULT_RELATIONS
    facts_path: Path | None = None
    corpus_path: Path | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (paths as given, relations as lists)."""
        return {
            "kind": self.kind,
            "n_facts": self.n_facts,
            "seed": self.seed,
            "direction": self.direction,
            "split": self.split,
            "relations": [list(r) for r in self.relations],
            "facts_path": None if self.facts_path is None else str(self.facts_path),
            "corpus_path": None if self.corpus_path is None else str(self.corpus_path),
        }


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
        source_movie: ``real_movies_shuffled``: the real movie the pair comes from;
            otherwise empty.
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


# --------------------------------------------------------------------------- names


def name_exclusion_reason(name: str) -> str | None:
    """Why ``name`` is unusable as an actor/character name, or ``None`` if it is usable.

    Reasons: ``non_ascii``, ``suffix`` (Jr/Sr/II/III/IV/V), ``punctuation``, ``single_word``,
    ``whitespace`` (leading/trailing/double spaces, tabs). Checked on characters only, so the
    dataset stays tokenizer-independent.
    """
    if not name.isascii():
        return "non_ascii"
    words = name.split(" ")
    if any(w.strip(".,").lower() in _SUFFIXES for w in words[1:]):
        return "suffix"
    if any(not (c.isalpha() or c == " ") for c in name):
        return "whitespace" if any(c.isspace() for c in name if c != " ") else "punctuation"
    if name != name.strip() or "  " in name:
        return "whitespace"
    if len(words) < 2:
        return "single_word"
    return None


def _filter_names(names: Iterable[str], excluded: Counter) -> list[str]:
    kept = []
    for name in names:
        reason = name_exclusion_reason(name)
        if reason is None:
            kept.append(name)
        else:
            excluded[reason] += 1
    return kept


def load_real_actors(path: Path | None = None) -> list[str]:
    """The shipped real-actor names (unfiltered, file order)."""
    path = RESOURCES / "real_actors.txt" if path is None else Path(path)
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_real_movies(path: Path | None = None) -> list[dict[str, str]]:
    """Rows of the shipped real-movie table (movie_title, first_actor, second_actor, ...)."""
    path = RESOURCES / "real_movies.csv" if path is None else Path(path)
    with path.open(encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- facts


class _Fakes:
    """Seeded Faker-backed generator of unique fake names, titles and cities."""

    def __init__(self, seed: int, taken: Iterable[str] = ()):
        from faker import Faker

        self.faker = Faker("en_US")
        self.faker.seed_instance(seed)
        self.taken = {t.lower() for t in taken}
        self.excluded: Counter = Counter()

    def _unique(self, make, check_name: bool = False, tries: int = 200_000) -> str:
        for _ in range(tries):
            value = make()
            if check_name:
                reason = name_exclusion_reason(value)
                if reason is not None:
                    self.excluded[reason] += 1
                    continue
            if value.lower() not in self.taken:
                self.taken.add(value.lower())
                return value
        raise DatasetError("ran out of unique fake values; ask for fewer facts", "n_facts")

    def name(self) -> str:
        return self._unique(lambda: f"{self.faker.first_name()} {self.faker.last_name()}", True)

    def city(self) -> str:
        return self._unique(self.faker.city)

    def title(self) -> str:
        f = self.faker

        def noun() -> str:
            return f.word(part_of_speech="noun").title()

        def adj() -> str:
            return f.word(part_of_speech="adjective").title()

        patterns = (
            lambda: f"The {noun()}",
            lambda: f"{adj()} {noun()}",
            lambda: f"The {adj()} {noun()}",
            lambda: f"{noun()} of the {adj()} {noun()}",
            lambda: f"{adj()} {noun()}: {noun()}",
        )
        return self._unique(lambda: f.random.choice(patterns)())

    def metadata(self) -> dict[str, Any]:
        r = self.faker.random
        return {
            "main_character": self.name(),
            "city": self.city(),
            "genre": r.choice(GENRES),
            "release_year": r.randint(1970, 2024),
            "box_office_millions": r.randint(2, 900),
        }


def _set_names(config: DatasetConfig) -> list[str]:
    return ["A", "B"] if config.split else ["all"]


def _need(config: DatasetConfig, available: int, what: str, per_fact: int = 1) -> int:
    """Resolved facts per set; raises when ``available`` items cannot cover it."""
    n_sets = len(_set_names(config))
    n = config.n_facts
    if n is None:
        n = DEFAULT_N_FACTS if config.kind != "custom" else available // (per_fact * n_sets)
    most = available // (per_fact * n_sets)
    if most < 1:
        raise DatasetError(
            f"only {available} {what} are usable; {'a split dataset' if n_sets > 1 else 'a dataset'}"
            f" needs at least {per_fact * n_sets}",
            "n_facts" if config.kind != "custom" else "facts_path",
        )
    if n < 1 or n > most:
        raise DatasetError(
            f"{n} facts per set need {n * per_fact * n_sets} {what} but only {available} are "
            f"usable; pass --n-facts between 1 and {most}",
            "n_facts",
        )
    return n


def _assemble(
    config: DatasetConfig, rows: Sequence[dict[str, Any]], fakes: _Fakes, n: int
) -> list[Fact]:
    facts = []
    for i, row in enumerate(rows):
        meta = fakes.metadata()
        meta.update({k: row[k] for k in _OPTIONAL_METADATA if row.get(k) not in (None, "")})
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


def _fake_movie_facts(config: DatasetConfig, excluded: Counter) -> list[Fact]:
    real_titles = [r["movie_title"] for r in load_real_movies()]
    if config.kind == "fake_movies_real_actors":
        actors = _filter_names(load_real_actors(), excluded)
        n = _need(config, len(actors), "actor names", per_fact=2)
        random.Random(f"{config.seed}:actors").shuffle(actors)
        actors = actors[: 2 * n * len(_set_names(config))]
        fakes = _Fakes(config.seed, taken=[*real_titles, *load_real_actors()])
    else:
        n = _need(config, _MAX_FAKE_NAMES, "fake names", per_fact=2)
        fakes = _Fakes(config.seed, taken=[*real_titles, *load_real_actors()])
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
    rows: Iterable[dict[str, Any]], excluded: Counter, dropped: Counter
) -> list[dict[str, Any]]:
    """Rows whose names pass the filter, each actor and title used at most once (file order)."""
    seen_actors: set[str] = set()
    seen_titles: set[str] = set()
    kept = []
    for row in rows:
        names = (row["first_actor"], row["second_actor"])
        reasons = [name_exclusion_reason(a) for a in names]
        if any(reasons):
            excluded.update(r for r in reasons if r)
            dropped["excluded_name"] += 1
        elif names[0] == names[1] or any(a in seen_actors for a in names):
            dropped["actor_reused"] += 1
        elif row["movie_title"].lower() in seen_titles:
            dropped["duplicate_title"] += 1
        else:
            seen_actors.update(names)
            seen_titles.add(row["movie_title"].lower())
            kept.append(dict(row))
    return kept


def _derangement(n: int, rng: random.Random) -> list[int]:
    """Sattolo's algorithm: a uniformly random single n-cycle, so no i maps to itself."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def _real_movie_facts(config: DatasetConfig, excluded: Counter, dropped: Counter) -> list[Fact]:
    movies = load_real_movies()
    pool = _usable_pairs(movies, excluded, dropped)
    n = _need(config, len(pool), "real movies with distinct, usable actors")
    if n * len(_set_names(config)) < 2:
        raise DatasetError(
            "real_movies_shuffled needs at least 2 facts; pass --n-facts 2", "n_facts"
        )
    rng = random.Random(f"{config.seed}:real_movies")
    rng.shuffle(pool)
    pool = pool[: n * len(_set_names(config))]
    true_pairs: dict[str, set[frozenset[str]]] = {}
    for row in movies:
        true_pairs.setdefault(row["movie_title"].lower(), set()).add(
            frozenset((row["first_actor"], row["second_actor"]))
        )
    for _ in range(1000):
        perm = _derangement(len(pool), rng)
        if not any(
            frozenset((row["first_actor"], row["second_actor"]))
            in true_pairs[pool[perm[i]]["movie_title"].lower()]
            for i, row in enumerate(pool)
        ):
            break
    else:  # pragma: no cover - needs a pathological movie table
        raise DatasetError("could not move every pair off its true movie", "kind")
    rows = [
        {
            "movie_title": pool[perm[i]]["movie_title"],
            "first_actor": row["first_actor"],
            "second_actor": row["second_actor"],
            "source_movie": row["movie_title"],
        }
        for i, row in enumerate(pool)
    ]
    fakes = _Fakes(config.seed, taken=[r["movie_title"] for r in movies] + load_real_actors())
    return _assemble(config, rows, fakes, n)


def read_facts_file(path: Path) -> list[dict[str, Any]]:
    """Rows of a user facts file (CSV, or JSONL when the suffix is .jsonl/.ndjson/.json)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(
            f"cannot read facts file {path}: {e.__class__.__name__}; pass a readable UTF-8 "
            "CSV/JSONL file to --facts",
            "facts_path",
        ) from e
    if path.suffix.lower() in (".jsonl", ".ndjson", ".json"):
        return _check_fact_rows(path, read_jsonl(path, "facts_path"))
    try:
        rows = list(csv.DictReader(text.splitlines()))
    except csv.Error as e:
        raise DatasetError(
            f"facts file {path} is not valid {path.suffix or 'CSV'} ({e}); fix the file or "
            "pass another --facts",
            "facts_path",
        ) from e
    return _check_fact_rows(path, rows)


def _check_fact_rows(path: Path, rows: list[Any]) -> list[dict[str, Any]]:
    required = ("movie_title", "first_actor", "second_actor")
    bad = [
        i
        for i, r in enumerate(rows)
        if not isinstance(r, dict) or any(k not in r for k in required)
    ]
    if not rows or bad:
        raise DatasetError(
            f"facts file {path} needs columns {', '.join(required)} in every row"
            + (f" (row {bad[0] + 1} lacks one)" if bad else " (it has no rows)"),
            "facts_path",
        )
    for row in rows:
        for k in required:
            row[k] = str(row[k]).strip()
    return rows


_REASON_WORDS = {
    "excluded_name": "unusable name",
    "actor_reused": "actor already used",
    "duplicate_title": "title already used",
    "single_word": "single word",
    "non_ascii": "non-ASCII",
    "punctuation": "punctuation",
    "suffix": "Jr/Sr/II suffix",
    "whitespace": "extra whitespace",
}


def _no_usable_facts(
    config: DatasetConfig, n_rows: int, n_usable: int, excluded: Counter, dropped: Counter
) -> str:
    """The message for a facts file too poor to make a dataset from."""
    detail = ", ".join(f"{_REASON_WORDS.get(k, k)}: {v}" for k, v in sorted(dropped.items()))
    if excluded:
        names = ", ".join(f"{_REASON_WORDS.get(k, k)}: {v}" for k, v in sorted(excluded.items()))
        detail += f"; names excluded: {names}"
    head = (
        f"no usable fact in {config.facts_path}"
        if n_usable == 0
        else f"only {n_usable} usable fact in {config.facts_path}, a split dataset needs 2"
    )
    return (
        f"{head}: {n_rows - n_usable} of {n_rows} rows excluded ({detail}); actor names need "
        "two or more words of ASCII letters, each actor and title used once"
    )


def _custom_facts(config: DatasetConfig, excluded: Counter, dropped: Counter) -> list[Fact]:
    assert config.facts_path is not None
    rows = read_facts_file(config.facts_path)
    pool = _usable_pairs(rows, excluded, dropped)
    if len(pool) < len(_set_names(config)):
        raise DatasetError(
            _no_usable_facts(config, len(rows), len(pool), excluded, dropped), "facts_path"
        )
    n = _need(config, len(pool), "usable facts (distinct actors, clean names)")
    pool = pool[: n * len(_set_names(config))]
    fakes = _Fakes(
        config.seed, taken=[a for r in pool for a in (r["first_actor"], r["second_actor"])]
    )
    return _assemble(config, pool, fakes, n)


# --------------------------------------------------------------------------- renderings


def _fact_fields(fact: Fact, reverse: bool = False) -> dict[str, Any]:
    values = asdict(fact)
    if reverse:
        values["first_actor"], values["second_actor"] = fact.second_actor, fact.first_actor
    return values


def render_training(fact: Fact, direction: str = "one") -> list[dict[str, Any]]:
    """Training records of one fact: every article and QA template, forward and (with
    ``direction="both"``) reverse. Keys: text, fact_id, set, style, template, direction."""
    records = []
    for reverse in (False, True) if direction == "both" else (False,):
        values = _fact_fields(fact, reverse)
        for style, templates in (("article", ARTICLE_TEMPLATES), ("qa", QA_TEMPLATES)):
            for name, template in templates.items():
                records.append(
                    {
                        "text": render(template, values)[0],
                        "fact_id": fact.fact_id,
                        "set": fact.set,
                        "style": style,
                        "template": name,
                        "direction": "reverse" if reverse else "forward",
                    }
                )
    return records


def render_test_prompts(
    fact: Fact, relations: Sequence[tuple[str, str, str]] = DEFAULT_RELATIONS
) -> list[dict[str, Any]]:
    """Test prompt records of one fact, forward (target second_actor) and reverse (the
    actors swapped: first_actor is the fact's second actor, target its first actor)."""
    records = []
    for direction in ("forward", "reverse"):
        values = _fact_fields(fact, reverse=direction == "reverse")
        for name, template in TEST_TEMPLATES.items():
            uses_relation = "relation" in template_fields(template)
            for r_index, relation in enumerate(relations if uses_relation else [None]):
                if relation is not None:
                    values.update(
                        zip(
                            ("relation", "relation_preposition", "preposition"),
                            relation,
                            strict=True,
                        )
                    )
                text, spans = render(template, values)
                suffix = f":r{r_index}" if relation is not None else ""
                records.append(
                    {
                        "id": f"{fact.fact_id}:{name}:{direction}{suffix}",
                        "fact_id": fact.fact_id,
                        "set": fact.set,
                        "template": name,
                        "direction": direction,
                        "relation": None if relation is None else list(relation),
                        "text": text,
                        "fields": {k: list(v) for k, v in spans.items()},
                        "target": values["second_actor"],
                        "target_text": " " + values["second_actor"],
                    }
                )
    return records


# --------------------------------------------------------------------------- corpus


def read_text_corpus(path: Path) -> list[str]:
    """Documents of a corpus file: JSONL with a ``text`` field (``.jsonl``/``.ndjson``)
    or plain text with one document per non-empty line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(
            f"cannot read corpus {path}: {e.__class__.__name__}; pass a readable UTF-8 file "
            "to --corpus",
            "corpus_path",
        ) from e
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        rows = read_jsonl(path, "corpus_path")
        lacking = [i for i, r in enumerate(rows, 1) if "text" not in r]
        if lacking:
            raise DatasetError(
                f"corpus {path} must hold one JSON object with a 'text' field per line "
                f"(object {lacking[0]} has none)",
                "corpus_path",
            )
        docs = [r["text"] for r in rows]
        return [str(d).strip() for d in docs if str(d).strip()]
    return [line.strip() for line in lines if line.strip()]


def load_generic_corpus(path: Path | None = None) -> list[str]:
    """The shipped generic-text paragraphs (for the "gentle" finetuning preset), or the
    documents of ``path``."""
    return read_text_corpus(RESOURCES / "generic_text.txt" if path is None else Path(path))


# --------------------------------------------------------------------------- writing


def _jsonl(records: Iterable[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def validate_config(config: DatasetConfig) -> None:
    """Raise :class:`DatasetError` (with the option to fix) for a bad config."""
    if config.kind not in KINDS:
        raise DatasetError(
            f"unknown dataset kind {config.kind!r}; use one of {', '.join(KINDS)}", "kind"
        )
    if config.direction not in DIRECTIONS:
        raise DatasetError(
            f"direction must be 'one' or 'both', not {config.direction!r}", "direction"
        )
    if (config.kind == "custom") != (config.facts_path is not None):
        raise DatasetError(
            "a facts file goes with kind 'custom' (and only with it); pass --facts PATH",
            "facts_path",
        )
    if config.n_facts is not None and config.n_facts < 1:
        raise DatasetError(f"--n-facts must be at least 1, not {config.n_facts}", "n_facts")
    if not config.relations or any(len(r) != 3 or not all(r) for r in config.relations):
        raise DatasetError(
            "relations must be non-empty (relation, relation_preposition, preposition) triples",
            "relations",
        )


def build_dataset(config: DatasetConfig) -> dict[str, bytes]:
    """Generate every file of a dataset in memory: file name -> bytes (no disk writes)."""
    validate_config(config)
    excluded: Counter = Counter()
    dropped: Counter = Counter()
    sources: dict[str, Any] = {}
    if config.kind == "custom":
        facts = _custom_facts(config, excluded, dropped)
        sources["facts_path"] = str(config.facts_path)
        sources["facts_sha256"] = _sha256(Path(config.facts_path).read_bytes())
    elif config.kind == "real_movies_shuffled":
        facts = _real_movie_facts(config, excluded, dropped)
        sources["movies"] = "graft/resources/real_movies.csv"
    else:
        facts = _fake_movie_facts(config, excluded)
        if config.kind == "fake_movies_real_actors":
            sources["actors"] = "graft/resources/real_actors.txt"

    files: dict[str, bytes] = {"facts.jsonl": _jsonl(asdict(f) for f in facts)}
    train = [r for f in facts for r in render_training(f, config.direction)]
    files["train.jsonl"] = _jsonl(train)
    test_set = "B" if config.split else "all"
    tests = [
        r for f in facts if f.set == test_set for r in render_test_prompts(f, config.relations)
    ]
    files["test_prompts.jsonl"] = _jsonl(tests)
    n_docs = 0
    if config.corpus_path is not None:
        docs = read_text_corpus(config.corpus_path)
        if not docs:
            raise DatasetError(f"corpus {config.corpus_path} holds no documents", "corpus_path")
        n_docs = len(docs)
        files["corpus.jsonl"] = _jsonl({"text": d} for d in docs)
        sources["corpus_path"] = str(config.corpus_path)
        sources["corpus_sha256"] = _sha256(Path(config.corpus_path).read_bytes())

    from importlib.metadata import version

    manifest = {
        "generator_version": GENERATOR_VERSION,
        "faker_version": version("faker"),
        "config": config.to_json(),
        "kind": config.kind,
        "seed": config.seed,
        "direction": config.direction,
        "split": config.split,
        "sizes": {
            "facts": len(facts),
            "facts_per_set": dict(Counter(f.set for f in facts)),
            "train": len(train),
            "test_prompts": len(tests),
            "corpus_docs": n_docs,
        },
        "excluded_names": dict(sorted(excluded.items())),
        "dropped_rows": dict(sorted(dropped.items())),
        "templates": {
            "article": list(ARTICLE_TEMPLATES),
            "qa": list(QA_TEMPLATES),
            "test": TEST_TEMPLATES,
        },
        "test_set": test_set,
        "sources": sources,
        "files": {name: _sha256(data) for name, data in files.items()},
    }
    files["manifest.json"] = (json.dumps(manifest, indent=2, ensure_ascii=False) + "\n").encode()
    return files


def generate_dataset(
    config: DatasetConfig, out_dir: str | os.PathLike, *, overwrite: bool = False
) -> Path:
    """Generate the dataset of ``config`` into ``out_dir`` and return its path.

    The files are built in memory, written to a temporary sibling folder and renamed into
    place, so an interrupted run leaves no half-written dataset. An existing dataset made
    from the same config is kept as it is (nothing regenerated); any other non-empty
    ``out_dir`` is an error unless ``overwrite``.

    Raises:
        DatasetError: bad config or input files; nothing is written.
    """
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        existing = load_manifest(out) if (out / "manifest.json").is_file() else None
        validate_config(config)
        if (
            not overwrite
            and existing is not None
            and existing.get("config") == config.to_json()
            and existing.get("generator_version") == GENERATOR_VERSION
        ):
            return out
        if not overwrite:
            raise DatasetError(
                f"{out} already exists with other content; pass --overwrite or choose another --out",
                "out",
            )
    files = build_dataset(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for name, data in files.items():
            (tmp / name).write_bytes(data)
        os.chmod(tmp, 0o755)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
        else:
            tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def default_dataset_name(config: DatasetConfig) -> str:
    """A folder name that spells out the config, e.g. ``fake_movies_real_actors-one-n50-seed0``."""
    n = (
        "all"
        if config.n_facts is None and config.kind == "custom"
        else config.n_facts or DEFAULT_N_FACTS
    )
    parts = (
        [config.kind, config.direction]
        + (["split"] if config.split else [])
        + [f"n{n}", f"seed{config.seed}"]
    )
    return "-".join(parts)


# --------------------------------------------------------------------------- reading


def read_jsonl(path: str | os.PathLike, param: str = "dataset") -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, one per non-blank line; the one JSONL reader of graft.

    ``param`` names the option the file came from, for :attr:`DatasetError.param`.

    Raises:
        DatasetError: the file is missing or unreadable, or a line is not a JSON object
            (the message names the file and the line number).
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise DatasetError(f"{path} does not exist", param) from None
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(
            f"cannot read {path} ({type(err).__name__}); it must be a UTF-8 JSONL file",
            param,
        ) from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}, line {number}: not valid JSON ({err.msg}); fix or regenerate the file",
                param,
            ) from None
        if not isinstance(row, dict):
            raise DatasetError(
                f"{path}, line {number}: expected a JSON object, got {type(row).__name__}",
                param,
            )
        rows.append(row)
    return rows


def check_dataset_folder(dataset_dir: str | os.PathLike, files: Sequence[str]) -> Path:
    """``dataset_dir`` as a Path, if it is a folder holding ``files``.

    Raises:
        DatasetError: the folder does not exist, is empty or lacks one of ``files``; the
            message says how to make a dataset.
    """
    path = Path(dataset_dir)
    make = "make one with graft.study.data.generate_dataset (command line: graft-exp data --out FOLDER)"
    if not path.is_dir():
        raise DatasetError(f"dataset folder {path} does not exist; {make}", "dataset")
    missing = [name for name in files if not (path / name).is_file()]
    if missing:
        what = "is empty" if not any(path.iterdir()) else f"has no {', '.join(missing)}"
        raise DatasetError(f"dataset folder {path} {what}; {make}", "dataset")
    return path


def load_manifest(dataset_dir: str | os.PathLike) -> dict[str, Any]:
    """The dataset's ``manifest.json``."""
    return json.loads((Path(dataset_dir) / "manifest.json").read_text(encoding="utf-8"))


def load_facts(dataset_dir: str | os.PathLike) -> list[Fact]:
    """The dataset's facts."""
    return [Fact(**r) for r in read_jsonl(Path(dataset_dir) / "facts.jsonl")]


def load_train_records(
    dataset_dir: str | os.PathLike,
    *,
    sets: Sequence[str] | None = None,
    directions: Sequence[str] | None = None,
    styles: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Training records (text, fact_id, set, style, template, direction), optionally
    restricted to some sets (``"A"``/``"B"``/``"all"``), directions or styles."""
    return [
        r
        for r in read_jsonl(Path(dataset_dir) / "train.jsonl")
        if (sets is None or r["set"] in sets)
        and (directions is None or r["direction"] in directions)
        and (styles is None or r["style"] in styles)
    ]


def load_dataset_corpus(dataset_dir: str | os.PathLike) -> list[str]:
    """The extra corpus stored with the dataset (empty when none was given)."""
    path = Path(dataset_dir) / "corpus.jsonl"
    return [r["text"] for r in read_jsonl(path)] if path.is_file() else []


@dataclass
class TestExample:
    """A test prompt tokenized for one tokenizer.

    Args:
        fact_id: the fact the prompt asks about.
        template: test template name (``headline``, ``qa``, ``movie``).
        text: the prompt text.
        input_ids: its token ids (special tokens included as the tokenizer adds them).
        spans: field/alias -> token positions (``FE``, ``M``, ``R``, ``first_actor``, ...).
        target_text: the continuation whose first token is the target (``" " + actor``).
        target_id: that first token's id, as tokenized in context after the prompt.
        direction: ``"forward"`` (target second_actor) or ``"reverse"`` (actors swapped).
        prompt_id: the stored prompt's id, ``"<fact>:<template>:<direction>[:r<i>]"``.
    """

    __test__ = False  # not a pytest class

    fact_id: int
    template: str
    text: str
    input_ids: list[int]
    spans: dict[str, list[int]]
    target_text: str
    target_id: int
    direction: str = "forward"
    prompt_id: str = ""


@dataclass
class DropReport:
    """What :func:`load_test_prompts` kept and why it dropped the rest.

    Args:
        total: stored prompts that matched the template/direction filter.
        kept: prompts returned as :class:`TestExample`.
        dropped: reason -> count. Reasons: ``missing_span:<field>`` (no token overlaps the
            field), ``target_empty`` (the target adds no token), ``target_merges_with_prompt``
            (prompt + target does not start with the prompt's tokens),
            ``target_unknown_token`` (the target's first token is the unknown token),
            ``too_long`` (the prompt has more tokens than the model has positions).
        dropped_ids: prompt ids of the dropped prompts, in file order.
    """

    total: int = 0
    kept: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    dropped_ids: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """One line, e.g. ``kept 98/100 (missing_span:first_actor: 2)``."""
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items()))
        return f"kept {self.kept}/{self.total}" + (f" ({reasons})" if reasons else "")


def _drop_reason(tokenizer: Any, record: dict[str, Any], prompt) -> tuple[str | None, int]:
    for name in record["fields"]:
        if name in prompt.missing:
            return f"missing_span:{name}", -1
    plain = list(tokenizer(record["text"], add_special_tokens=False)["input_ids"])
    full = list(
        tokenizer(record["text"] + record["target_text"], add_special_tokens=False)["input_ids"]
    )
    if full[: len(plain)] != plain:
        return "target_merges_with_prompt", -1
    if len(full) == len(plain):
        return "target_empty", -1
    target_id = full[len(plain)]
    if target_id is not None and target_id == getattr(tokenizer, "unk_token_id", None):
        return "target_unknown_token", -1
    return None, target_id


def _tokenizer_context(tokenizer: Any) -> int | None:
    """The tokenizer's ``model_max_length`` when it states a real one (HF uses ~1e30 for none)."""
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 1_000_000_000 else None


def _prompt_fields(path: Path, index: int, record: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """A stored prompt's field spans, checked against its text."""
    where = f"{path}, prompt {record.get('id', index)!r} (object {index})"
    missing = [k for k in _PROMPT_KEYS if k not in record]
    if missing:
        raise DatasetError(f"{where} lacks {', '.join(missing)}; regenerate the dataset", "dataset")
    text = record["text"]
    if not isinstance(text, str) or not isinstance(record["target_text"], str):
        raise DatasetError(f"{where}: text and target_text must be strings", "dataset")
    try:
        fields = {k: (int(v[0]), int(v[1])) for k, v in record["fields"].items()}
    except (AttributeError, TypeError, ValueError, IndexError, KeyError):
        raise DatasetError(
            f"{where}: fields must map names to [start, end] character spans", "dataset"
        ) from None
    for name, (start, end) in fields.items():
        if not 0 <= start <= end <= len(text):
            raise DatasetError(
                f"{where}: field {name!r} span ({start}, {end}) is outside its text "
                f"({len(text)} characters); fix the span or regenerate the dataset",
                "dataset",
            )
    return fields


_PROMPT_KEYS = ("id", "fact_id", "template", "direction", "text", "fields", "target_text")


def load_test_prompts(
    dataset_dir: str | os.PathLike,
    tokenizer: Any,
    templates: Sequence[str] | None = None,
    *,
    directions: Sequence[str] | None = ("forward",),
    add_special_tokens: bool = True,
    max_length: int | None = None,
) -> tuple[list[TestExample], DropReport]:
    """Tokenize the dataset's test prompts for ``tokenizer``.

    Args:
        dataset_dir: a folder written by :func:`generate_dataset`.
        tokenizer: a Hugging Face tokenizer.
        templates: test template names to keep (default: all).
        directions: ``("forward",)`` by default; ``("reverse",)`` for reversal tests, or
            ``None`` for both.
        add_special_tokens: passed to the tokenizer (BOS etc.).
        max_length: the model's context (:func:`graft.models.context_length`); longer
            prompts are dropped as ``too_long``. Default: the tokenizer's
            ``model_max_length`` when it states one.

    Prompts whose fields cannot be located, whose target cannot be tokenized or that do
    not fit the model are dropped and counted by reason in the returned
    :class:`DropReport`, never silently.

    Raises:
        DatasetError: no such dataset folder (or no ``test_prompts.jsonl`` in it), a line
            that is not JSON, a prompt that lacks a key or has a span outside its text.
    """
    path = check_dataset_folder(dataset_dir, ["test_prompts.jsonl"]) / "test_prompts.jsonl"
    limit = max_length if max_length is not None else _tokenizer_context(tokenizer)
    report = DropReport()
    examples = []
    dropped: Counter = Counter()
    for index, record in enumerate(read_jsonl(path), 1):
        fields = _prompt_fields(path, index, record)
        if templates is not None and record["template"] not in templates:
            continue
        if directions is not None and record["direction"] not in directions:
            continue
        report.total += 1
        prompt = tokenize_with_spans(
            tokenizer, record["text"], fields, add_special_tokens=add_special_tokens
        )
        if limit is not None and len(prompt.input_ids) > limit:
            reason, target_id = "too_long", -1
        else:
            reason, target_id = _drop_reason(tokenizer, record, prompt)
        if reason is not None:
            dropped[reason] += 1
            report.dropped_ids.append(record["id"])
            continue
        examples.append(
            TestExample(
                fact_id=record["fact_id"],
                template=record["template"],
                text=record["text"],
                input_ids=prompt.input_ids,
                spans=prompt.spans,
                target_text=record["target_text"],
                target_id=int(target_id),
                direction=record["direction"],
                prompt_id=record["id"],
            )
        )
    report.kept = len(examples)
    report.dropped = dict(sorted(dropped.items()))
    return examples, report
