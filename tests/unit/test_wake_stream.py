"""How a read of the wake stream folds its entries into the wake-ups it causes."""

from __future__ import annotations

from sara_service.store.wake_stream import notices


def test_no_entries_keep_the_reading_point_and_wake_nobody():
    found = notices([], "5-0")
    assert (found.last_id, found.lease, found.ready) == ("5-0", False, None)


def test_lease_entries_wake_leases_and_batch_entries_keep_the_most_groups_ready():
    entries = [(b"6-0", {b"w": b"batch", b"n": b"3"}), (b"7-0", {b"w": b"lease"}),
               (b"8-0", {b"w": b"batch", b"n": b"9"}), (b"9-0", {b"w": b"batch", b"n": b"4"})]
    found = notices(entries, "5-0")
    assert (found.last_id, found.lease, found.ready) == ("9-0", True, 9)


def test_a_batch_entry_of_any_size_wins_over_counted_ones():
    """A drain's notice (no n, or -1) wakes every batch poll, whatever the others said."""
    for any_size in ({b"w": b"batch"}, {"w": "batch", "n": "-1"}):
        entries = [("6-0", {"w": "batch", "n": "12"}), ("7-0", any_size),
                   ("8-0", {"w": "batch", "n": "2"})]
        found = notices(entries, "5-0")
        assert (found.last_id, found.lease, found.ready) == ("8-0", False, -1)
