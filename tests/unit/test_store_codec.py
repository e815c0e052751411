"""store_codec: what older releases stored reads back instead of failing."""

from __future__ import annotations

import json

import pytest

from sara_client.limits import MAX_STORED_INT
from sara_service.store.codec import StoredPosterior, decode_posterior, stored_int


@pytest.mark.parametrize("raw, value", [
    (b"5", 5), ("5", 5), (None, 0), (b"", 0), (b"1e+17", MAX_STORED_INT),
    (b"9007199254740991", MAX_STORED_INT), (b"1.5e+3", 1500), (b"inf", MAX_STORED_INT),
    (b"-inf", -MAX_STORED_INT), (b"nan", 0), (b"-1", -1),
])
def test_stored_int_reads_what_lua_wrote(raw, value):
    assert stored_int(raw) == value


def test_a_stored_result_is_spliced_into_a_batch_as_stored():
    import orjson
    from sara_service.core.answers import stored_result

    stored = {"rollout_id": "g:0", "completion": "é", "reward": 1.0, "completion_tokens": 3,
              "policy_version": 2, "logprobs": [-0.5, -1.0]}
    assert json.loads(orjson.dumps(stored_result(json.dumps(stored).encode()))) == stored


def test_a_posterior_reads_as_typed_fields_whatever_lua_wrote_for_its_counts():
    # cjson writes a count past 2**53 as a double ('1e+17'), and an integer as a JSON number
    raw = ('{"a": 7, "b": 3.5, "v": 4, "t": 2.25, "groups": 2, "rollouts": 1e+17, "successes": 9,'
           ' "last": "g1", "obs": [[3, "M"], [4, "F", 0.25]], "lc": {"0": 2, "1": 3.5}}')
    post = decode_posterior(raw)
    assert (post.alpha, post.beta, post.version, post.clock) == (7.0, 3.5, 4, 2.25)
    assert (post.groups, post.rollouts, post.successes) == (2, MAX_STORED_INT, 9)
    assert (post.committed, post.abandoned, post.saturated) == (0, 0, 0)
    assert post.last_group == "g1" and post.observations == [[3, "M"], [4, "F", 0.25]]
    assert post.level_counts == {"0": 2, "1": 3.5} and post.has_evidence
    assert post.age(version=6, clock=3.0) == (2, 0.75)
    assert post.age(version=1, clock=0.0) == (0, 0.0)   # never negative


@pytest.mark.parametrize("raw", [None, b"", "{}"])
def test_nothing_stored_reads_as_no_evidence_and_no_age(raw):
    post = decode_posterior(raw)
    assert post == StoredPosterior() and not post.has_evidence
    assert post.age(version=9, clock=5.0) == (0, 0)
