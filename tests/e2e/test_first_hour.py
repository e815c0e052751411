"""The first hour, through real processes, as a new user runs them (each `sara` command its own
process, in a fresh folder, on the default embedded Redis):

- the quickstart block: `sara serve`, `sara load --synthetic 1000 --seed 0`, `sara worker
  --backend sim`, `sara consume`, `sara stats`; before the consumer starts, `sara stats` says
  the run is waiting for a trainer; `sara prompts list` lists the pool; the consumer stops on
  Ctrl-C with a summary, and the worker, stopped, shows in /stats as stopped at once;
- `sara serve --host 0.0.0.0` with no token refuses to start, saying how to set tokens or
  accept the risk, and starts with `--insecure`;
- a worker pointed where nothing listens names the URL and gives up with exit 1;
- a worker with `--checkpoint-root` refuses a policy published outside it and keeps working on
  the weights it has.

The commands get the scheduler's port through SARA_URL (the quickstart's default is
http://127.0.0.1:8000; a test takes a free port). Waits poll a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from sara_client import SaraClient
from sara_service.embedded import free_port
from tests.e2e._harness import _die_with_parent

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def poll(predicate, timeout_s: float, what: str, interval_s: float = 0.1):
    """`predicate()`'s first truthy value; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)   # polling a condition with a deadline, not synchronisation


class Sara:
    """`sara ...` commands run in `folder` as a new user would, each with its output in a log."""

    def __init__(self, folder: Path, port: int) -> None:
        self.folder, self.port = folder, port
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        self.env.update(SARA_URL=self.url, PYTHONUNBUFFERED="1")
        self.procs: dict[str, subprocess.Popen] = {}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self, name: str) -> str:
        path = self.folder / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, name: str, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        """`sara ARGS` in the background, its output in NAME.log."""
        with (self.folder / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sara_cli", *args], cwd=self.folder,
                env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self.procs[name] = proc
        return proc

    def run(self, *args: str, timeout_s: float = 120,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`sara ARGS` to its end."""
        return subprocess.run([sys.executable, "-m", "sara_cli", *args], cwd=self.folder,
                              env={**self.env, **(env or {})}, capture_output=True, text=True,
                              timeout=timeout_s)

    def serve(self, *args: str, env: dict[str, str] | None = None) -> None:
        """`sara serve --port PORT ARGS`, returned once /readyz answers."""
        proc = self.start("serve", "serve", "--port", str(self.port), *args, env=env)

        def ready() -> bool:
            assert proc.poll() is None, f"sara serve exited:\n{self.log('serve')}"
            try:
                return httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
            except httpx.TransportError:
                return False

        poll(ready, 90, "sara serve to answer /readyz")

    def stats(self) -> dict:
        done = self.run("stats", "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)

    def logs(self) -> str:
        return "\n".join(f"--- {name} ---\n{self.log(name)[-3000:]}" for name in self.procs)


@pytest.fixture
def sara(tmp_path):
    user = Sara(tmp_path, free_port())
    yield user
    user.stop()
    print(user.logs())   # shown when the test fails


def _stop(proc: subprocess.Popen, sig: int) -> int:
    os.kill(proc.pid, sig)
    return proc.wait(timeout=60)


def test_the_quickstart_block_runs_end_to_end(sara):
    sara.serve()
    loaded = sara.run("load", "--synthetic", "1000", "--seed", "0")
    assert loaded.returncode == 0 and "loaded 1000 prompts" in loaded.stdout, loaded.stderr
    worker = sara.start("worker", "worker", "--backend", "sim")
    # flow control full, nobody pulling: `sara stats` says what is missing
    poll(lambda: any("waiting for a trainer" in w for w in sara.stats()["warnings"]), 90,
         "the waiting-for-a-trainer warning")
    table = sara.run("stats")
    assert table.returncode == 0 and "warning: waiting for a trainer" in table.stdout
    consumer = sara.start("consume", "consume")
    batch_lines = re.compile(r"^batch b\S+: \d+ groups, \d+ rollouts, policy v0, mean reward ",
                             re.MULTILINE)
    poll(lambda: len(batch_lines.findall(sara.log("consume"))) >= 5, 90, "five batches")
    stats = sara.stats()
    assert stats["counters"]["batches_acked"] >= 5
    assert not any("waiting for a trainer" in w for w in stats["warnings"])
    assert [w["worker_id"] for w in stats["workers"] if not w["stale"]]
    listed = sara.run("prompts", "list")
    assert listed.returncode == 0, listed.stderr
    assert len(listed.stdout.splitlines()) == 1000
    assert _stop(consumer, signal.SIGINT) == 0   # Ctrl-C
    assert re.search(r"^sara consume: \d+ batches acked", sara.log("consume"), re.MULTILINE)
    assert _stop(worker, signal.SIGTERM) == 0
    (row,) = sara.stats()["workers"]   # a worker that stops says so: stopped at once
    assert row["stopped"] and not row["stale"] and row["rollouts_per_s"] is None
    assert _stop(sara.procs["serve"], signal.SIGTERM) == 0


def test_serve_refuses_an_open_api_off_loopback_unless_told(sara):
    refused = sara.run("serve", "--host", "0.0.0.0", "--port", str(sara.port), timeout_s=60)
    assert refused.returncode == 2
    said = refused.stderr
    assert "refusing to listen on 0.0.0.0 with no token set" in said
    for hint in ("scripts/init_env.py", "SARA_ADMIN_TOKEN", "--insecure"):
        assert hint in said, hint
    assert not (sara.folder / "sara-data").exists()   # nothing started
    sara.serve("--host", "0.0.0.0", "--insecure")
    assert "auth OPEN" in sara.log("serve")
    assert _stop(sara.procs["serve"], signal.SIGTERM) == 0


def test_a_worker_with_nothing_at_its_url_names_it_and_gives_up(sara):
    started = time.monotonic()
    done = sara.run("worker", "--backend", "sim", "--give-up-after", "2", timeout_s=90)
    assert done.returncode == 1
    said = done.stdout + done.stderr
    assert f"cannot reach the scheduler at {sara.url} for" in said and "giving up" in said
    assert f"lease failed (connection_error: POST {sara.url}/leases" in said
    assert time.monotonic() - started < 60


def test_a_checkpoint_outside_the_root_is_refused_and_the_worker_works_on(sara):
    root = sara.folder / "checkpoints"
    root.mkdir()
    sara.serve()
    assert sara.run("load", "--synthetic", "200", "--seed", "0").returncode == 0
    worker = sara.start("worker", "worker", "--backend", "sim", "--checkpoint-root", str(root))
    with SaraClient(sara.url) as client:
        assert client.wait_for_batch(timeout_s=60) is not None   # it works
        client.publish_policy(1, checkpoint=str(sara.folder / "elsewhere"))
        poll(lambda: "refusing policy v1" in sara.log("worker"), 60, "the refusal")
        assert "outside the checkpoint root" in sara.log("worker")
        for _ in range(3):   # it goes on, on the weights it has
            batch = client.wait_for_batch(timeout_s=60)
            assert batch is not None
            client.ack(batch.batch_id)
        (row,) = client.stats().workers
        assert row.policy_version == 0 and worker.poll() is None
    assert _stop(worker, signal.SIGTERM) == 0
