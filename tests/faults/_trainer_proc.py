"""A trainer that takes one batch and never acks it: the process `test_trainer_killed` SIGKILLs.

    python _trainer_proc.py URL OUT

Long-polls POST /batches/next until a batch comes, writes it as JSON to OUT (atomically: a
temporary file renamed), then waits, holding the batch unacked, until it is killed.
"""

from __future__ import annotations

import os
import sys
import threading

from sara_client import SaraClient


def main() -> None:
    url, out = sys.argv[1], sys.argv[2]
    with SaraClient(url) as client:
        batch = None
        while batch is None:
            batch = client.next_batch(wait_s=1.0)
        tmp = f"{out}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(batch.model_dump_json())
        os.replace(tmp, out)
        threading.Event().wait()  # "training": the ack never comes


if __name__ == "__main__":
    main()
