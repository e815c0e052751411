"""`sara consume`: a trainer stand-in that pulls batches, acks each and prints what it got, so a
scheduler and its workers can run end to end without a model (workers idle once the ready
groups fill flow control, until something pulls them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Optional

import typer

from . import common
from .common import DEFAULT_URL, UrlOpt, fail


@dataclass
class Tally:
    """What `sara consume` has acked."""

    batches: int = 0
    groups: int = 0
    rollouts: int = 0

    def add(self, batch: Any) -> str:
        """Count an acked batch; its line: id, groups, rollouts, policy version, mean reward."""
        rewards = [r.reward for g in batch.groups for r in g.rollouts]
        self.batches += 1
        self.groups += len(batch.groups)
        self.rollouts += len(rewards)
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        again = " (redelivered)" if batch.redelivered else ""
        return (f"batch {batch.batch_id}: {len(batch.groups)} groups, {len(rewards)} rollouts, "
                f"policy v{batch.policy_version}, mean reward {mean:.3f}{again}")

    def line(self) -> str:
        return (f"sara consume: {self.batches} batches acked, {self.groups} groups, "
                f"{self.rollouts} rollouts")


def consume(
    url: UrlOpt = DEFAULT_URL,
    token: Annotated[Optional[str], typer.Option(
        "--token", envvar=["SARA_TRAINER_TOKEN", "SARA_TOKEN"],
        help="Trainer bearer token.")] = None,
    batches: Annotated[int, typer.Option(
        min=0, help="Stop after this many batches (0: until Ctrl-C).")] = 0,
    wait_s: Annotated[float, typer.Option(
        min=0, help="Longest wait for the next batch, s, before exiting 1 with what holds the "
                    "run up (0: wait for ever).")] = 60.0,
) -> None:
    """Pull batches and ack each, printing one line per batch (id, groups, rollouts, policy
    version, mean reward): a trainer that trains nothing, so the scheduler and the workers run
    without a model. Ctrl-C stops it (exit 0) with a summary line."""
    tally = Tally()
    client = common.client(url, token)
    try:
        while not batches or tally.batches < batches:
            batch = client.wait_for_batch(timeout_s=wait_s or None)
            if batch is None:
                raise fail(f"sara consume: no batch within {wait_s:g} s from {url}: "
                           f"{_why(client)}\n{tally.line()}", 1)
            client.ack(batch.batch_id)
            typer.echo(tally.add(batch))
    except KeyboardInterrupt:
        pass
    except typer.Exit:
        raise
    except Exception as e:   # connection refused, auth: one line, not a traceback
        raise fail(f"sara consume failed: {e}\n{tally.line()}", 1) from None
    finally:
        common.close(client)
    typer.echo(tally.line())


def _why(client: Any) -> str:
    """What the scheduler says holds the run up (GET /run), or its state."""
    try:
        status = client.run_status()
    except Exception as e:
        return f"the scheduler did not say why ({e})"
    if status.warnings:
        return "; ".join(status.warnings)
    return f"the run is {status.state}; `sara stats` shows its queues and workers"
