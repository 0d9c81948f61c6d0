"""Actor and character names: the name filter, the real-actor list and seeded fakes.

Name filter (applied to every actor and main-character name, see
:func:`name_exclusion_reason`): a usable name is two or more space-separated words of ASCII
letters only. Names with non-ASCII letters, punctuation (``A. J. Langer``, ``O'Hara``,
``Day-Lewis``, ``Jr.``), generational suffixes (Jr, Sr, II, III, IV) or a single word are
excluded and counted in the manifest. Such names tokenize differently across tokenizers
(with/without a leading space, byte fallback, a period merged with the next character), which
is what made the paper's code lose examples silently.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from graft.errors import DatasetError
from graft.study.data.files import RESOURCES
from graft.study.specs.templates import GENRES

_SUFFIXES = {"jr", "sr", "ii", "iii", "iv", "v"}


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


def filter_names(names: Iterable[str], excluded: Counter[str]) -> list[str]:
    """The usable ``names`` (input order); counts the others by reason in ``excluded``."""
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


class Fakes:
    """Seeded Faker-backed generator of unique fake names, titles and cities."""

    def __init__(self, seed: int, taken: Iterable[str] = ()):
        from faker import Faker

        self.faker = Faker("en_US")
        self.faker.seed_instance(seed)
        self.taken = {t.lower() for t in taken}
        self.excluded: Counter[str] = Counter()

    def _unique(
        self, make: Callable[[], str], check_name: bool = False, tries: int = 200_000
    ) -> str:
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
