"""Redis store: every read and write of one namespace, one resource store per concept over one
script runner.

- `prompts` (prompts.py): the pool, posteriors, the epoch queue, disabling and deleting;
- `groups` (groups.py): opening groups under flow control, reading them, collecting them;
- `leases` (leases.py): leases, heartbeats, expiry, slot states;
- `results` (results.py): workers' reports applied, where SARA decides;
- `batches` (batches.py): forming, acking and reading batches;
- `policy` (policy.py): the published version, and GRESO's rates that step with it;
- `run` (run.py): pause/drain, counters and /stats, workers, the stored format (migrate.py).

Each state change is one Lua script (lua/*.lua, each with a KEYS/ARGV/returns header); what
each stored value means, and each script's KEYS/ARGV order, is in `redis_format`, and the runner
(runner.py) builds every call from that table by name.

Every method takes `now` from the caller (the scheduler's injected clock), so scripts never read
Redis' own TIME and tests can move time by hand. Domain errors are raised by the resource
stores; Redis being unreachable surfaces as `StoreUnavailable`.
"""

from __future__ import annotations

import redis.asyncio as aioredis

from .batches import BatchStore
from .groups import GroupStore
from .keys import Keys
from .leases import LeaseStore
from .policy import PolicyStore
from .prompts import PromptStore
from .results import ResultsStore
from .run import RunStore
from .runner import ScriptRunner


class Store:
    """All Redis access of one namespace, by resource."""

    def __init__(self, client: aioredis.Redis, namespace: str) -> None:
        self.runner = ScriptRunner(client, namespace)
        self.redis: aioredis.Redis = client
        self.keys: Keys = self.runner.keys
        self.prompts = PromptStore(self.runner)
        self.groups = GroupStore(self.runner)
        self.leases = LeaseStore(self.runner)
        self.results = ResultsStore(self.runner, self.leases)
        self.batches = BatchStore(self.runner)
        self.policy = PolicyStore(self.runner)
        self.run = RunStore(self.runner)
