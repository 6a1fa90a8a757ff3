"""Another world's names on this world's facts.

A warm start that demonstrates on other worlds must not teach the run's facts, yet a small
policy copies names it has met in pretraining far better than names it has not (measured in
docs/learning.md). A world that borrows the run's names gives both: the same people, cities,
companies and rivers, with every relation and attribute drawn afresh, so a demonstration's
answer is the run's answer only by chance (and `make_questions` drops those questions).
"""

from __future__ import annotations

import random

from asearcher.consumers.world.world import KINDS, WorldGraph, page_url


def borrow_names(graph: WorldGraph, donor: WorldGraph, rng: random.Random) -> WorldGraph:
    """`graph` with the names of `donor`'s entities of each kind, shuffled by `rng`.

    The worlds must have as many entities of each kind (the same size does). Names derived from
    a name follow it: a country's language and currency keep their ending on the new root.
    Cities take the donor's rivers, shuffled apart from the cities' names.
    """
    for kind in KINDS:
        if len(graph.by_kind[kind]) != len(donor.by_kind[kind]):
            raise ValueError(
                f"cannot borrow names: {len(graph.by_kind[kind])} {kind} entities here, "
                f"{len(donor.by_kind[kind])} in the donor world (give both worlds the same size)"
            )
        names = [donor.entities[i].name for i in donor.by_kind[kind]]
        rng.shuffle(names)
        for entity_id, name in zip(graph.by_kind[kind], names, strict=True):
            entity = graph.entities[entity_id]
            if kind == "country":
                _rename_derived(entity.attrs, entity.name, name)
            entity.name, entity.url = name, page_url(name)
    rivers = [donor.entities[i].attrs["river"] for i in donor.by_kind["city"]]
    rng.shuffle(rivers)
    for city_id, river in zip(graph.by_kind["city"], rivers, strict=True):
        graph.entities[city_id].attrs["river"] = river
    return graph


def _rename_derived(attrs: dict[str, int | str], old: str, new: str) -> None:
    """A country's language and currency are its name's root plus an ending: keep the ending."""
    old_root, new_root = old.rstrip("aeiou"), new.rstrip("aeiou")
    for key in ("language", "currency"):
        value = str(attrs[key])
        attrs[key] = new_root + value[len(old_root) :]
