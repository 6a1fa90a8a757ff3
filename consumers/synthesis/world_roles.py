"""Rule-based synthesis roles on the synthetic world: a writer and a checker that read the
knowledge graph, so synthesis is deterministic, runs on CPU, and every answer is provable.

Inputs: a `WorldGraph` (`consumers/world/world.py`). Outputs: `WorldWriter` and `WorldChecker`, the
`Writer` and `Checker` of `consumers/synthesis/roles.py`, for `asearcher.producers.synthesis.agent`.

Components:
- `Plan`, the question as a structure (kept as JSON in `Draft.plan`): a start (a named entity,
  or a description: a kind plus attribute constraints, years perhaps coarsened to a decade), the
  relations followed from it, and the final relation or attribute. `render_question` writes it
  with world.py's templates, `parse_question` reads a rendered question back, `plan_answers`
  gives every answer the graph admits (the ground truth of uniqueness), `chain_facts` the
  statements that support it and `fact_error` whether a statement is true of the graph;
- `WorldWriter`: restates a seed, INJECTs an entity linking to the start (one more hop) and
  FUZZes the start into a description; every choice is a stable hash of the seed id and turn;
- `WorldChecker`: quality against the graph, a simulated closed-book model that knows a fixed
  share of the facts, and uniqueness by `plan_answers`.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

import msgspec

from asearcher.consumers.scoring.reward import exact_match
from asearcher.consumers.synthesis.roles import Action, Draft, RoleFailure
from asearcher.consumers.world.stable_draw import stable_unit
from asearcher.consumers.world.world import ATTRIBUTES, GENRES, RELATIONS, Entity, WorldGraph
from asearcher.streams.wire.events import GateVerdict, SynthEdit, SynthesisRequested, SynthFact


class Constraint(msgspec.Struct, frozen=True):
    """One attribute of a described start; `decade`: `value` is a year's decade (1930)."""

    attr: str
    value: int | str
    decade: bool = False


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """A question as a structure: start, relation path, final relation or attribute."""

    kind: str  # the start's kind
    final: str  # the last step: a key of RELATIONS, or an attribute of the path's end
    start: int = -1  # the start entity (a description's anchor); -1: not known
    where: list[Constraint] = []  # the description of the start; empty: the start is named
    path: list[str] = []  # relations followed from the start, in order
    seed_id: str = ""  # the writer's seed, whose turns it counts
    # What the writer's stable choices hash: the seed's content, not its id (which names the
    # job), so the same seed makes the same question in any job.
    content: str = ""


# ---------------------------------------------------------------- wording

# (kind, attribute) -> clause of a description, in the order clauses are written; "{v}" is the
# value. A book's genre is not a clause: it replaces the noun ("the memoir first published ...").
CLAUSES = {
    ("person", "birth_year"): "born in {v}",
    ("person", "death_year"): "who died in {v}",
    ("person", "occupation"): "who worked as {v}",
    ("city", "founded_year"): "founded in {v}",
    ("city", "river"): "on the {v}",
    ("university", "founded_year"): "founded in {v}",
    ("company", "founded_year"): "founded in {v}",
    ("company", "industry"): "in the {v} industry",
    ("book", "published_year"): "first published in {v}",
    ("country", "language"): "whose official language is {v}",
    ("country", "currency"): "whose currency is the {v}",
}
YEAR_ATTRS = frozenset({"birth_year", "death_year", "founded_year", "published_year"})
# attribute -> noun phrase of a fact stating it ("The year of birth of X is 1935.")
ATTRIBUTE_NOUNS = {
    "birth_year": "year of birth",
    "death_year": "year of death",
    "occupation": "profession",
    "founded_year": "founding year",
    "river": "river",
    "language": "official language",
    "currency": "currency",
    "industry": "industry",
    "published_year": "year of first publication",
    "genre": "genre",
}
# kind -> the attribute sets a FUZZ may describe the start by, most specific first
FUZZ_ATTRS: dict[str, list[tuple[str, ...]]] = {
    "person": [("birth_year", "occupation"), ("birth_year",), ("occupation", "death_year")],
    "book": [("published_year", "genre"), ("published_year",)],
    "company": [("founded_year", "industry"), ("founded_year",)],
    "city": [("founded_year",), ("river",)],
    "university": [("founded_year",)],
    "country": [("language",), ("currency",)],
}
_YEAR = r"(?:\d+|the \d+0s)"
_VALUE = {"occupation": r"an? (?P<occupation>[a-z ]+?)", "river": r"(?P<river>.+? River)"}


