"""The demo's warm start: a tiny GPT-2 already taught the ``arith`` task, shipped in the package.

Why shipped: the same number of SFT steps does not give the same weights on every machine (the
initialisation follows the installed transformers, the float sums follow torch's thread count and
CPU kernels), and the warm start decides where RL begins. One set of bytes, checked by its
SHA-256 on every load, makes the demo start from the same policy everywhere.

The files live in ``sara_demo/assets/warmstart/`` (a Hugging Face model directory: config,
safetensors weights, character tokenizer) with ``warmstart.json``: the command and settings that
made them, the library versions, each file's SHA-256 and the greedy held-out accuracy measured
right after. Rebuild them with::

    python -m sara_demo.warmstart --out demo/sara_demo/assets/warmstart

(``build_warmstart`` below: 2,400 SFT steps on correct demonstrations, then 300 on
demonstrations that often drop the final carry digit; about nine minutes on 2 cores). A rebuild on another machine gives
close, not identical, weights: that is the reason the result is shipped.
"""

from __future__ import annotations

import hashlib
import json
import platform
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MANIFEST = "warmstart.json"
# buckets whose demonstrations forget the final carry digit, and how often: more than half the
# time, so the imitating policy's most likely answer is the slip and greedy decoding gets such
# problems wrong, while sampling still finds the right answer often: mixed groups, which RL with
# a verifier learns from (see arith.dropped_carry)
FLAWED_DEMONSTRATIONS = {"add2": 0.6, "add3": 0.6, "mul1": 0.6, "mul2": 0.6}
WEIGHTS = "model.safetensors"


def shipped_dir() -> Path:
    """The package's warm-start directory (it may be missing in a broken install)."""
    return Path(__file__).resolve().parent / "assets" / "warmstart"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(directory: Path | None = None) -> dict[str, Any]:
    """The manifest of a warm-start directory (default: the shipped one)."""
    path = (directory or shipped_dir()) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"no warm start at {path.parent}: {MANIFEST} is missing (rebuild "
                                "it with `python -m sara_demo.warmstart --out DIR`)")
    return json.loads(path.read_text())


def verified_warmstart(directory: Path | None = None) -> Path:
    """The warm-start directory after checking every file against its manifest's SHA-256.

    Raises ValueError naming the file when one differs: a changed warm start would silently
    change every demo figure."""
    directory = directory or shipped_dir()
    manifest = read_manifest(directory)
    for name, expected in manifest["sha256"].items():
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"warm start incomplete: {path} is missing")
        got = file_sha256(path)
        if got != expected:
            raise ValueError(f"warm start file {path} has SHA-256 {got[:16]}..., its manifest "
                             f"says {expected[:16]}...: reinstall the package or rebuild it")
    return directory


@dataclass(frozen=True)
class WarmstartRecipe:
    """How the shipped warm start is made, in two SFT phases from a fresh tiny GPT-2 (seed
    ``seed``): ``steps`` on correct demonstrations of every arith bucket (cosine from ``lr``),
    then ``slip_steps`` on demonstrations where a share of the ``flawed`` buckets' answers drop
    the final carry digit (cosine from ``slip_lr``). The second phase teaches one bad habit on
    top of real skill: what RL with a verifier is good at removing."""

    steps: int = 2400
    slip_steps: int = 300
    seed: int = 0
    lr: float = 3e-3
    slip_lr: float = 1e-3
    batch_size: int = 256
    threads: int = 2
    eval_size: int = 2000
    flawed: dict[str, float] = field(default_factory=lambda: dict(FLAWED_DEMONSTRATIONS))


def build_warmstart(out: str | Path, recipe: WarmstartRecipe = WarmstartRecipe(),
                    progress: bool = True) -> dict[str, Any]:
    """Train the warm start from a fresh tiny GPT-2 and write it, with its manifest, to `out`.

    Returns the manifest."""
    import torch

    from sara_trainer.policy import load_policy
    from sara_trainer.tiny import TinyConfig, build_tiny_policy

    from .evaluate import greedy_accuracy
    from .sft import sft
    from .tasks.arith import make_eval_set, training_pairs

    torch.set_num_threads(recipe.threads)
    out = Path(out)
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_policy(tmp, TinyConfig(seed=recipe.seed))
        model, tokenizer = load_policy(tmp)
    eval_set = make_eval_set(recipe.eval_size, seed=0)
    started = time.perf_counter()
    skill = sft(model, tokenizer, max_steps=recipe.steps, seed=recipe.seed, lr=recipe.lr,
                batch_size=recipe.batch_size, progress=progress)
    clean = greedy_accuracy(model, tokenizer, eval_set)
    slip = sft(model, tokenizer, max_steps=recipe.slip_steps, seed=recipe.seed + 1,
               lr=recipe.slip_lr, batch_size=recipe.batch_size, warmup_steps=10,
               pairs=training_pairs(recipe.seed + 1, flawed=recipe.flawed), progress=progress)
    accuracy = greedy_accuracy(model, tokenizer, eval_set)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    sft_figures = {"steps": skill.steps + slip.steps,
                   "seconds": round(time.perf_counter() - started, 1),
                   "final_loss_correct": skill.final_loss, "final_loss_flawed": slip.final_loss}
    manifest = _manifest(out, recipe, sft_figures, clean, accuracy)
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _manifest(out: Path, recipe: WarmstartRecipe, sft_figures: dict[str, Any],
              clean: dict[str, Any], accuracy: dict[str, Any]) -> dict[str, Any]:
    """The manifest: how the files were made, what they score, and each file's SHA-256."""
    return {
        "command": f"python -m sara_demo.warmstart --out {out}",
        "recipe": asdict(recipe),
        "sft": sft_figures,
        "heldout_greedy_accuracy_before_slips": clean["accuracy"],
        "heldout_greedy_accuracy": accuracy["accuracy"],
        "heldout_by_bucket": accuracy["by_bucket"],
        "made_with": library_versions(),
        "sha256": {p.name: file_sha256(p) for p in sorted(out.iterdir())
                   if p.is_file() and p.name != MANIFEST},
    }


def library_versions() -> dict[str, str]:
    """The versions a warm start was made with (its weights depend on them)."""
    from importlib.metadata import version

    return {"python": platform.python_version(), "torch": version("torch"),
            "transformers": version("transformers"), "machine": platform.machine()}


def rebuild_main(build: Any, description: str, argv: list[str] | None = None) -> None:
    """A rebuild command's main: ``--out DIR [--no-progress]``, then ``build(out, progress=)``;
    prints the figures the manifest records."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    manifest = build(args.out, progress=not args.no_progress)
    print(json.dumps({k: manifest[k] for k in ("sft", "heldout_greedy_accuracy")}, indent=1))


def main(argv: list[str] | None = None) -> None:
    """``python -m sara_demo.warmstart --out DIR``: rebuild the warm start."""
    rebuild_main(build_warmstart, main.__doc__, argv)


if __name__ == "__main__":
    main()
