"""A deterministic synthetic world: a fictional encyclopedia plus multi-hop questions about it.

Inputs: a seed and sizes. Outputs: `World(pages, questions)`, written by `write_world` as
`corpus.jsonl` (url, title, contents) and `qa_train.jsonl` / `qa_test.jsonl` (and
`qa_valid.jsonl` where some questions are kept for validation).

Components: `build_graph` invents entities (countries, cities, universities, people, companies,
books) with attributes and functional relations; `render_pages` writes one Markdown page per
entity, linking every related entity; `make_questions` walks relation chains of 1-4 hops from a
named start entity. Everything is invented, so a model cannot answer from memory, and every
random draw comes from a `random.Random` seeded from the seed, so a seed reproduces the bytes.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

BASE_URL = "https://synthpedia.local/wiki/"
KINDS = ("country", "city", "university", "person", "company", "book")
# Share of each kind among the entities; people take what is left.
SHARES = {"country": 0.01, "city": 0.08, "university": 0.04, "company": 0.12, "book": 0.08}
MIN_ENTITIES = 20
LAST_YEAR = 2023


class WorldPage(msgspec.Struct, frozen=True):
    """One encyclopedia page."""

    url: str
    title: str
    contents: str


class WorldQuestion(msgspec.Struct, frozen=True):
    """A question whose unique answer is reached by reading `supporting_urls` in order."""

    id: str
    question: str
    answers: list[str]
    hops: int
    supporting_urls: list[str]
    split: str
    # Its template: the start's kind, the relations followed, what is read last
    # ("person:birthplace.founded_year"); a curriculum groups questions by it (`flat_kinds.py`).
    kind: str = ""


class World(msgspec.Struct):
    """The corpus and its questions."""

    pages: list[WorldPage]
    questions: list[WorldQuestion]


@dataclass(slots=True)
class Entity:
    """A node of the world graph: `rels` are functional (one target each), `back` their inverse."""

    id: int
    kind: str
    name: str
    url: str
    attrs: dict[str, int | str] = field(default_factory=dict)
    rels: dict[str, int] = field(default_factory=dict)
    back: dict[str, list[int]] = field(default_factory=dict)


@dataclass(slots=True)
class WorldGraph:
    """All entities, by id and by kind."""

    entities: list[Entity]
    by_kind: dict[str, list[int]]

    def by_url(self) -> dict[str, Entity]:
        """Entities keyed by page URL."""
        return {entity.url: entity for entity in self.entities}


def page_url(title: str) -> str:
    """The page URL of a title: spaces become underscores."""
    return BASE_URL + title.replace(" ", "_")


# ---------------------------------------------------------------- names

# Plain consonants and vowels dominate so that names stay pronounceable.
ONSETS = "b d f g h k l m n p r s t v z b d k l m n r s t v br dr gr kr tr st th sh".split()
VOWELS = "a e i o u a e i o u a e o ai au ei ou".split()
CODAS = ["", "", "", "", "", "n", "r", "l", "s", "m", "nd"]
CITY_PREFIXES = ["Port ", "New ", "Upper ", "Lower ", "Saint "]
COUNTRY_SUFFIXES = ["ia", "ar", "en", "land", "esh", "ora", "avia"]
LANGUAGE_SUFFIXES = ["ese", "ic", "ish", "ian", "i"]
CURRENCIES = ["crown", "mark", "florin", "thaler", "dinar", "real", "shilling", "lira"]
UNIVERSITY_PATTERNS = [
    "{} University",
    "{} Institute of Technology",
    "{} College",
    "Royal {} Academy",
    "{} Polytechnic",
]
# Industries with the company-name suffixes that fit them; modern ones only after 1950.
INDUSTRIES = {
    "shipbuilding": ["Shipyards", "Marine"],
    "publishing": ["Press", "Books", "Publishing"],
    "textiles": ["Textiles", "Mills"],
    "mining": ["Mining", "Minerals"],
    "food processing": ["Foods", "Provisions"],
    "banking": ["Bank", "Capital"],
    "railways": ["Railways", "Rail"],
    "chemicals": ["Chemicals", "Dyeworks"],
    "brewing": ["Breweries", "Brewing"],
    "construction": ["Builders", "Construction"],
}
MODERN_INDUSTRIES = {
    "software": ["Systems", "Software", "Labs"],
    "pharmaceuticals": ["Pharma", "Laboratories"],
    "aviation": ["Aero", "Aviation"],
    "telecommunications": ["Telecom", "Networks"],
}
OCCUPATIONS = (
    "painter engineer architect chemist novelist composer merchant physician diplomat economist "
    "photographer sculptor astronomer journalist botanist mathematician historian lawyer pilot "
    "inventor"
).split()
GENRES = ["novel", "poetry collection", "memoir", "history", "travelogue", "play", "biography"]
ADJECTIVES = (
    "silent amber hollow distant crimson gentle broken northern quiet burning lost golden hidden "
    "iron pale restless salt winter wandering glass bitter last open narrow velvet copper patient "
    "endless"
).split()
NOUNS = (
    "orchard harbour lantern garden mirror tower archive bridge ledger compass shore map citadel "
    "field engine atlas feather signal window fountain bell clock gate lighthouse mill well "
    "staircase"
).split()
TOPICS = [
    "the tides",
    "early printing",
    "glass making",
    "river navigation",
    "botany",
    "local folklore",
    "railway engineering",
    "astronomy",
    "public health",
    "trade law",
    "music theory",
    "coastal mapping",
    "weaving patterns",
    "soil chemistry",
    "civic architecture",
    "bookbinding",
    "the history of the calendar",
    "mountain surveying",
    "ceramics",
    "cartography",
]
BOOK_PATTERNS = ["The {A} {N}", "The {N} of {R}", "{N}s of {R}", "A {N} in {R}", "{A} {N}s"]


class _Namer:
    """Invents pronounceable names from syllables and never hands out the same name twice."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.taken: set[str] = set()

    def word(self, low: int = 2, high: int = 3) -> str:
        """One capitalised invented word; only the last syllable usually gets a closing coda."""
        count = self.rng.randint(low, high)
        parts = []
        for index in range(count):
            coda = self.rng.choice(CODAS) if index == count - 1 or self.rng.random() < 0.2 else ""
            parts.append(self.rng.choice(ONSETS) + self.rng.choice(VOWELS) + coda)
        return "".join(parts).capitalize()

    def unique(self, make: Callable[[], str]) -> str:
        """Draw from `make` until the name is new."""
        while True:
            name = make()
            if name not in self.taken:
                self.taken.add(name)
                return name

    def person(self) -> str:
        return self.unique(lambda: f"{self.word(2, 2)} {self.word(2, 3)}")

    def city(self) -> str:
        def make() -> str:
            prefix = self.rng.choice(CITY_PREFIXES) if self.rng.random() < 0.1 else ""
            return prefix + self.word(2, 3)

        return self.unique(make)

    def country(self) -> str:
        return self.unique(lambda: self.word(1, 2) + self.rng.choice(COUNTRY_SUFFIXES))

    def university(self) -> str:
        return self.unique(lambda: self.rng.choice(UNIVERSITY_PATTERNS).format(self.word(2, 3)))

    def company(self, suffixes: list[str]) -> str:
        return self.unique(lambda: f"{self.word(2, 3)} {self.rng.choice(suffixes)}")

    def book(self) -> str:
        def make() -> str:
            pattern = self.rng.choice(BOOK_PATTERNS)
            return pattern.format(
                A=self.rng.choice(ADJECTIVES).capitalize(),
                N=self.rng.choice(NOUNS).capitalize(),
                R=self.word(2, 3),
            )

        return self.unique(make)


