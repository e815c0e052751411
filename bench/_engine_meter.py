"""Measuring a real engine on this box: CPU per process, the engine's queue, a `sara serve`.

Shared by `bench/worker_overhead.py` and `bench/engine_time.py`. Linux only (/proc): CPU seconds
per process tree, the time the engine's threads waited for a CPU (schedstat), and the machine's
busy time; the number of requests an in-process vLLM engine holds, sampled from its front end;
and a `sara serve` subprocess with its own embedded Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx


def _descendants(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            out += [kid, *_descendants(kid)]
    return out


def _cpu_of(pids: list[int]) -> float:
    """user + system CPU seconds these (live) processes have used so far."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _cpu_wait_of(pids: list[int]) -> float:
    """Seconds these processes' threads have spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                continue
    return total / 1e9


def _titled(pids: list[int], word: str) -> list[int]:
    """The processes whose title names ``word`` (vLLM titles its processes ``VLLM::EngineCore``,
    ``VLLM::Worker``)."""
    out = []
    for pid in pids:
        try:
            if word in Path(f"/proc/{pid}/cmdline").read_text(errors="replace"):
                out.append(pid)
        except OSError:
            continue
    return out


def _machine_busy() -> float:
    """CPU seconds every process on the machine has used (/proc/stat, all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds per part over one round: this process, the engine, the scheduler, the rest.

    The engine's share is also given for its core process alone (``engine-core``: vLLM's
    ``EngineCore``, which schedules every step and hands the model worker its inputs; the model
    worker is pinned to its own core by vLLM's CPU thread binding, the core process is not).

    ``scheduler_pid``'s process tree is the scheduler; ``idle_pids`` are other child process
    trees of this process (schedulers not in use this round), counted as "other", not engine."""

    def __init__(self, scheduler_pid: int | None, idle_pids: tuple[int, ...] = ()) -> None:
        self.scheduler_pid, self.idle_pids = scheduler_pid, idle_pids

    @staticmethod
    def _tree(pid: int | None) -> list[int]:
        return [pid, *_descendants(pid)] if pid else []

    def sample(self) -> dict[str, float]:
        me = os.getpid()
        scheduler = self._tree(self.scheduler_pid)
        idle = {p for pid in self.idle_pids for p in self._tree(pid)}
        engine = [p for p in _descendants(me) if p not in scheduler and p not in idle]
        core = _titled(engine, "EngineCore")
        return {"worker": _cpu_of([me]), "engine": _cpu_of(engine), "engine-core": _cpu_of(core),
                "scheduler": _cpu_of(scheduler), "machine": _machine_busy(),
                "wait": _cpu_wait_of(engine), "core-wait": _cpu_wait_of(core)}

    @staticmethod
    def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict:
        used = {k: (after[k] - before[k]) / seconds for k in before}
        used["other"] = max(0.0, used.pop("machine") - used["worker"] - used["engine"]
                            - used["scheduler"])
        used["engine-waiting"] = used.pop("wait")
        used["engine-core-waiting"] = used.pop("core-wait")
        return used


class InflightSampler:
    """Requests the engine holds, sampled every 10 ms from its front end (a measurement aid).

    ``get_num_unfinished_requests`` counts what the engine was given and has not finished,
    waiting requests included; capped at ``max_num_seqs`` it is the number the engine can be
    running (:meth:`occupancy`)."""

    PERIOD_S = 0.01

    def __init__(self, engine, max_num_seqs: int | None = None) -> None:
        self.engine, self.max_num_seqs = engine, max_num_seqs
        self.samples: list[tuple[float, int]] = []
        self.started = time.perf_counter()
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            self.samples.append((time.perf_counter() - self.started,
                                 self.engine.get_num_unfinished_requests()))
            await asyncio.sleep(self.PERIOD_S)

    def stop(self) -> float:
        """Stop sampling; the mean number of unfinished requests."""
        self.task.cancel()
        return statistics.fmean(n for _, n in self.samples) if self.samples else 0.0

    def occupancy(self, until_s: float | None = None) -> float:
        """Mean of min(unfinished, max_num_seqs) / max_num_seqs over the samples up to until_s."""
        cap = self.max_num_seqs or 1
        kept = [min(n, cap) / cap for t, n in self.samples if until_s is None or t <= until_s]
        return statistics.fmean(kept) if kept else 0.0

    def series(self, bin_s: float = 1.0, until_s: float | None = None) -> list[float]:
        """Occupancy per ``bin_s`` seconds (for a chart)."""
        cap = self.max_num_seqs or 1
        bins: dict[int, list[float]] = {}
        for t, n in self.samples:
            if until_s is None or t <= until_s:
                bins.setdefault(int(t // bin_s), []).append(min(n, cap) / cap)
        return [round(statistics.fmean(bins[i]), 4) if i in bins else 0.0
                for i in range(max(bins) + 1 if bins else 0)]


class ServeProcess:
    """`sara serve` (its own embedded Redis) in a subprocess, reached over HTTP, as deployed.

    ``flags`` are extra `sara serve` flags (the policy's); ``env`` extra SARA_* variables;
    ``internal`` settings a user cannot set (`_serve_internal.py`). The caller's own SARA_*
    variables are not passed on: the bench says everything it runs."""

    def __init__(self, work: Path, *, group_size: int, flags: list[str] | None = None,
                 env: dict[str, str] | None = None, nice: int = 0,
                 batch_size: int = 8, internal: dict[str, Any] | None = None) -> None:
        from sara_service.embedded import free_port

        self.port = free_port()
        work.mkdir(parents=True, exist_ok=True)
        self.log = work / "serve.log"
        niced = ["nice", "-n", str(nice)] if nice else []
        sara = ([str(Path(__file__).with_name("_serve_internal.py")), json.dumps(internal)]
                if internal else ["-m", "sara_cli"])
        self.cmd = [*niced, sys.executable, *sara, "serve", "--port", str(self.port),
                    "--group-size", str(group_size), "--batch-size", str(batch_size),
                    "--data-dir", str(work / "sara-data"), "--log-level", "warning",
                    *(flags or [])]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SARA_")}
        self.env.update(env or {})
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "ServeProcess":
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env,
                                            start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # start-up: poll /readyz with a deadline
            if self.process.poll() is not None:
                break
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"sara serve did not start:\n{self.log.read_text()[-3000:]}")

    def client(self, token: str | None = None):
        """An async SDK client of this scheduler."""
        from sara_client import AsyncSaraClient

        return AsyncSaraClient(self.url, token=token)

    def cpu_pid(self) -> int | None:
        return self.process.pid if self.process else None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def command_line(script: str, argv: list[str] | None) -> str:
    """How this run was started, as a report's `command:` line gives it."""
    return shlex.join(["python", f"bench/{script}", *(sys.argv[1:] if argv is None else argv)])


def publish_report(text: str, out: Path, *, write: bool, append: bool = False) -> None:
    """Print a bench's report and write it to `out` (below the file's earlier reports, after a
    rule, with `append`)."""
    print("\n" + text)
    if not write:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    if append and out.exists():
        text = out.read_text() + "\n" + "=" * 100 + "\n\n" + text
    out.write_text(text)
    print(f"written to {out}")


def load_average() -> str:
    """The 1/5/15-minute load averages, as text."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def build_model(work: Path, context: int) -> Path:
    """The tiny test policy (sara_trainer.tiny), built into ``work``."""
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    return build_tiny_policy(work / "tiny", TinyConfig(context=context))