def _article(word: str) -> str:
    return ("an " if word[:1] in "aeiouAEIOU" else "a ") + word


def _value_text(attr: str, value: int | str, decade: bool) -> str:
    if decade:
        return f"the {value}s"
    return _article(str(value)) if attr == "occupation" else str(value)


def _noun(kind: str, where: Sequence[Constraint]) -> str:
    genre = next((c.value for c in where if c.attr == "genre"), None)
    return str(genre) if genre is not None else kind


def _description(kind: str, where: Sequence[Constraint]) -> str:
    """The description's words without an article: "person born in the 1930s who worked as..."."""
    values = {c.attr: c for c in where}
    clauses = [
        template.format(v=_value_text(attr, values[attr].value, values[attr].decade))
        for (clause_kind, attr), template in CLAUSES.items()
        if clause_kind == kind and attr in values
    ]
    return " ".join([_noun(kind, where), *clauses])


def _clause_pattern(kind: str) -> re.Pattern[str]:
    """Every clause of `kind`, each optional, in CLAUSES order, up to the end of the text."""
    parts = []
    for (clause_kind, attr), template in CLAUSES.items():
        if clause_kind != kind:
            continue
        value = f"(?P<{attr}>{_YEAR})" if attr in YEAR_ATTRS else _VALUE.get(attr)
        before, after = template.split("{v}")
        parts.append(f"(?: {re.escape(before)}{value or f'(?P<{attr}>.+?)'}{re.escape(after)})?")
    return re.compile("".join(parts) + "$")


_PATTERNS = {kind: _clause_pattern(kind) for kind in FUZZ_ATTRS}


def _constraint(attr: str, text: str) -> Constraint:
    if attr not in YEAR_ATTRS:
        return Constraint(attr, text)
    if text.startswith("the "):
        return Constraint(attr, int(text[4:-1]), decade=True)
    return Constraint(attr, int(text))


def parse_description(text: str) -> tuple[str, list[Constraint]] | None:
    """(kind, constraints) of a description such as "the book first published in 1987"."""
    if not text.startswith("the "):
        return None
    rest = text[4:]
    nouns = [(genre, "book") for genre in GENRES] + [(kind, kind) for kind in FUZZ_ATTRS]
    for noun, kind in sorted(nouns, key=lambda pair: -len(pair[0])):
        if rest != noun and not rest.startswith(noun + " "):
            continue
        match = _PATTERNS[kind].match(rest, len(noun))
        if match is None:
            continue
        where = [Constraint("genre", noun)] if noun != kind else []
        where += [_constraint(a, v) for a, v in match.groupdict().items() if v is not None]
        if where:
            return kind, where
    return None


def target_kind(graph: WorldGraph, kind: str, rel: str) -> str | None:
    """The kind `rel` leads to from an entity of `kind`; None when no such entity has `rel`."""
    # Relations are typed by the world's builder; the first entity having one tells its target
    # kind (usually the first entity of the kind, so this stays O(1) on a 100k-entity world).
    for entity_id in graph.by_kind.get(kind, []):
        target = graph.entities[entity_id].rels.get(rel)
        if target is not None:
            return graph.entities[target].kind
    return None


def end_kind(graph: WorldGraph, plan: Plan) -> str | None:
    """The kind the plan's path ends at; None when a step does not apply to the kind before it."""
    kind: str | None = plan.kind
    for rel in plan.path:
        kind = target_kind(graph, kind, rel) if kind else None
    return kind


def start_phrase(graph: WorldGraph, plan: Plan) -> str:
    """The start as the question names it: an entity's name, or "the <description>"."""
    if plan.where:
        return "the " + _description(plan.kind, plan.where)
    if not 0 <= plan.start < len(graph.entities):
        raise ValueError(f"the plan names no entity of the world (start {plan.start})")
    return graph.entities[plan.start].name