# ---------------------------------------------------------------- graph


def kind_counts(entities: int) -> dict[str, int]:
    """How many entities of each kind a world of `entities` gets (at least one of each)."""
    if entities < MIN_ENTITIES:
        raise ValueError(f"entities must be at least {MIN_ENTITIES}, got {entities}")
    counts = {kind: max(1, int(entities * share)) for kind, share in SHARES.items()}
    counts["city"] = max(counts["city"], counts["country"])
    counts["person"] = entities - sum(counts.values())
    return counts


class _Builder:
    """Adds entities and relations to a graph in a fixed order, drawing from one rng."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.namer = _Namer(rng)
        self.entities: list[Entity] = []
        self.by_kind: dict[str, list[int]] = {kind: [] for kind in KINDS}

    def add(self, kind: str, name: str, **attrs: int | str) -> Entity:
        entity = Entity(len(self.entities), kind, name, page_url(name), dict(attrs))
        self.entities.append(entity)
        self.by_kind[kind].append(entity.id)
        return entity

    def pick(self, kind: str) -> Entity:
        return self.entities[self.rng.choice(self.by_kind[kind])]

    def pick_where(self, ids: list[int], accept: Callable[[Entity], bool]) -> Entity | None:
        """A random entity among `ids` passing `accept`, after a few tries (keeps it O(1))."""
        for _ in range(8):
            if not ids:
                return None
            candidate = self.entities[self.rng.choice(ids)]
            if accept(candidate):
                return candidate
        return None

    def countries(self, count: int) -> None:
        for _ in range(count):
            name = self.namer.country()
            root = name.rstrip("aeiou")  # Varania -> Varanese, Varan crown
            language = root + self.rng.choice(LANGUAGE_SUFFIXES)
            currency = f"{root} {self.rng.choice(CURRENCIES)}"
            self.add("country", name, language=language, currency=currency)

    def cities(self, count: int) -> None:
        countries = self.by_kind["country"]
        for index in range(count):
            city = self.add(
                "city",
                self.namer.city(),
                population=int(10 ** self.rng.uniform(3.7, 6.8)),
                founded_year=self.rng.randint(700, 1780),
                river=f"{self.namer.unique(lambda: self.namer.word(2, 2))} River",
                elevation=self.rng.randint(2, 2400),
            )
            # The first city of each country is its capital, so every country has one.
            country = countries[index] if index < len(countries) else self.rng.choice(countries)
            city.rels["country"] = country
            self.entities[country].rels.setdefault("capital", city.id)
        # A country holds its cities' people plus a rural population.
        urban = dict.fromkeys(countries, 0)
        for city_id in self.by_kind["city"]:
            city = self.entities[city_id]
            urban[city.rels["country"]] += int(city.attrs["population"])
        for country_id in countries:
            rural = self.rng.randint(200_000, 9_000_000)
            self.entities[country_id].attrs["population"] = urban[country_id] + rural

    def universities(self, count: int) -> None:
        for _ in range(count):
            city = self.pick("city")
            low = max(1100, int(city.attrs["founded_year"]) + 1)
            university = self.add(
                "university",
                self.namer.university(),
                founded_year=self.rng.randint(low, max(low, 1835)),
                students=self.rng.randint(800, 45_000),
            )
            university.rels["home_city"] = city.id

    def people(self, count: int) -> None:
        for _ in range(count):
            born = self.rng.randint(1820, 1995)
            person = self.add(
                "person",
                self.namer.person(),
                birth_year=born,
                occupation=self.rng.choice(OCCUPATIONS),
            )
            if born < 1935:
                person.attrs["death_year"] = min(born + self.rng.randint(45, 95), 2022)
            person.rels["birthplace"] = self.pick("city").id
            person.rels["alma_mater"] = self.pick("university").id

    def marriages(self) -> None:
        """Pair ~60% of people with someone born in about the same year (a symmetric relation)."""
        people = self.by_kind["person"]
        chosen = self.rng.sample(people, int(len(people) * 0.6) // 2 * 2)
        chosen.sort(key=lambda pid: (self.entities[pid].attrs["birth_year"], pid))
        for left, right in zip(chosen[::2], chosen[1::2], strict=True):
            self.entities[left].rels["spouse"] = right
            self.entities[right].rels["spouse"] = left

    def companies(self, count: int) -> None:
        # Distinct founders make "the company founded by X" a function.
        for founder_id in self.rng.sample(self.by_kind["person"], count):
            founder = self.entities[founder_id]
            last = int(founder.attrs.get("death_year", LAST_YEAR))
            year = min(int(founder.attrs["birth_year"]) + self.rng.randint(22, 45), last)
            table = {**INDUSTRIES, **MODERN_INDUSTRIES} if year >= 1950 else INDUSTRIES
            industry = self.rng.choice(sorted(table))
            company = self.add(
                "company",
                self.namer.company(table[industry]),
                founded_year=year,
                industry=industry,
                employees=int(10 ** self.rng.uniform(1.3, 5.2)),
            )
            company.rels["founder"] = founder_id
            company.rels["headquarters"] = self.pick("city").id
            founder.rels["founded"] = company.id

    def employment(self) -> None:
        companies = self.by_kind["company"]
        for person_id in self.by_kind["person"]:
            person = self.entities[person_id]
            if "founded" in person.rels or self.rng.random() < 0.5:
                continue
            last = min(
                int(person.attrs.get("death_year", LAST_YEAR)), person.attrs["birth_year"] + 65
            )
            employer = self.pick_where(
                companies, lambda c, last=last: c.attrs["founded_year"] <= last
            )
            if employer is not None:
                person.rels["employer"] = employer.id

    def books(self, count: int) -> None:
        publishers = [
            c for c in self.by_kind["company"] if self.entities[c].attrs["industry"] == "publishing"
        ]
        for _ in range(count):
            author = self.pick("person")
            last = int(author.attrs.get("death_year", LAST_YEAR))
            year = min(int(author.attrs["birth_year"]) + self.rng.randint(20, 60), last, LAST_YEAR)
            book = self.add(
                "book", self.namer.book(), published_year=year, genre=self.rng.choice(GENRES)
            )
            book.rels["author"] = author.id
            publisher = self.pick_where(
                publishers, lambda c, year=year: c.attrs["founded_year"] <= year
            )
            if publisher is not None:
                book.rels["publisher"] = publisher.id

    def finish(self) -> WorldGraph:
        for entity in self.entities:
            for rel, target in entity.rels.items():
                self.entities[target].back.setdefault(rel, []).append(entity.id)
        return WorldGraph(self.entities, self.by_kind)


def build_graph(seed: int = 0, entities: int = 300) -> WorldGraph:
    """Invent a world of `entities` entities; the same seed gives the same graph."""
    counts = kind_counts(entities)
    builder = _Builder(random.Random(f"{seed}:graph"))
    builder.countries(counts["country"])
    builder.cities(counts["city"])
    builder.universities(counts["university"])
    builder.people(counts["person"])
    builder.marriages()
    builder.companies(counts["company"])
    builder.employment()
    builder.books(counts["book"])
    return builder.finish()


# ---------------------------------------------------------------- pages

# Filler sentences restate nothing checkable beyond the entity's own name and attributes, so they
# cannot contradict the graph; they make pages long enough that chunked browsing matters.
FILLERS = {
    "person": [
        "Contemporaries described {short} as {adj} and {adj2}, a reputation that followed "
        "{short} throughout a career as {a_occupation}.",
        "In {year}, {short} gave a series of talks on {topic} that friends later collected.",
        "Much of {short}'s early work as {a_occupation} dealt with {topic}.",
        "Letters preserved from the {decade}s show {short} corresponding regularly about {topic}.",
        "Later accounts of {short}'s life often emphasise a lasting interest in {topic}.",
        "A portrait of {short} from around {year} shows {a_adj} figure standing beside {a_noun}.",
        "{short} kept detailed notebooks, and one of them, known as the {noun} notebook, "
        "survives from {year}.",
        "Fellow {occupation}s remembered {short} as {adj} in argument but generous with time.",
        "Among {short}'s lesser-known interests was {topic}, pursued mostly in private.",
        "Critics have traced {short}'s {adj} manner back to habits formed in the {decade}s.",
        "Around {year}, {short} travelled widely, keeping a journal that mentions {topic} on "
        "nearly every page.",
    ],
    "city": [
        "Visitors to {name} often remark on its {adj} streets and the old {noun} near the centre.",
        "By {year} the markets of {name} were known for trades connected to {topic}.",
        "Local historians note that the {noun} of {name} was rebuilt in {year} after {a_adj} "
        "winter.",
        "The people of {name} celebrate an annual festival of the {noun} each spring.",
        "In the {decade}s {name} expanded along the banks of the {river}.",
        "Guidebooks describe the old quarter of {name} as {adj} and {adj2}.",
        "A small museum in {name} is devoted to {topic}.",
        "The municipal archive of {name} holds records dating back to {year}.",
    ],
    "country": [
        "Travellers often describe {name} as {adj} and {adj2}.",
        "Schools in {name} have taught {topic} as a compulsory subject since {year}.",
        "The national emblem of {name} shows {a_adj} {noun}.",
        "In the {decade}s {name} went through a period of reform in matters of {topic}.",
        "Folk songs of {name} frequently mention {a_adj} {noun}.",
        "The national archive of {name} keeps a celebrated collection on {topic}.",
    ],
    "university": [
        "The library of {name} holds a large collection on {topic}.",
        "Students at {name} traditionally gather each autumn at the {adj} {noun} on campus.",
        "In {year} {name} opened a new faculty devoted to {topic}.",
        "The main building of {name} is known for its {adj} {noun}, completed in {year}.",
        "Alumni societies of {name} have met every year since the {decade}s.",
        "Lecturers at {name} were described in the {decade}s as {adj} and {adj2}.",
    ],
    "company": [
        "In {year} {name} opened a new division devoted to {topic}.",
        "The logo of {name}, {a_adj} {noun}, dates from the {decade}s.",
        "Analysts have described {name} as {adj} and {adj2} compared with other firms in "
        "{industry}.",
        "During the {decade}s {name} considerably expanded its work in {industry}.",
        "An internal history of {name} published in {year} devotes a chapter to {topic}.",
        "Staff at {name} still speak of the {adj} {noun} that stood in its first workshop.",
    ],
    "book": [
        "Critics praised {name} for its {adj} prose and its treatment of {topic}.",
        "The central image of {name} is {a_adj} {noun} that returns in almost every chapter.",
        "A revised edition of {name} appeared in {year}.",
        "Readers in the {decade}s rediscovered {name} through its passages on {topic}.",
        "Scholars have compared the structure of {name} to {a_noun}.",
    ],
}
MAX_LISTED = 8


def _link(entity: Entity) -> str:
    return f"[{entity.name}]({entity.url})"


def _a(word: object) -> str:
    """'a word' or 'an word' by the first letter (good enough for invented prose)."""
    text = str(word)
    return ("an " if text[0] in "aeiouAEIOU" else "a ") + text


def _join(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass(slots=True)
class _Draft:
    """A page being written: a lead paragraph and sections of fact sentences."""

    lead: list[str]
    sections: list[tuple[str, list[str]]]
    span: tuple[int, int]  # years in which filler events may be placed


class _Renderer:
    """Writes one page per entity; filler draws come from its own rng."""

    def __init__(self, graph: WorldGraph, rng: random.Random, filler: bool = True) -> None:
        self.graph = graph
        self.rng = rng
        self.filler = filler

    def get(self, entity: Entity, rel: str) -> Entity | None:
        target = entity.rels.get(rel)
        return None if target is None else self.graph.entities[target]

    def links(self, entity: Entity, rel: str, skip: int | None = None) -> list[str]:
        ids = [i for i in entity.back.get(rel, []) if i != skip][:MAX_LISTED]
        return [_link(self.graph.entities[i]) for i in ids]

    def page(self, entity: Entity) -> WorldPage:
        draft = getattr(self, f"draft_{entity.kind}")(entity)
        if self.filler:
            self.add_filler(entity, draft)
        parts = [" ".join(draft.lead)]
        for heading, sentences in draft.sections:
            if sentences:
                parts.append(f"## {heading}")
                parts.extend(self.paragraphs(sentences))
        return WorldPage(entity.url, entity.name, "\n\n".join(parts) + "\n")

    def paragraphs(self, sentences: list[str]) -> list[str]:
        out, start = [], 0
        while start < len(sentences):
            end = start + self.rng.randint(2, 5)
            out.append(" ".join(sentences[start:end]))
            start = end
        return out

    def pick(self, items: list[str] | tuple[str, ...]) -> str:
        # One `random()` per draw: `choice`/`randint` dominate the render time at 100k pages.
        return items[int(self.rng.random() * len(items))]

    def add_filler(self, entity: Entity, draft: _Draft) -> None:
        """Scatter filler among the sections, keeping each section's first fact first."""
        roll = self.rng.random()
        count = (
            self.rng.randint(24, 55)
            if roll < 0.1
            else self.rng.randint(8, 18)
            if roll < 0.35
            else self.rng.randint(1, 6)
        )
        templates = FILLERS[entity.kind]
        context = self.base_context(entity)
        low, high = draft.span
        for _ in range(count):
            sentences = draft.sections[int(self.rng.random() * len(draft.sections))][1]
            year = low + int(self.rng.random() * (high - low + 1))
            first, second = self.pick(ADJECTIVES), self.pick(ADJECTIVES)
            if second == first:
                second = ADJECTIVES[ADJECTIVES.index(first) - 1]
            noun = self.pick(NOUNS)
            context.update(
                adj=first,
                adj2=second,
                a_adj=_a(first),
                noun=noun,
                a_noun=_a(noun),
                topic=self.pick(TOPICS),
                year=year,
                decade=year // 10 * 10,
            )
            sentence = self.pick(templates).format_map(context)
            sentences.insert(self.rng.randint(min(1, len(sentences)), len(sentences)), sentence)

    @staticmethod
    def base_context(entity: Entity) -> dict[str, object]:
        """What filler templates may say about an entity: its name and its own attributes."""
        return {
            **entity.attrs,
            "name": entity.name,
            "short": entity.name.split()[-1],
            "a_occupation": _a(entity.attrs.get("occupation", "person")),
        }

    def draft_person(self, person: Entity) -> _Draft:
        name, short, born = person.name, person.name.split()[-1], person.attrs["birth_year"]
        died, job = person.attrs.get("death_year"), person.attrs["occupation"]
        city = _link(self.get(person, "birthplace"))
        lead = (
            f"{name} ({born}–{died}) was {_a(job)} born in {city}."
            if died
            else f"{name} (born {born}) is {_a(job)} born in {city}."
        )
        early = [
            f"{short} was born in {born} in {city}.",
            f"{short} studied at {_link(self.get(person, 'alma_mater'))}.",
        ]
        career = []
        if company := self.get(person, "founded"):
            career.append(
                f"In {company.attrs['founded_year']}, {short} founded {_link(company)}, "
                f"{_a(company.attrs['industry'])} company."
            )
        if employer := self.get(person, "employer"):
            career.append(f"{short} worked for {_link(employer)}.")
        if books := self.links(person, "author"):
            career.append(f"{short} is the author of {_join(books)}.")
        if not career:
            career.append(f"{short} worked as {_a(job)} for most of {short}'s life.")
        spouse = self.get(person, "spouse")
        personal = [f"{short} married {_link(spouse)}." if spouse else f"{short} never married."]
        if died:
            personal.append(f"{short} died in {died}.")
        end = min(int(died or LAST_YEAR), int(born) + 85)
        sections = [("Early life", early), ("Career", career), ("Personal life", personal)]
        return _Draft([lead], sections, (int(born) + 15, max(end, int(born) + 15)))

    def draft_city(self, city: Entity) -> _Draft:
        name, attrs = city.name, city.attrs
        country = self.get(city, "country")
        lead = [
            f"{name} is a city in {_link(country)} with a population of {attrs['population']:,}."
        ]
        if country.rels["capital"] == city.id:
            lead.append(f"{name} is the capital of {_link(country)}.")
        economy = []
        if companies := self.links(city, "headquarters"):
            economy.append(f"Companies headquartered in {name} include {_join(companies)}.")
        if universities := self.links(city, "home_city"):
            economy.append(f"{name} is home to {_join(universities)}.")
        people = self.links(city, "birthplace")
        sections = [
            ("History", [f"{name} was founded in {attrs['founded_year']}."]),
            (
                "Geography",
                [
                    f"{name} lies on the {attrs['river']}, at an elevation of "
                    f"{attrs['elevation']} metres above sea level."
                ],
            ),
            ("Economy and education", economy),
            (
                "Notable people",
                [f"Notable people born in {name} include {_join(people)}."] if people else [],
            ),
        ]
        return _Draft(lead, sections, (int(attrs["founded_year"]), 2020))

    def draft_country(self, country: Entity) -> _Draft:
        name, attrs = country.name, country.attrs
        capital = self.get(country, "capital")
        lead = [
            f"{name} is a country whose capital is {_link(capital)}.",
            f"It has a population of about {attrs['population']:,}.",
        ]
        culture = [
            f"The official language of {name} is {attrs['language']}, and its currency is the "
            f"{attrs['currency']}."
        ]
        cities = self.links(country, "country", skip=capital.id)
        sections = [
            ("Language and currency", culture),
            ("Cities", [f"Other cities in {name} include {_join(cities)}."] if cities else []),
        ]
        return _Draft(lead, sections, (1800, 2020))

    def draft_university(self, university: Entity) -> _Draft:
        name, attrs = university.name, university.attrs
        city = _link(self.get(university, "home_city"))
        lead = [f"{name} is a university in {city}, founded in {attrs['founded_year']}."]
        alumni = self.links(university, "alma_mater")
        sections = [
            ("History", [f"{name} was founded in {attrs['founded_year']} in {city}."]),
            ("Students", [f"{name} enrols about {attrs['students']:,} students."]),
            ("Alumni", [f"Alumni of {name} include {_join(alumni)}."] if alumni else []),
        ]
        return _Draft(lead, sections, (int(attrs["founded_year"]), 2020))

    def draft_company(self, company: Entity) -> _Draft:
        name, attrs = company.name, company.attrs
        city = _link(self.get(company, "headquarters"))
        lead = [f"{name} is {_a(attrs['industry'])} company headquartered in {city}."]
        founder = _link(self.get(company, "founder"))
        operations = [f"{name} employs about {attrs['employees']:,} people."]
        if staff := self.links(company, "employer"):
            operations.append(f"Notable employees of {name} include {_join(staff)}.")
        if books := self.links(company, "publisher"):
            operations.append(f"Books published by {name} include {_join(books)}.")
        sections = [
            ("History", [f"{name} was founded in {attrs['founded_year']} by {founder}."]),
            ("Operations", operations),
        ]
        return _Draft(lead, sections, (int(attrs["founded_year"]), LAST_YEAR))

    def draft_book(self, book: Entity) -> _Draft:
        name, attrs = book.name, book.attrs
        year = attrs["published_year"]
        author = _link(self.get(book, "author"))
        lead = [f"{name} is {_a(attrs['genre'])} by {author}, first published in {year}."]
        publisher = self.get(book, "publisher")
        published = (
            f"{name} was published by {_link(publisher)} in {year}."
            if publisher
            else f"{name} was first published in {year}."
        )
        sections = [("Publication", [published]), ("Reception", [])]
        return _Draft(lead, sections, (int(year), LAST_YEAR))


def render_pages(graph: WorldGraph, seed: int = 0, filler: bool = True) -> list[WorldPage]:
    """One Markdown page per entity, in entity order; related entities are `[Name](url)` links.

    Without `filler` a page holds its facts alone (no anecdotes around them): short pages, for
    a world a small CPU policy can learn to read within minutes.
    """
    renderer = _Renderer(graph, random.Random(f"{seed}:pages"), filler)
    return [renderer.page(entity) for entity in graph.entities]


# ---------------------------------------------------------------- questions

# Every relation is a function (one target per entity), so every chain has exactly one answer.
# relation -> (noun phrase for a chain link, question when it is the last hop)
RELATIONS = {
    "birthplace": ("the birthplace of {x}", "In which city was {x} born?"),
    "alma_mater": ("the university attended by {x}", "Which university did {x} attend?"),
    "spouse": ("the spouse of {x}", "Whom did {x} marry?"),
    "founded": ("the company founded by {x}", "Which company did {x} found?"),
    "employer": ("the employer of {x}", "Which company employed {x}?"),
    "founder": ("the founder of {x}", "Who founded {x}?"),
    "headquarters": ("the headquarters city of {x}", "In which city is {x} headquartered?"),
    "home_city": ("the home city of {x}", "In which city is {x} located?"),
    "country": ("the country containing {x}", "In which country is {x} located?"),
    "capital": ("the capital of {x}", "What is the capital of {x}?"),
    "author": ("the author of {x}", "Who wrote {x}?"),
    "publisher": ("the publisher of {x}", "Which company published {x}?"),
}
# (kind, attribute) -> question when the attribute is the last hop
ATTRIBUTES = {
    ("person", "birth_year"): "In what year was {x} born?",
    ("person", "death_year"): "In what year did {x} die?",
    ("person", "occupation"): "What was the profession of {x}?",
    ("city", "founded_year"): "In what year was {x} founded?",
    ("city", "river"): "On which river does {x} lie?",
    ("country", "language"): "What is the official language of {x}?",
    ("country", "currency"): "What is the currency of {x}?",
    ("university", "founded_year"): "In what year was {x} founded?",
    ("company", "founded_year"): "In what year was {x} founded?",
    ("company", "industry"): "In which industry does {x} operate?",
    ("book", "published_year"): "In what year was {x} first published?",
}
MAX_HOPS = 4
# Start mostly from people, companies and books: every chain drifts towards cities and countries.
START_WEIGHTS = (0.5, 1, 1, 3, 2, 2)  # in KINDS order
TEST_SHARE = 0.2
SPLITS = ("train", "valid", "test")


def id_bucket(question_id: str) -> int:
    """A stable hash of `question_id` into 0..99 (not Python's `hash`, which varies by process)."""
    return int.from_bytes(hashlib.blake2b(question_id.encode(), digest_size=8).digest()) % 100


def split_of(question_id: str, test_share: float = TEST_SHARE) -> str:
    """'test' for about `test_share` of ids (a fifth by default), 'train' otherwise, by a
    stable hash: the held-out split a world's id always lands in, whatever else is kept for
    validation. A larger share holds out every id a smaller one does."""
    return "test" if id_bucket(question_id) < round(test_share * 100) else "train"


def keep_for_validation(questions: list[WorldQuestion], share: float) -> list[WorldQuestion]:
    """`questions` with round(`share` × their number) of the train ones kept for validation,
    `share` of each kind (template) within one: a validation split that asks what the test split
    asks. A hash alone put 8 birth-year questions, which a policy answers well, among 51 in one
    world, so validation rated versions 19 points above the test split. Each kind keeps the whole
    part of its quota, the largest remainders one more; within a kind, the lowest hashes."""
    totals = Counter(q.kind for q in questions)
    train: dict[str, list[int]] = {}
    for index, question in enumerate(questions):
        if question.split == "train":
            train.setdefault(question.kind, []).append(index)
    quota = {kind: share * totals[kind] for kind in train}
    take = {kind: min(len(train[kind]), math.floor(quota[kind])) for kind in train}
    spare = [kind for kind in train if take[kind] < len(train[kind])]
    spare.sort(key=lambda k: (take[k] - quota[k], -totals[k], k))
    for kind in spare[: max(0, round(share * len(questions)) - sum(take.values()))]:
        take[kind] += 1
    kept: set[int] = set()
    for kind, indices in train.items():
        kept.update(sorted(indices, key=lambda i: (id_bucket(questions[i].id), i))[: take[kind]])
    return [msgspec.structs.replace(q, split="valid") if i in kept else q
            for i, q in enumerate(questions)]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Chain:
    """What a question asks, by name: from `start`, follow `steps` (relations), then read
    `final` (a relation or an attribute) of the entity reached."""

    start: str
    steps: tuple[str, ...]
    final: str


def answer_of(graph: WorldGraph, chain: Chain) -> str | None:
    """The answer `chain` has in `graph` (entities found by name), or None where it breaks."""
    entity = next((e for e in graph.entities if e.name == chain.start), None)
    for rel in chain.steps:
        if entity is None or rel not in entity.rels:
            return None
        entity = graph.entities[entity.rels[rel]]
    if entity is None:
        return None
    if chain.final in entity.rels:
        return graph.entities[entity.rels[chain.final]].name
    value = entity.attrs.get(chain.final)
    return None if value is None else str(value)


def _walk(graph: WorldGraph, rng: random.Random, hops: int) -> tuple[WorldQuestion, Chain] | None:
    """A random chain of `hops` reads from a random start, or None at a dead end."""
    kind = rng.choices(KINDS, START_WEIGHTS)[0]
    start = graph.entities[rng.choice(graph.by_kind[kind])]
    path, phrase = [start], start.name
    seen, steps_taken = {start.id}, []
    for _ in range(hops - 1):
        current = path[-1]
        # Never revisit an entity: "the spouse of the spouse of X" is X, a degenerate question.
        steps = [r for r, t in current.rels.items() if t not in seen]
        if not steps:
            return None
        rel = rng.choice(steps)
        steps_taken.append(rel)
        path.append(graph.entities[current.rels[rel]])
        seen.add(path[-1].id)
        phrase = RELATIONS[rel][0].format(x=phrase)
    last = path[-1]
    finals = [("rel", r) for r, t in last.rels.items() if t not in seen]
    finals += [("attr", a) for (k, a) in ATTRIBUTES if k == last.kind and a in last.attrs]
    how, key = rng.choice(finals)
    if how == "rel":
        template, answer = RELATIONS[key][1], graph.entities[last.rels[key]].name
    else:
        template, answer = ATTRIBUTES[(last.kind, key)], str(last.attrs[key])
    chain = Chain(start.name, tuple(steps_taken), key)
    urls = [e.url for e in path]
    asks = f"{kind}:{'.'.join((*steps_taken, key))}"
    return WorldQuestion("", template.format(x=phrase), [answer], hops, urls, "", asks), chain


