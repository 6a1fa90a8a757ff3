"""The synthetic world: reproducible bytes, a closed link graph, and questions with one answer."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from asearcher.consumers.world.borrowed_names import borrow_names
from asearcher.consumers.world.world import (
    ATTRIBUTES,
    RELATIONS,
    Entity,
    World,
    WorldGraph,
    WorldQuestion,
    build_graph,
    generate_world,
    id_bucket,
    make_questions,
    page_url,
    read_world_questions,
    split_of,
    write_world,
)

LINK = re.compile(r"\[([^\]]+)\]\((https://synthpedia\.local/wiki/[^)\s]+)\)")


@pytest.fixture(scope="module")
def graph() -> WorldGraph:
    return build_graph(seed=0)


@pytest.fixture(scope="module")
def world() -> World:
    return generate_world(seed=0)


def corpus_bytes(tmp_path: Path, seed: int) -> dict[str, bytes]:
    paths = write_world(generate_world(seed=seed), tmp_path / f"seed{seed}")
    return {name: path.read_bytes() for name, path in paths.items()}


def resolve(graph: WorldGraph, by_name: dict[str, Entity], phrase: str) -> set[int]:
    """Every entity a noun phrase can denote, reading the question language backwards."""
    found = {by_name[phrase].id} if phrase in by_name else set()
    for rel, (template, _) in RELATIONS.items():
        prefix, suffix = template.split("{x}")
        if not (phrase.startswith(prefix) and phrase.endswith(suffix)):
            continue
        inner = phrase[len(prefix) : len(phrase) - len(suffix)]
        for entity_id in resolve(graph, by_name, inner):
            if rel in graph.entities[entity_id].rels:
                found.add(graph.entities[entity_id].rels[rel])
    return found


def answers_of(graph: WorldGraph, by_name: dict[str, Entity], question: str) -> set[str]:
    """Every answer the question text admits in the graph, over all ways to parse it."""
    answers: set[str] = set()
    finals = [(rel, q, None) for rel, (_, q) in RELATIONS.items()]
    finals += [(attr, q, kind) for (kind, attr), q in ATTRIBUTES.items()]
    for key, template, kind in finals:
        prefix, suffix = template.split("{x}")
        if not (question.startswith(prefix) and question.endswith(suffix)):
            continue
        for entity_id in resolve(graph, by_name, question[len(prefix) : -len(suffix)]):
            entity = graph.entities[entity_id]
            if kind is None and key in entity.rels:
                answers.add(graph.entities[entity.rels[key]].name)
            elif kind == entity.kind and key in entity.attrs:
                answers.add(str(entity.attrs[key]))
    return answers


def test_write_world_same_seed_identical_bytes(tmp_path: Path) -> None:
    first, second = corpus_bytes(tmp_path / "a", 7), corpus_bytes(tmp_path / "b", 7)
    assert first == second
    assert len(first["corpus"]) > 100_000


def test_write_world_different_seed_different_bytes(tmp_path: Path) -> None:
    first, second = corpus_bytes(tmp_path, 1), corpus_bytes(tmp_path, 2)
    for name in ("corpus", "qa_train", "qa_test"):
        assert first[name] != second[name]


def test_write_world_files_have_exact_keys(world: World, tmp_path: Path) -> None:
    paths = write_world(world, tmp_path / "out")
    assert set(paths) == {"corpus", "qa_train", "qa_test"}
    corpus = paths["corpus"].read_bytes().splitlines()
    assert len(corpus) == len(world.pages)
    assert all(set(msgspec.json.decode(line)) == {"url", "title", "contents"} for line in corpus)
    questions = []
    for name in ("qa_train", "qa_test"):
        for line in paths[name].read_bytes().splitlines():
            assert set(msgspec.json.decode(line)) == set(WorldQuestion.__struct_fields__)
            questions.append(msgspec.json.decode(line, type=WorldQuestion))
            assert questions[-1].split == name.removeprefix("qa_")
    assert sorted(questions, key=lambda q: q.id) == sorted(world.questions, key=lambda q: q.id)


def test_pages_every_link_targets_existing_page(world: World) -> None:
    urls = {page.url for page in world.pages}
    titles = {page.url: page.title for page in world.pages}
    links = [m for page in world.pages for m in LINK.findall(page.contents)]
    assert len(links) > 2 * len(world.pages)
    for text, url in links:
        assert url in urls
        assert titles[url] == text


def test_pages_names_and_urls_unique(world: World) -> None:
    titles = [page.title for page in world.pages]
    assert len(set(titles)) == len(titles) == 300
    assert len({page.url for page in world.pages}) == len(titles)
    assert all(page.url == page_url(page.title) for page in world.pages)
    assert all(" " not in page.url for page in world.pages)


def test_pages_first_sentence_names_the_entity(world: World) -> None:
    for page in world.pages:
        assert page.contents.split(". ")[0].startswith(page.title)


def test_pages_default_world_varies_in_length(world: World) -> None:
    sizes = [len(page.contents) for page in world.pages]
    assert min(sizes) < 1_000
    assert sum(size >= 3_000 for size in sizes) >= 10


def test_pages_state_every_relation_and_attribute(graph: WorldGraph, world: World) -> None:
    pages = {page.url: page.contents for page in world.pages}
    for entity in graph.entities:
        contents = pages[entity.url]
        for target in entity.rels.values():
            linked = graph.entities[target]
            assert f"[{linked.name}]({linked.url})" in contents, (entity.name, linked.name)
        for (kind, attr), _ in ATTRIBUTES.items():
            if kind == entity.kind and attr in entity.attrs:
                assert str(entity.attrs[attr]) in contents, (entity.name, attr)


def test_graph_relations_functional_and_consistent(graph: WorldGraph) -> None:
    entities = graph.entities
    founders = [e.rels["founder"] for e in entities if e.kind == "company"]
    assert len(founders) == len(set(founders))
    for entity in entities:
        if spouse := entity.rels.get("spouse"):
            assert entities[spouse].rels["spouse"] == entity.id != spouse
        if company := entity.rels.get("founded"):
            assert entities[company].rels["founder"] == entity.id
            founded = entities[company].attrs["founded_year"]
            assert entity.attrs["birth_year"] + 18 <= founded
            assert founded <= entity.attrs.get("death_year", 2023)
    for country_id in graph.by_kind["country"]:
        capital = entities[entities[country_id].rels["capital"]]
        assert capital.rels["country"] == country_id


def test_questions_supporting_pages_chain_to_the_answer(world: World) -> None:
    pages = {page.url: page for page in world.pages}
    for question in world.questions:
        urls = question.supporting_urls
        assert len(urls) == question.hops
        assert pages[urls[0]].title in question.question
        for here, there in zip(urls, urls[1:], strict=False):
            assert f"]({there})" in pages[here].contents
        assert all(answer in pages[urls[-1]].contents for answer in question.answers)


def test_questions_name_their_kind_and_one_kind_is_one_template(world: World) -> None:
    from asearcher.consumers.world.world import KINDS

    titles = {page.url: page.title for page in world.pages}
    templates: dict[str, set[str]] = {}
    for question in world.questions:
        start, _, chain = question.kind.partition(":")
        assert start in KINDS and chain.count(".") == question.hops - 1, question
        # Only the start's name differs between the questions of one kind.
        text = question.question.replace(titles[question.supporting_urls[0]], "X")
        templates.setdefault(question.kind, set()).add(text)
    assert len(templates) >= 10  # the world asks many kinds of question
    assert all(len(texts) == 1 for texts in templates.values()), templates


def test_questions_chain_never_revisits_an_entity(world: World) -> None:
    titles = {page.url: page.title for page in world.pages}
    for question in world.questions:
        urls = question.supporting_urls
        assert len(set(urls)) == len(urls), question
        assert not {titles[url] for url in urls} & set(question.answers), question


def test_questions_text_has_exactly_the_gold_answer(graph: WorldGraph, world: World) -> None:
    by_name = {entity.name: entity for entity in graph.entities}
    for question in world.questions:
        assert answers_of(graph, by_name, question.question) == set(question.answers), question


def test_questions_default_world_all_hop_counts(world: World) -> None:
    hops = Counter(question.hops for question in world.questions)
    assert len(world.questions) == 500
    assert set(hops) == {1, 2, 3, 4}
    assert min(hops.values()) >= 100
    assert len({question.question for question in world.questions}) == 500
    assert len({question.id for question in world.questions}) == 500


def test_questions_splits_nonempty_and_deterministic(graph: WorldGraph, world: World) -> None:
    splits = Counter(question.split for question in world.questions)
    assert set(splits) == {"train", "test"}
    assert 0.1 < splits["test"] / len(world.questions) < 0.3
    assert all(question.split == split_of(question.id) for question in world.questions)
    again = make_questions(graph, seed=0, count=500)
    assert [(q.id, q.split) for q in again] == [(q.id, q.split) for q in world.questions]


def test_a_larger_test_share_holds_out_more_and_every_question_a_fifth_does(
    graph: WorldGraph, world: World
) -> None:
    larger = make_questions(graph, seed=0, count=500, test_share=0.35)
    assert [q.question for q in larger] == [q.question for q in world.questions]
    held_out = {q.id for q in larger if q.split == "test"}
    assert {q.id for q in world.questions if q.split == "test"} < held_out
    assert 0.28 < len(held_out) / len(larger) < 0.42
    assert all(q.split == split_of(q.id, 0.35) for q in larger)


def test_validation_questions_come_out_of_train_and_leave_test_alone(
    graph: WorldGraph, world: World, tmp_path: Path
) -> None:
    kept = make_questions(graph, seed=0, count=500, valid_share=0.1)
    assert [q.id for q in kept] == [q.id for q in world.questions]
    before = {q.id: q.split for q in world.questions}
    after = {q.id: q.split for q in kept}
    valid = {qid for qid, split in after.items() if split == "valid"}
    assert len(valid) == round(0.1 * len(kept))
    assert all(before[qid] == "train" for qid in valid)
    assert {q for q, s in after.items() if s == "test"} == {
        q for q, s in before.items() if s == "test"
    }
    paths = write_world(World(world.pages, kept), tmp_path)
    assert set(paths) == {"corpus", "qa_train", "qa_valid", "qa_test"}
    written = msgspec.json.Decoder(WorldQuestion)
    valid_file = [written.decode(line) for line in paths["qa_valid"].read_bytes().splitlines()]
    assert {q.id for q in valid_file} == valid
    assert not valid & {written.decode(line).id
                        for line in paths["qa_train"].read_bytes().splitlines()}  # fmt: skip
    assert sorted(q.id for q in read_world_questions(tmp_path)) == sorted(after)


def test_build_graph_too_few_entities_raises() -> None:
    with pytest.raises(ValueError, match="at least"):
        build_graph(seed=0, entities=5)


# ---------------------------------------------------------------- borrowed names


@pytest.fixture(scope="module")
def donor() -> WorldGraph:
    return build_graph(seed=0, entities=60)


@pytest.fixture(scope="module")
def borrowing() -> World:
    """The world of seed 7 carrying the names of the world of seed 0."""
    return generate_world(seed=7, entities=60, questions=400, max_hops=2, names_from=0)


def test_borrowed_names_are_the_donors_with_other_facts(
    donor: WorldGraph, borrowing: World
) -> None:
    assert {p.title for p in borrowing.pages} == {e.name for e in donor.entities}
    own = {p.title for p in generate_world(seed=7, entities=60, questions=1).pages}
    assert not own & {p.title for p in borrowing.pages}  # seed 7's own names are all gone
    rivers = {str(donor.entities[i].attrs["river"]) for i in donor.by_kind["city"]}
    assert {q.answers[0] for q in borrowing.questions if "river" in q.question} <= rivers
    # The same titles say other things: no page is the donor's page.
    donor_pages = {p.title: p.contents for p in generate_world(0, 60, 1).pages}
    assert not [p.title for p in borrowing.pages if p.contents == donor_pages[p.title]]


def test_a_borrowing_world_never_asks_a_donor_fact_with_its_answer(
    donor: WorldGraph, borrowing: World
) -> None:
    by_name = {e.name: e for e in donor.entities}
    asked = [
        q for q in borrowing.questions if q.answers[0] in answers_of(donor, by_name, q.question)
    ]
    assert asked == [] and len(borrowing.questions) == 400
    # The filter is what keeps them out: unfiltered, the same graph asks some by chance.
    graph = borrow_names(build_graph(seed=7, entities=60), donor, random.Random("7:names"))
    unfiltered = make_questions(graph, seed=7, count=400, max_hops=2)
    assert [q for q in unfiltered if q.answers[0] in answers_of(donor, by_name, q.question)]


def test_borrowing_from_a_world_of_another_size_is_refused(donor: WorldGraph) -> None:
    with pytest.raises(ValueError, match="1 city entities here, 4 in the donor"):
        borrow_names(build_graph(seed=1, entities=20), donor, random.Random(1))


def test_validation_asks_each_kind_in_its_share(graph: WorldGraph, world: World) -> None:
    # What keep_best ranks versions on must ask what the test split asks: each kind of question
    # (template) gives validation its share of its questions, within one, where a hash alone
    # let a few kinds crowd in.
    kept = make_questions(graph, seed=0, count=500, valid_share=0.15)
    totals = Counter(q.kind for q in kept)
    valid = Counter(q.kind for q in kept if q.split == "valid")
    assert sum(valid.values()) == round(0.15 * len(kept))
    assert max(abs(valid[kind] - 0.15 * total) for kind, total in totals.items()) <= 1.0
    hashed = Counter(q.kind for q in kept if id_bucket(q.id) in range(20, 35))
    assert max(abs(hashed[kind] - 0.15 * total) for kind, total in totals.items()) > 1.0