def render_question(graph: WorldGraph, plan: Plan) -> str:
    """The question text of `plan`, in world.py's templates; ValueError for a broken plan."""
    unknown = [rel for rel in plan.path if rel not in RELATIONS]
    if unknown:
        raise ValueError(f"unknown relations {unknown}")
    phrase = start_phrase(graph, plan)
    for rel in plan.path:
        phrase = RELATIONS[rel][0].format(x=phrase)
    if plan.final in RELATIONS:
        return RELATIONS[plan.final][1].format(x=phrase)
    template = ATTRIBUTES.get((end_kind(graph, plan) or "", plan.final))
    if template is None:
        raise ValueError(f"no question asks for {plan.final!r} at the end of {plan.path}")
    return template.format(x=phrase)


# ---------------------------------------------------------------- parsing


def _finals() -> list[tuple[str, str]]:
    """(final step, question template) for every relation and attribute question."""
    finals = [(rel, question) for rel, (_, question) in RELATIONS.items()]
    return finals + [(attr, question) for (_, attr), question in ATTRIBUTES.items()]


def _peel_path(phrase: str) -> tuple[list[str], str]:
    """The relations wrapped around a start phrase ("the author of X" -> [author], "X")."""
    outer: list[str] = []
    prefixes = {rel: noun.split("{x}")[0] for rel, (noun, _) in RELATIONS.items()}
    peeled = True
    while peeled:
        peeled = False
        for rel, prefix in prefixes.items():
            if phrase.startswith(prefix):
                outer.append(rel)
                phrase, peeled = phrase[len(prefix) :], True
                break
    return outer[::-1], phrase


def _start_plan(
    graph: WorldGraph, names: Mapping[str, int], phrase: str, final: str
) -> Plan | None:
    path, start = _peel_path(phrase)
    if start in names:
        entity = graph.entities[names[start]]
        return Plan(kind=entity.kind, start=entity.id, path=path, final=final)
    described = parse_description(start)
    if described is None:
        return None
    return Plan(kind=described[0], where=described[1], path=path, final=final)


def _consistent(graph: WorldGraph, plan: Plan) -> bool:
    """Whether every step of `plan` applies to the kind it reaches."""
    kind = end_kind(graph, plan)
    if kind is None:
        return False
    if plan.final in RELATIONS:
        return target_kind(graph, kind, plan.final) is not None
    return (kind, plan.final) in ATTRIBUTES


def entity_names(graph: WorldGraph) -> dict[str, int]:
    """Entity ids by name (names are unique in a world)."""
    return {entity.name: entity.id for entity in graph.entities}


def parse_question(
    graph: WorldGraph, text: str, key: str = "writer.base", names: Mapping[str, int] | None = None
) -> Plan:
    """The plan `text` renders, inverting the templates; `RoleFailure(key)` when none does.
    `names`: `entity_names(graph)`, to save building it per call."""
    names = entity_names(graph) if names is None else names
    for final, template in _finals():
        before, after = template.split("{x}")
        if not (text.startswith(before) and text.endswith(after)):
            continue
        phrase = text[len(before) : len(text) - len(after)]
        plan = _start_plan(graph, names, phrase, final) if phrase else None
        if plan and _consistent(graph, plan) and render_question(graph, plan) == text:
            return plan
    raise RoleFailure(key, f"not a question of the world: {text!r}")


def encode_plan(plan: Plan) -> str:
    """`plan` as JSON text, for `Draft.plan`."""
    return msgspec.json.encode(plan).decode()


def decode_plan(text: str, key: str) -> Plan:
    """The plan in `Draft.plan`; `RoleFailure(key)` when it is not one."""
    try:
        return msgspec.json.decode(text, type=Plan)
    except msgspec.DecodeError as error:
        raise RoleFailure(key, f"no plan in the draft: {error}") from error


# ---------------------------------------------------------------- answers and facts


def matches(entity: Entity, kind: str, where: Sequence[Constraint]) -> bool:
    """Whether `entity` fits the description (`kind`, `where`)."""
    if entity.kind != kind:
        return False
    for constraint in where:
        value = entity.attrs.get(constraint.attr)
        if value is None:
            return False
        if constraint.decade and int(value) // 10 * 10 != constraint.value:
            return False
        if not constraint.decade and value != constraint.value:
            return False
    return True