def make_questions(
    graph: WorldGraph,
    seed: int = 0,
    count: int = 500,
    max_hops: int = MAX_HOPS,
    avoid: WorldGraph | None = None,
    max_answer_share: float | None = None,
    valid_share: float = 0.0,
    test_share: float = TEST_SHARE,
) -> list[WorldQuestion]:
    """`count` distinct questions, hops 1..`max_hops` in turn; fewer only if the world runs out.
    About `test_share` are held out for testing (`split_of`); `valid_share` of all, taken from the
    rest, are kept for validation, that share of each kind (`keep_for_validation`).

    With `avoid` (a world whose names this one borrowed), no question is one that world
    answers the same way: none of its facts is asked with its answer. With
    `max_answer_share`, no question is of a kind whose commonest answer is that of a larger
    share of its chains (`guessing.answer_priors`): none can be answered well without reading.
    """
    if not 1 <= max_hops <= MAX_HOPS:
        raise ValueError(f"max_hops must be within 1..{MAX_HOPS}, got {max_hops}")
    kinds = _KindFilter(graph, max_hops, max_answer_share)
    rng = random.Random(f"{seed}:questions")
    questions: list[WorldQuestion] = []
    seen: set[str] = set()
    attempts = 0
    while len(questions) < count and attempts < 50 * count and kinds.hops:
        attempts += 1
        hops = kinds.hops[len(questions) % len(kinds.hops)]
        walked = _walk(graph, rng, hops)
        if walked is None or walked[0].question in seen:
            kinds.missed(hops)
            continue
        drafted, chain = walked
        if avoid is not None and answer_of(avoid, chain) == drafted.answers[0]:
            continue
        if not kinds.allows(chain):
            kinds.missed(hops)
            continue
        kinds.found()
        seen.add(drafted.question)
        qid = f"synth-{seed}-{len(questions):06d}"
        questions.append(msgspec.structs.replace(drafted, id=qid, split=split_of(qid, test_share)))
    return keep_for_validation(questions, valid_share) if valid_share else questions


