"""Checkpoints: ``root/step-000123/`` holding safetensors weights, the HF config, the tokenizer,
``trainer_state.json`` (trainer config dict, step, policy version) and optionally ``optimizer.pt``,
plus a ``root/latest`` pointer file naming the newest one.

Every checkpoint is written into a hidden temporary directory next to its final place, flushed to
disk, and renamed into place in one step; ``latest`` is replaced the same way after that. A crash
at any point leaves either the previous checkpoint and pointer untouched or the new ones complete:
readers never see half a checkpoint. ``trainer_state.json`` is written last, so a step directory
without it is not a checkpoint (``latest_checkpoint`` skips it).

Workers load a published checkpoint directory with ``from_pretrained`` as it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

LATEST = "latest"
STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pt"
FORMAT = 1
_STEP_DIR = re.compile(r"^step-(\d{6,})$")


def step_dir_name(step: int) -> str:
    if step < 0:
        raise ValueError("step must be >= 0")
    return f"step-{step:06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for file in path.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(path)


def _config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    if is_dataclass(config):
        from dataclasses import asdict

        return asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    raise TypeError("config must be a TrainerConfig, a dataclass or a dict")


def save_checkpoint(root: str | Path, model, tokenizer, *, step: int,
                    policy_version: int | None = None, config: Any = None,
                    optimizer=None, extra: Mapping[str, Any] | None = None,
                    keep: int | None = None,
                    extra_writers: Sequence[Callable[[Path], Any]] = (),
                    weights_dtype=None) -> Path:
    """Write ``root/step-XXXXXX/`` atomically, point ``root/latest`` at it, return its path.

    `config` (a TrainerConfig, dataclass or dict) goes into ``trainer_state.json`` with `step`,
    `policy_version` (defaults to `step`) and `extra`. Saving a step that exists replaces it.
    `keep` > 0 deletes all but the newest `keep` checkpoints afterwards. Each of `extra_writers`
    is called with the temporary directory before it is marked complete and renamed into place,
    so what it writes (the PPO critic, say) is in the checkpoint or the checkpoint is not there.
    `weights_dtype` (a torch dtype) casts the saved weights, e.g. bf16 for the workers.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = step_dir_name(step)
    final = root / name
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex[:12]}"
    state = {"format": FORMAT, "step": int(step),
             "policy_version": int(step if policy_version is None else policy_version),
             "config": _config_dict(config), "saved_at": time.time(),
             "extra": dict(extra or {})}
    try:
        tmp.mkdir()
        _write_files(tmp, model, tokenizer, optimizer, extra_writers, weights_dtype, state)
        _move_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    set_latest(root, final)
    if keep:
        prune_checkpoints(root, keep)
    return final


def _write_files(tmp: Path, model, tokenizer, optimizer,
                 extra_writers: Sequence[Callable[[Path], Any]], weights_dtype,
                 state: dict[str, Any]) -> None:
    """Weights, tokenizer, optimiser, the extra writers' files, then the state file that marks
    the directory complete; all synced to disk."""
    model.save_pretrained(tmp, safe_serialization=True,
                          state_dict=_cast_state(model, weights_dtype))
    tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        import torch

        torch.save(optimizer.state_dict(), tmp / OPTIMIZER_FILE)
    for write in extra_writers:
        write(tmp)
    with open(tmp / STATE_FILE, "w") as handle:  # last: marks the directory complete
        json.dump(state, handle, indent=2, sort_keys=True)
        handle.write("\n")
    _fsync_tree(tmp)


def _move_into_place(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`, replacing a checkpoint already there."""
    if final.exists():
        trash = final.parent / f".old-{final.name}-{uuid.uuid4().hex[:12]}"
        os.rename(final, trash)
        os.rename(tmp, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(final.parent)


def _cast_state(model, dtype) -> dict | None:
    """The model's state dict with floating tensors cast to `dtype` (None: as they are). Tensors
    that share storage (tied embeddings) stay shared, so the tie is still recognised on save."""
    if dtype is None:
        return None
    cast: dict[int, Any] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            out[name] = tensor
            continue
        key = tensor.data_ptr()
        if key not in cast:
            cast[key] = tensor.detach().to(dtype)
        out[name] = cast[key]
    return out


def set_latest(root: str | Path, checkpoint: str | Path) -> None:
    """Point ``root/latest`` at a checkpoint directory inside root (atomic replace)."""
    root = Path(root)
    target = Path(checkpoint).name
    tmp = root / f".{LATEST}.tmp-{uuid.uuid4().hex}"
    with open(tmp, "w") as handle:
        handle.write(target + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / LATEST)
    _fsync_dir(root)


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / STATE_FILE).is_file() and (path / "config.json").is_file()


def list_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under root as (step, path), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The checkpoint ``root/latest`` names if it is complete, else the complete one with the
    highest step, else None. `root` may also be a checkpoint directory itself."""
    root = Path(root)
    if is_complete(root) and _STEP_DIR.match(root.name):
        return root
    pointer = root / LATEST
    if pointer.is_file():
        name = pointer.read_text().strip()
        if _STEP_DIR.match(name) and is_complete(root / name):
            return root / name
    found = list_checkpoints(root)
    return found[-1][1] if found else None


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint (or of root's latest)."""
    resolved = resolve(path)
    return json.loads((resolved / STATE_FILE).read_text())


def resolve(path: str | Path) -> Path:
    """`path` when it is a complete checkpoint, else the latest complete one under it."""
    path = Path(path)
    if is_complete(path):
        return path
    resolved = latest_checkpoint(path)
    if resolved is None:
        raise FileNotFoundError(f"no complete checkpoint at or under {path}")
    return resolved


def prune_checkpoints(root: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (never the one `latest` names) and
    leftover temporary directories; returns what was deleted."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    root = Path(root)
    current = latest_checkpoint(root)
    removed = []
    for _, path in list_checkpoints(root)[:-keep]:
        if current is not None and path.resolve() == current.resolve():
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    for child in root.iterdir():
        # another writer's temporary directory is young; only sweep stale ones
        stale = time.time() - child.stat().st_mtime > 3600
        if child.name.startswith((".tmp-", ".old-")) and child.is_dir() and stale:
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed
