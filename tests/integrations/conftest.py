"""`sara`: the real app in-process (`sara_client.local`) on the tests' real Redis, k = 4, with
the stand-in prompt pool loaded."""

from __future__ import annotations

import pytest

K = 4


@pytest.fixture
def sara(redis_url):
    pytest.importorskip("sara_service")
    from sara_client import local

    from ._drive import PROMPTS

    with local(redis_url=redis_url, group_size=K, batch_size=2, tau_low=0.5) as client:
        client.add_prompts(PROMPTS)
        yield client