class _KindFilter:
    """The kinds of question a world may ask: every kind, or with `max_share` those whose
    commonest answer is that of at most that share of their chains; and the hop counts left
    to ask, 1..`max_hops` in turn."""

    # Draws in a row without a new question before a filtered world's hop count is given up:
    # few kinds may be left at a length, and the turn would otherwise wait there for ever.
    GIVE_UP_AFTER = 2000

    def __init__(self, graph: WorldGraph, max_hops: int, max_share: float | None) -> None:
        self.graph, self.max_share, self.misses = graph, max_share, 0
        self.hops = list(range(1, max_hops + 1))
        self.priors: dict[tuple[str, tuple[str, ...], str], float] = {}
        if max_share is not None:
            from asearcher.consumers.world.guessing import answer_priors

            self.priors = answer_priors(graph, max_hops)
            left = {len(steps) + 1 for (_, steps, _), p in self.priors.items() if p <= max_share}
            self.hops = [hops for hops in self.hops if hops in left]

    def allows(self, chain: Chain) -> bool:
        """Whether `chain`'s question is of a kind the world may ask."""
        if self.max_share is None:
            return True
        from asearcher.consumers.world.guessing import question_kind

        return self.priors[question_kind(self.graph, chain)] <= self.max_share

    def missed(self, hops: int) -> None:
        """A draw at `hops` found no new question; a filtered world gives the count up after
        `GIVE_UP_AFTER` in a row."""
        self.misses += 1
        if self.max_share is not None and self.misses >= self.GIVE_UP_AFTER:
            self.hops.remove(hops)
            self.misses = 0

    def found(self) -> None:
        self.misses = 0


