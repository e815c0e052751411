"""redis_format: each Lua script's header and its KEYS[i]/ARGV[i] uses agree with the Python table
(`SCRIPTS`), so a script changed without the table (or the table without the script) fails here;
and the slot encoding round-trips."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest

from sara_service.store import redis_format as rf
from sara_service.store.keys import Keys
from sara_service.store.runner import script_source

LUA = resources.files("sara_service.store") / "lua"
ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _split(name: str) -> tuple[str, str]:
    """(header comment lines, code with comments removed) of one script: the header of its own
    file, the code of what Redis runs (the prelude and the library files its spec names, then the
    script), since a library file may read KEYS/ARGV or answer a decision for it."""
    lines = (LUA / f"{name}.lua").read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if not line.startswith("--"))
    code = "\n".join(re.sub(r"--.*$", "", line) for line in script_source(name).splitlines())
    return "\n".join(lines[:n]), code


def _header(header: str, table: str) -> tuple[list[str], int | None, list[str]]:
    """(names of TABLE[1..n] in order, index of the first per-item entry, per-item names)."""
    fixed = {int(i): name for i, name in re.findall(rf"\b{table}\[(\d+)\] = (\w+)", header)}
    assert sorted(fixed) == list(range(1, len(fixed) + 1)), f"{table} indices not 1..n: {fixed}"
    more_start, more_names = None, []
    if m := re.search(rf"\b{table}\[(\d+)\.\.\] = (.*)", header):
        more_start = int(m.group(1))
        items = m.group(2).rsplit(":", 1)[-1].split(",")
        more_names = [re.match(r"\s*(\w+)", x).group(1) for x in items if "..." not in x]
    elif m := re.search(rf"\b{table}\[(\d+) \+ i\]", header):
        more_start = int(m.group(1)) + 1
    return [fixed[i] for i in sorted(fixed)], more_start, more_names


def test_every_script_file_has_a_spec():
    # _prelude.lua is no script: the store puts it in front of every script it loads
    on_disk = {p.name[:-4] for p in LUA.iterdir()
               if p.name.endswith(".lua") and not p.name.startswith("_")}
    assert on_disk == set(rf.SCRIPTS)


@pytest.mark.parametrize("name", sorted(rf.SCRIPTS))
def test_header_names_the_table_order(name):
    spec = rf.SCRIPTS[name]
    header, _ = _split(name)
    keys, more_key, _ = _header(header, "KEYS")
    args, more_arg, more_args = _header(header, "ARGV")
    assert tuple(keys) == spec.keys
    assert tuple(args) == spec.args
    assert more_key == (spec.first_more_key if spec.more_keys else None)
    assert more_arg == (len(spec.args) + 1 if spec.more_args else None)
    assert tuple(more_args) == spec.more_args


@pytest.mark.parametrize("name", sorted(rf.SCRIPTS))
def test_code_uses_what_the_table_declares(name):
    """Every literal KEYS[i]/ARGV[i] is declared and every declared one is used; an offset into the
    per-item tail (`KEYS[10 + i]`, `ARGV[10 + (i - 1) * 6 + j]`) starts right after the fixed ones,
    and a loop over the tail (`for i = 2, #ARGV`) starts there too."""
    spec = rf.SCRIPTS[name]
    _, code = _split(name)
    for table, fixed in (("KEYS", spec.keys), ("ARGV", spec.args)):
        used = {int(i) for i in re.findall(rf"\b{table}\[(\d+)\]", code)}
        assert used == set(range(1, len(fixed) + 1)), (table, sorted(used), fixed)
        for offset in re.findall(rf"\b{table}\[(\d+) \+", code):
            assert int(offset) == len(fixed), (table, offset)
        for start in re.findall(rf"for i = (\d+), #{table}", code):
            assert int(start) == len(fixed) + 1, (table, start)
    for per_item in re.findall(r"\bARGV\[\d+ \+ \(i - 1\) \* (\d+)", code):
        assert int(per_item) == len(spec.more_args)


@pytest.mark.parametrize("name", sorted(rf.SCRIPTS))
def test_status_words_are_the_tables(name):
    _, code = _split(name)
    words = set(re.findall(r"\breturn\s*\{?\s*'(\w+)'", code))
    assert words == set(spec_replies := rf.SCRIPTS[name].replies), (words, spec_replies)
    assert words <= set(vars(rf.Reply).values()) | set(rf.OFF_STATES) | {"enabled"} | set(rf.DECISIONS)


def test_key_list_builds_every_key_by_name():
    keys = Keys("ns")
    spec = rf.SCRIPTS["heartbeat"]
    built = spec.key_list(keys, lease=keys.lease("L"), lease_rollouts=keys.lease_rollouts("L"))
    assert built == [keys.lease("L"), keys.lease_rollouts("L"), keys.inflight, keys.slots,
                     keys.cancels, keys.workers]
    with pytest.raises(TypeError):
        spec.key_list(keys)  # the per-id keys are required
    with pytest.raises(TypeError):
        spec.arg_list(now=1)  # every ARGV by name
    for spec in rf.SCRIPTS.values():  # every namespace-wide name is a Keys property
        for key in spec.keys:
            assert isinstance(getattr(Keys, key), (property, type(Keys.group))), (spec.name, key)


@pytest.mark.parametrize("raw, slot", [
    (None, rf.Slot("unissued")), ("p", rf.Slot("pending")), ("d", rf.Slot("done")),
    ("c", rf.Slot("cancelled")), ("l|L1|w|x", rf.Slot("leased", "L1", "w|x")),
    ("d|w2", rf.Slot("done", worker_id="w2")),
])
def test_slot_states_decode(raw, slot):
    assert rf.decode_slot(raw) == slot
    if slot.kind == "leased":
        assert rf.leased(slot.lease_id, slot.worker_id) == raw


def test_worker_info_fields_split_on_the_last_bar():
    assert rf.split_worker_info({"a|b|completed": "3", "a|b|tokens": "9", "c|leases": "1"}) == {
        "a|b": {"completed": "3", "tokens": "9"}, "c": {"leases": "1"}}


def test_architecture_doc_explains_every_short_field():
    text = ARCHITECTURE.read_text().replace("\\|", "|")  # a '|' in a table cell is escaped
    short = [v for cls in (rf.GroupField, rf.PosteriorField) for k, v in vars(cls).items()
             if not k.startswith("_") and isinstance(v, str)]
    missing = [f for f in short + ["r:<slot>", "l|<lease>|<worker>",
                                   "d|<worker>"] if f"`{f}`" not in text]
    assert not missing