def plan_starts(graph: WorldGraph, plan: Plan) -> list[Entity]:
    """Every entity the plan's start may be: the named one, or each one fitting the description."""
    if not plan.where:
        return [graph.entities[plan.start]] if 0 <= plan.start < len(graph.entities) else []
    return [
        graph.entities[i]
        for i in graph.by_kind.get(plan.kind, [])
        if matches(graph.entities[i], plan.kind, plan.where)
    ]


def follow(graph: WorldGraph, start: Entity, plan: Plan) -> str | None:
    """The answer reached from `start` along the plan; None where a relation is missing."""
    entity = start
    for rel in [*plan.path, plan.final] if plan.final in RELATIONS else plan.path:
        target = entity.rels.get(rel)
        if target is None:
            return None
        entity = graph.entities[target]
    if plan.final in RELATIONS:
        return entity.name
    value = entity.attrs.get(plan.final)
    return None if value is None else str(value)


def plan_answers(graph: WorldGraph, plan: Plan) -> set[str]:
    """Every answer the graph admits for `plan`: one per start fitting it, where the chain holds."""
    answers = (follow(graph, start, plan) for start in plan_starts(graph, plan))
    return {answer for answer in answers if answer is not None}


def same_answer(answer: str, gold: str) -> bool:
    """SQuAD-normalised equality, as the synthesis loop compares answers."""
    return exact_match(answer, [gold]) == 1.0


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def relation_fact(subject: Entity, rel: str, target: Entity) -> SynthFact:
    """ "The author of Hidden Feathers is Trigrand Vivaton.", on the subject's page."""
    statement = f"{_capital(RELATIONS[rel][0].format(x=subject.name))} is {target.name}."
    return SynthFact(statement=statement, url=subject.url)


def attribute_fact(subject: Entity, attr: str) -> SynthFact:
    """ "The year of birth of X is 1935.", on the subject's page."""
    statement = f"The {ATTRIBUTE_NOUNS[attr]} of {subject.name} is {subject.attrs[attr]}."
    return SynthFact(statement=statement, url=subject.url)


def description_fact(subject: Entity, attrs: Sequence[str]) -> SynthFact:
    """ "Hidden Feathers is a memoir first published in 1987.": the exact values of `attrs`."""
    where = [Constraint(attr, subject.attrs[attr]) for attr in attrs]
    statement = f"{subject.name} is {_article(_description(subject.kind, where))}."
    return SynthFact(statement=statement, url=subject.url)


def chain_facts(graph: WorldGraph, start: Entity, plan: Plan) -> list[SynthFact] | None:
    """The statements leading from `start` to its answer (a description's first); None where
    the chain breaks."""
    facts = [description_fact(start, [c.attr for c in plan.where])] if plan.where else []
    entity = start
    for rel in [*plan.path, plan.final] if plan.final in RELATIONS else plan.path:
        target = entity.rels.get(rel)
        if target is None:
            return None
        facts.append(relation_fact(entity, rel, graph.entities[target]))
        entity = graph.entities[target]
    if plan.final not in RELATIONS:
        if plan.final not in entity.attrs:
            return None
        facts.append(attribute_fact(entity, plan.final))
    return facts


def _subject(
    graph: WorldGraph, names: Mapping[str, int], text: str, prefix: str = ""
) -> Entity | None:
    """The entity `text` names after `prefix`, if it does."""
    if not text.startswith(prefix) or text[len(prefix) :] not in names:
        return None
    return graph.entities[names[text[len(prefix) :]]]


def _true_readings(graph: WorldGraph, names: Mapping[str, int], statement: str) -> list[SynthFact]:
    """The true fact about the subject of each way of reading `statement` ("The <relation or
    attribute> of <name> is ..." or "<name> is a <description>.")."""
    readings = []
    body = statement.removesuffix(".")
    for cut in (match.start() for match in re.finditer(" is ", body)):
        left = body[:cut]
        for rel, (noun, _) in RELATIONS.items():
            subject = _subject(graph, names, left, _capital(noun.split("{x}")[0]))
            if subject is not None and rel in subject.rels:
                target = graph.entities[subject.rels[rel]]
                readings.append(relation_fact(subject, rel, target))
        for attr, noun in ATTRIBUTE_NOUNS.items():
            subject = _subject(graph, names, left, f"The {noun} of ")
            if subject is not None and attr in subject.attrs:
                readings.append(attribute_fact(subject, attr))
        readings += _description_reading(_subject(graph, names, left), body[cut + 4 :])
    return readings