def generate_world(
    seed: int = 0,
    entities: int = 300,
    questions: int = 500,
    *,
    max_hops: int = MAX_HOPS,
    filler: bool = True,
    names_from: int | None = None,
    max_answer_share: float | None = None,
    valid_share: float = 0.0,
    test_share: float = TEST_SHARE,
) -> World:
    """A fictional encyclopedia of `entities` pages and `questions` multi-hop questions over it.

    `max_hops` bounds the chains; without `filler` pages hold only their facts. The defaults
    give the full world; the same seed with other knobs gives the same graph. With
    `names_from`, its entities carry the names of the world of that seed (same size) with
    their facts drawn afresh, and no question asks a fact of that world with its answer. With
    `max_answer_share`, no question is of a kind that guessing answers more often than that.
    About `valid_share` of all questions, taken from would-be train ones, the same share of each
    kind, are kept for validation; about `test_share` (a fifth by default) are held out.
    """
    graph, donor = build_graph(seed, entities), None
    if names_from is not None:
        from asearcher.consumers.world.borrowed_names import borrow_names

        donor = build_graph(names_from, entities)
        graph = borrow_names(graph, donor, random.Random(f"{seed}:names"))
    return World(
        render_pages(graph, seed, filler),
        make_questions(
            graph, seed, questions, max_hops, donor, max_answer_share, valid_share, test_share
        ),
    )


def _write_lines(path: Path, items: Iterable[msgspec.Struct], batch: int = 10_000) -> Path:
    """JSON lines, encoded in batches so a 100k-page corpus never sits in memory twice."""
    encoder = msgspec.json.Encoder()
    items = list(items)
    with path.open("wb") as out:
        for start in range(0, len(items), batch):
            out.write(encoder.encode_lines(items[start : start + batch]))
    return path


def write_world(world: World, out_dir: Path) -> dict[str, Path]:
    """Write `corpus.jsonl`, `qa_train.jsonl`, `qa_test.jsonl` and, where the world keeps
    validation questions, `qa_valid.jsonl`; returns them by stem."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"corpus": _write_lines(out_dir / "corpus.jsonl", world.pages)}
    for split in SPLITS:
        chosen = [q for q in world.questions if q.split == split]
        if chosen or split != "valid":
            files[f"qa_{split}"] = _write_lines(out_dir / f"qa_{split}.jsonl", chosen)
    return files


def read_world_questions(world_dir: Path) -> list[WorldQuestion] | None:
    """The questions `write_world` wrote into `world_dir` (train, validation where there is
    one, then test); None where its QA files are missing or not a synthetic world's (no hops,
    no supporting pages)."""
    decoder = msgspec.json.Decoder(WorldQuestion)
    files = [Path(world_dir) / f"qa_{split}.jsonl" for split in SPLITS]
    try:
        return [
            decoder.decode(line)
            for file in files
            if file.name != "qa_valid.jsonl" or file.is_file()
            for line in file.read_bytes().splitlines()
            if line.strip()
        ]
    except (OSError, msgspec.ValidationError, msgspec.DecodeError):
        return None
