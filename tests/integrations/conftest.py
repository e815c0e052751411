"""`sara`: the real app in-process (`sara_client.local`) on the tests' real Redis, k = 4, with
the stand-in prompt pool loaded; for the verl tests, `sara_url` (the same app over HTTP),
`ray_tq` (a local Ray with TransferQueue) and `tiny_llama_dir`."""

from __future__ import annotations

import os
import sys

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


@pytest.fixture(scope="module")
def ray_tq():
    """A local Ray in this process with verl's TransferQueue on it (one storage unit), as verl's
    TaskRunner initialises it; shut down after the module (other modules start their own Ray)."""
    ray = pytest.importorskip("ray")
    import transfer_queue as tq
    from omegaconf import OmegaConf

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
    try:
        yield tq
    finally:
        tq.close()
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    from ._verl import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture
def sara_url(redis_url):
    """The real app served over HTTP (uvicorn on a free port): verl's classes reach SARA by URL,
    as in a run. k = 4, batches of 2 groups, the verl tests' GSM8K-style prompts loaded."""
    from sara_client import SaraClient
    from sara_service.settings import Settings
    from tests.dashboard._live import LiveServer

    from ._verl import PROMPTS

    server = LiveServer(Settings(redis_url=redis_url, namespace="verl", group_size=K,
                                 batch_size=2, tau_low=0.5, lease_ttl_s=60,
                                 max_tokens=8)).start()
    try:
        with SaraClient(server.url) as client:
            client.add_prompts(PROMPTS)
        yield server.url
    finally:
        server.stop()