def _description_reading(subject: Entity | None, described: str) -> list[SynthFact]:
    article, _, words = described.partition(" ")
    parsed = parse_description("the " + words) if article in ("a", "an") else None
    if subject is None or parsed is None or not matches(subject, *parsed):
        return []
    statement = f"{subject.name} is {_article(_description(*parsed))}."
    return [SynthFact(statement=statement, url=subject.url)]


def fact_error(graph: WorldGraph, fact: SynthFact, names: Mapping[str, int] | None = None) -> str:
    """Why `fact` is not a true statement of the graph read on its subject's page; "" if it is.
    `names`: `entity_names(graph)`, to save building it per call."""
    names = entity_names(graph) if names is None else names
    readings = _true_readings(graph, names, fact.statement)
    if not any(true.statement == fact.statement for true in readings):
        return f"false fact: {fact.statement!r}"
    if fact not in readings:
        return f"fact {fact.statement!r} is not on {fact.url}"
    return ""


# ---------------------------------------------------------------- stable choices

T = TypeVar("T")


def seed_content(seed: SynthesisRequested) -> str:
    """A digest of what `seed` asks (its page, or its question and answer)."""
    text = seed.page_url or f"{seed.question}\0{seed.answer}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _pick(items: Sequence[T], *parts: object) -> T:
    return items[int(stable_unit(*parts) * len(items))]


# ---------------------------------------------------------------- writer

FUZZ_EARLY = 0.25  # share of turns that fuzz a grown chain although it could still grow
EXIT_SHARE = 0.5  # share of turns that exit once a long enough question was accepted
EXIT_HOPS = 3
MAX_TRACKED_SEEDS = 10_000


