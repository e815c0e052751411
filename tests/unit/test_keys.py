"""Key names: no id a client may send names another key."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sara_service.store.keys import Keys

IDS = st.from_regex(r"[A-Za-z0-9_.:\-]{1,20}", fullmatch=True)
PER_ID = ("group", "lease", "lease_rollouts", "batch")


def fixed_keys(k: Keys) -> set[str]:
    names = [n for n, v in vars(Keys).items() if isinstance(v, property) and n != "prefix"]
    return {getattr(k, n) for n in names}


@given(IDS, IDS)
@settings(max_examples=300, deadline=None)
def test_per_id_keys_never_collide(a, b):
    k = Keys("ns")
    keys = {(kind, i): getattr(k, kind)(i) for kind in PER_ID for i in (a, b)}
    by_name: dict[str, tuple] = {}
    for owner, name in keys.items():
        assert by_name.setdefault(name, owner) == owner, (owner, by_name[name])
    assert not set(by_name) & fixed_keys(k)


def test_lease_set_key_is_not_the_key_of_a_lease_named_after_it():
    k = Keys("ns")
    assert k.lease("l1:rollouts") != k.lease_rollouts("l1")