class WorldWriter:
    """The rule-based writer: grows the chain at its start (INJECT), then obscures the start
    (FUZZ). A FUZZ alone never makes a question need another page, so the writer fuzzes only a
    chain it has grown; a seed whose start no page links to cannot be made harder."""

    def __init__(self, graph: WorldGraph, seed: int = 0, max_hops: int = 4) -> None:
        self.graph, self.seed, self.max_hops = graph, seed, max_hops
        self.by_url, self.names = graph.by_url(), entity_names(graph)
        # Turns since `base` per seed: a draft given back after a rejection is chosen on anew.
        self.turns: dict[str, int] = {}

    def _start_turns(self, seed_id: str) -> None:
        self.turns.pop(seed_id, None)
        self.turns[seed_id] = 0
        if len(self.turns) > MAX_TRACKED_SEEDS:  # a long-running service: forget the oldest
            del self.turns[next(iter(self.turns))]

    async def base(self, seed: SynthesisRequested, page: str | None) -> Draft:
        """The seed's question restated with its facts, or a one-hop question about the entity
        of `seed.page_url` (whose text is `page`)."""
        self._start_turns(seed.seed_id)
        if seed.page_url:
            plan, answer = self._page_plan(seed, page), ""
        else:
            plan, answer = self._seed_plan(seed), seed.answer
        start = self.graph.entities[plan.start]
        facts = chain_facts(self.graph, start, plan)
        if facts is None:
            raise RoleFailure("writer.base", f"the chain from {start.name} breaks in the graph")
        question = render_question(self.graph, plan)
        answer = answer or str(follow(self.graph, start, plan))
        edit = SynthEdit(action="base", question=question, facts=facts)
        return Draft(
            question=question, answer=answer, facts=facts, edits=[edit], plan=encode_plan(plan)
        )

    def _seed_plan(self, seed: SynthesisRequested) -> Plan:
        plan = parse_question(self.graph, seed.question, names=self.names)
        starts = plan_starts(self.graph, plan)
        # A described seed: anchor on a start that gives the seed's answer, if one does.
        fitting = [s for s in starts if same_answer(follow(self.graph, s, plan) or "", seed.answer)]
        if not (fitting or starts):
            raise RoleFailure("writer.base", f"nothing in the world fits {seed.question!r}")
        start = (fitting or starts)[0]
        return msgspec.structs.replace(
            plan, start=start.id, seed_id=seed.seed_id, content=seed_content(seed)
        )

    def _page_plan(self, seed: SynthesisRequested, page: str | None) -> Plan:
        entity = self.by_url.get(seed.page_url)
        if entity is None:
            raise RoleFailure("writer.base", f"no entity has the page {seed.page_url}")
        if page is None or entity.name not in page:
            raise RoleFailure("writer.base", f"could not read about {entity.name} on its page")
        finals = sorted(entity.rels) + sorted(
            attr for kind, attr in ATTRIBUTES if kind == entity.kind and attr in entity.attrs
        )
        content = seed_content(seed)
        final = _pick(finals, self.seed, content, "base")
        return Plan(
            kind=entity.kind, start=entity.id, final=final, seed_id=seed.seed_id, content=content
        )

    async def choose(self, draft: Draft, may_exit: bool) -> Action:
        """INJECT while the named start can grow the chain, then FUZZ; EXIT once allowed and the
        question is long (or nothing is left to do)."""
        plan = decode_plan(draft.plan, "writer.choose")
        turn = self.turns.get(plan.seed_id, 0)
        self.turns[plan.seed_id] = turn + 1
        roll = stable_unit(self.seed, plan.content, len(draft.edits), turn, "choose")
        grown = any(edit.action == "inject" for edit in draft.edits)
        can_inject = self._can_inject(plan)
        can_fuzz = grown and bool(self._fuzz_options(plan))
        long_enough = len(plan.path) + 1 >= EXIT_HOPS and roll < EXIT_SHARE
        if may_exit and (long_enough or not (can_inject or can_fuzz)):
            return "exit"
        early = stable_unit(self.seed, plan.content, len(draft.edits), turn, "early")
        if can_fuzz and (not can_inject or early < FUZZ_EARLY):
            return "fuzz"
        return "inject"  # when nothing can be done, `pick_link` says why

    def _chain(self, plan: Plan) -> set[int]:
        """The entities the named chain passes through, its final target included."""
        entity, seen = self.graph.entities[plan.start], {plan.start}
        for rel in [*plan.path, plan.final] if plan.final in RELATIONS else plan.path:
            if rel not in entity.rels:
                break
            entity = self.graph.entities[entity.rels[rel]]
            seen.add(entity.id)
        return seen

    def _links(self, plan: Plan) -> list[tuple[int, str]]:
        """(entity, relation) pairs linking to the named start from off the chain, sorted."""
        if plan.where or plan.start < 0:
            return []
        chain, start = self._chain(plan), self.graph.entities[plan.start]
        return sorted((z, rel) for rel, ids in start.back.items() for z in ids if z not in chain)

    def _can_inject(self, plan: Plan) -> bool:
        return len(plan.path) + 1 < self.max_hops and bool(self._links(plan))

    async def pick_link(self, draft: Draft) -> str:
        """The page of an entity whose relation points at the named start, off the chain."""
        plan = decode_plan(draft.plan, "writer.inject")
        if plan.where:
            raise RoleFailure("writer.inject", "the start is described: no entity to link from")
        if len(plan.path) + 1 >= self.max_hops:
            raise RoleFailure("writer.inject", f"the chain already has {self.max_hops} hops")
        links = self._links(plan)
        if not links:
            name = self.graph.entities[plan.start].name
            raise RoleFailure("writer.inject", f"no page off the chain links to {name}")
        linking = sorted({z for z, _ in links})
        turn = self.turns.get(plan.seed_id, 0)
        chosen = _pick(linking, self.seed, plan.content, len(draft.edits), turn, "link")
        return self.graph.entities[chosen].url

    async def inject(self, draft: Draft, url: str, page: str | None) -> Draft:
        """`draft` starting one hop earlier, at the entity of `url` that links to its start."""
        plan = decode_plan(draft.plan, "writer.inject")
        old, new = self._linking(plan, url, page)
        rel = next(r for z, r in self._links(plan) if z == new.id)
        grown = msgspec.structs.replace(plan, kind=new.kind, start=new.id, path=[rel, *plan.path])
        question = render_question(self.graph, grown)
        fact = relation_fact(new, rel, old)
        detail = f"{old.name} -> {RELATIONS[rel][0].format(x=new.name)}"
        edit = SynthEdit(action="inject", question=question, detail=detail, facts=[fact])
        return Draft(
            question=question,
            answer=draft.answer,
            facts=[fact, *draft.facts],
            edits=[*draft.edits, edit],
            plan=encode_plan(grown),
        )

    def _linking(self, plan: Plan, url: str, page: str | None) -> tuple[Entity, Entity]:
        """(the start, the entity at `url`), once the page was read and links to the start."""
        if plan.where or plan.start < 0:
            raise RoleFailure("writer.inject", "the start is described: no entity to link from")
        old, new = self.graph.entities[plan.start], self.by_url.get(url)
        if page is None:
            raise RoleFailure("writer.inject", f"could not read {url}")
        if old.name not in page:
            raise RoleFailure("writer.inject", f"{url} does not mention {old.name}")
        if new is None or all(z != new.id for z, _ in self._links(plan)):
            raise RoleFailure(
                "writer.inject", f"{url} is no entity off the chain linking to {old.name}"
            )
        return old, new

    def _fuzz_options(self, plan: Plan) -> list[tuple[str, ...]]:
        """Attribute sets to describe a named start by, or the years a description can coarsen."""
        if plan.where:
            return [(c.attr,) for c in plan.where if c.attr in YEAR_ATTRS and not c.decade]
        if plan.start < 0:
            return []
        start = self.graph.entities[plan.start]
        return [
            attrs
            for attrs in FUZZ_ATTRS.get(start.kind, [])
            if all(a in start.attrs for a in attrs)
            # Describing the start by the attribute asked about would give the answer away.
            and not (not plan.path and plan.final in attrs)
        ]

    async def fuzz(self, draft: Draft) -> Draft:
        """`draft` with its named start described, or a year of its description coarsened."""
        plan = decode_plan(draft.plan, "writer.fuzz")
        options = self._fuzz_options(plan)
        if not options:
            raise RoleFailure("writer.fuzz", "no detail of the start is left to obscure")
        turn = self.turns.get(plan.seed_id, 0)
        attrs = _pick(options, self.seed, plan.content, len(draft.edits), turn, "fuzz")
        if plan.where:
            return self._coarsen(draft, plan, attrs[0])
        start = self.graph.entities[plan.start]
        where = [Constraint(attr, start.attrs[attr]) for attr in attrs]
        fuzzed = msgspec.structs.replace(plan, where=where)
        fact = description_fact(start, attrs)
        detail = f"{start.name} -> {start_phrase(self.graph, fuzzed)}"
        return self._edited(draft, fuzzed, detail, [fact])

    def _coarsen(self, draft: Draft, plan: Plan, attr: str) -> Draft:
        where = [
            Constraint(c.attr, int(c.value) // 10 * 10, True) if c.attr == attr else c
            for c in plan.where
        ]
        old = next(c.value for c in plan.where if c.attr == attr)
        fuzzed = msgspec.structs.replace(plan, where=where)
        return self._edited(draft, fuzzed, f"{old} -> the {int(old) // 10 * 10}s", [])

    def _edited(self, draft: Draft, plan: Plan, detail: str, facts: list[SynthFact]) -> Draft:
        question = render_question(self.graph, plan)
        edit = SynthEdit(action="fuzz", question=question, detail=detail, facts=facts)
        return Draft(
            question=question,
            answer=draft.answer,
            facts=[*facts, *draft.facts],
            edits=[*draft.edits, edit],
            plan=encode_plan(plan),
        )


# ---------------------------------------------------------------- checker

# A conjunction followed by a question word: two questions joined into one sentence.
_JOINED = re.compile(
    r"(?:\band|\bor|\bbut|[,;])\s+(?:(?:in|on|at|for|by|from|of|to|with)\s+)?"
    r"(?:who|whom|whose|what|which|where|when|why|how)\b",
    re.IGNORECASE,
)


def question_count_error(question: str) -> str:
    """Why `question` is not exactly one question; "" if it is."""
    if question.count("?") != 1 or not question.rstrip().endswith("?"):
        return f"not exactly one question: {question.count('?')} question marks"
    if _JOINED.search(question):
        return "two questions joined into one"
    return ""


class WorldChecker:
    """The rule-based checker: quality and uniqueness proved on the graph, difficulty by a
    simulated closed-book model that knows a fixed `known_share` of the facts."""

    def __init__(self, graph: WorldGraph, seed: int = 0, known_share: float = 0.5) -> None:
        self.graph, self.seed, self.known_share = graph, seed, known_share
        self.names = entity_names(graph)
        self.values: dict[tuple[str, str], list[str]] = {}

    def _plan(self, draft: Draft, key: str) -> Plan:
        if draft.plan:
            return decode_plan(draft.plan, key)
        return parse_question(self.graph, draft.question, key, self.names)

    async def quality(self, draft: Draft) -> GateVerdict:
        """One question, the rendering of its plan, true facts chaining from the start to the
        answer, and the answer among those the graph admits."""
        try:
            plan = self._plan(draft, "checker.quality")
        except RoleFailure as failure:
            return GateVerdict(gate="quality", passed=False, reason=failure.reason)
        try:
            rendered = render_question(self.graph, plan)
        except ValueError as error:
            return GateVerdict(gate="quality", passed=False, reason=f"broken plan: {error}")
        reasons = [question_count_error(draft.question)]
        if rendered != draft.question:
            reasons.append("the question is not the rendering of its plan")
        reasons += [fact_error(self.graph, fact, self.names) for fact in draft.facts]
        reasons += [self._chain_error(draft, plan), self._answer_error(draft, plan)]
        reasons = [reason for reason in reasons if reason]
        return GateVerdict(gate="quality", passed=not reasons, reason="; ".join(reasons))

    def _chain_error(self, draft: Draft, plan: Plan) -> str:
        stated = {fact.statement for fact in draft.facts}
        for start in plan_starts(self.graph, plan):
            needed = chain_facts(self.graph, start, plan)
            if needed is not None and all(fact.statement in stated for fact in needed):
                return ""
        return "the facts do not chain from the start to an answer"

    def _answer_error(self, draft: Draft, plan: Plan) -> str:
        answers = plan_answers(self.graph, plan)
        if any(same_answer(draft.answer, answer) for answer in answers):
            return ""
        return f"wrong answer: {draft.answer!r} (the graph gives {sorted(answers)})"

    def knows(self, entity: Entity, key: str) -> bool:
        """Whether the closed-book model knows `key` (a relation or attribute) of `entity`."""
        return stable_unit(self.seed, "knows", entity.id, key) < self.known_share

    async def answer_without_tools(self, question: str, attempt: int) -> str:
        """The closed-book model's answer: a random entity fitting a described start, then the
        facts it knows, a random guess of the right kind where it does not."""
        plan = parse_question(self.graph, question, "checker.answer", self.names)
        rng = random.Random(f"{self.seed}:{question}:{attempt}")
        starts = plan_starts(self.graph, plan)
        entity = rng.choice(starts) if starts else self._guess(plan.kind, rng)
        for rel in plan.path:
            entity = self._recall(entity, rel, rng)
        if plan.final in RELATIONS:
            return self._recall(entity, plan.final, rng).name
        if self.knows(entity, plan.final) and plan.final in entity.attrs:
            return str(entity.attrs[plan.final])
        values = self._values(entity.kind, plan.final)
        return rng.choice(values) if values else "unknown"

    def _values(self, kind: str, attr: str) -> list[str]:
        """The values `attr` takes among entities of `kind`: what a guess is drawn from."""
        if (kind, attr) not in self.values:
            entities = (self.graph.entities[i] for i in self.graph.by_kind.get(kind, []))
            found = {str(e.attrs[attr]) for e in entities if attr in e.attrs}
            self.values[(kind, attr)] = sorted(found)
        return self.values[(kind, attr)]

    def _recall(self, entity: Entity, rel: str, rng: random.Random) -> Entity:
        if self.knows(entity, rel) and rel in entity.rels:
            return self.graph.entities[entity.rels[rel]]
        return self._guess(target_kind(self.graph, entity.kind, rel) or entity.kind, rng)

    def _guess(self, kind: str, rng: random.Random) -> Entity:
        return self.graph.entities[rng.choice(self.graph.by_kind[kind])]

    async def alternatives(self, draft: Draft) -> list[str]:
        """Every other answer the graph admits: asked about, they make uniqueness exact."""
        plan = self._plan(draft, "checker.uniqueness")
        return sorted(a for a in plan_answers(self.graph, plan) if not same_answer(a, draft.answer))

    async def is_alternative(self, draft: Draft, answer: str) -> bool:
        """Whether `answer` is among the answers the graph admits for the draft's question."""
        plan = self._plan(draft, "checker.uniqueness")
        return any(same_answer(answer, valid) for valid in plan_answers(self.graph, plan))
