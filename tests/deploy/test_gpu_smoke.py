"""scripts/gpu_smoke.sh, the first thing to run on a GPU machine: here in its CPU mode (the same
code path with --device cpu: tiny model built locally, `sara serve`, an hf worker, `sara train`
for 3 steps with micro-batch tokens and gradient checkpointing), plus its verdict on logs that
show a vLLM engine rebuilt instead of reloaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_smoke.sh"
HELPER = ROOT / "scripts" / "gpu_smoke.py"

STEP_LINES = "".join(f"INFO sara.trainer: step {i} v{i}: 4 groups, reward 0.500, loss 0.0100, "
                     f"0.2{i}s\n" for i in (1, 2, 3))
MEASURED = ("sara: memory measured over the first step (GiB): peak allocated 0.040; the "
            "estimate of the same 0.050 ({ratio}x the measured)\n")
TRAINER_LOG = ("sara: trainer on cuda: weights float32, compute bfloat16; activations 30.3 KiB a "
               "token in rows of 64 (measured); the memory estimate comes with the first batch\n"
               "sara: memory estimate (GiB): params 0.002; total 0.050 for micro-batches of up to "
               "16 rows of 20 tokens\n" + MEASURED.format(ratio="1.25") + STEP_LINES +
               "smoke: trainer peak host RSS 0.40 GiB; peak CUDA memory allocated 0.100 GiB, "
               "reserved 0.200 GiB\n")


@pytest.mark.parametrize("script", ["gpu_smoke.sh", "gpu_smoke_wheels.sh"])
def test_scripts_parse(script):
    subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)


def _verdict(tmp_path, vllm_log: str | None, steps: int = 3, rc: int = 0,
             trainer_log: str = TRAINER_LOG):
    (tmp_path / "trainer.log").write_text(trainer_log)
    (tmp_path / "worker-hf.log").write_text("hf backend now at policy v1 (/c/1)\n")
    if vllm_log is not None:
        (tmp_path / "worker-vllm.log").write_text(vllm_log)
    proc = subprocess.run([sys.executable, str(HELPER), "summary", str(tmp_path), str(steps),
                           "1" if vllm_log is not None else "0", str(rc)],
                          capture_output=True, text=True)
    return proc.returncode, json.loads((tmp_path / "summary.json").read_text())


def test_verdict_passes_in_place_reloads(tmp_path):
    log = ("starting vLLM engine on /m\nweight updates: reload (in place, paused); ...\n"
           "vllm backend now at policy v1 (/c/1)\nvllm backend now at policy v2 (/c/2)\n")
    rc, s = _verdict(tmp_path, log)
    assert rc == 0 and s["result"] == "ok"
    assert s["step_seconds"] == [0.21, 0.22, 0.23]
    assert s["memory_estimate"].startswith("memory estimate (GiB)")
    assert "peak CUDA memory allocated 0.100 GiB" in s["peak_memory"]
    assert s["memory_estimate_ratio"] == 1.25
    assert s["workers"]["worker-vllm"]["policy_loads"] == 2


def test_verdict_fails_a_rebuilt_engine_missing_steps_and_a_failed_trainer(tmp_path):
    log = ("starting vLLM engine on /m\nin-place weight reload failed (X: y); restarting the "
           "engine on /c/1\nstarting vLLM engine on /c/1\nvllm backend now at policy v1 (/c/1)\n")
    rc, s = _verdict(tmp_path, log, steps=5, rc=124)
    assert rc == 1
    assert "vLLM did not reload in place" in s["result"]
    assert "3 of 5 steps logged" in s["result"] and "timed out" in s["result"]


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_cpu_run_trains_through_the_whole_stack(tmp_path):
    for name in ("torch", "transformers", "sara_service", "sara_worker", "sara_trainer"):
        pytest.importorskip(name)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(out), "TMPDIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(SCRIPT), "--device", "cpu"], capture_output=True,
                          text=True, timeout=280, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["result"] == "ok" and [x["step"] for x in s["steps"]] == [1, 2, 3]
    assert s["trainer_start_line"].startswith("trainer on cpu")
    assert s["memory_estimate"] and "peak host RSS" in s["peak_memory"]
    assert s["workers"]["worker-hf"]["policy_loads"] >= 1
    log = (out / "gpu_smoke.log").read_text()
    assert "nvidia-smi" in log and "torch.cuda" in log and "vLLM worker: not run" in log
    # a device run returns at most 8 files from $OUT: the script writes 7 there at most
    assert len([p for p in out.rglob("*") if p.is_file()]) <= 8


def test_bench_command_runs_a_bench_script_with_the_repo_packages():
    """`gpu_smoke.py bench NAME ARGS` is how the GPU run reaches bench/engine_time.py."""
    proc = subprocess.run([sys.executable, str(HELPER), "bench", "engine_time", "--policies",
                           "nope"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown nope" in proc.stderr, proc.stderr[-2000:]
    missing = subprocess.run([sys.executable, str(HELPER), "bench", "no_such_bench"],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no bench script" in missing.stdout


def test_verdict_fails_an_estimate_off_by_more_than_2x(tmp_path):
    rc, s = _verdict(tmp_path, None, trainer_log=TRAINER_LOG.replace(
        MEASURED.format(ratio="1.25"), MEASURED.format(ratio="3.10")))
    assert rc == 1 and s["memory_estimate_ratio"] == 3.1
    assert "the memory estimate is 3.1x" in s["result"]


def test_the_engine_lines_give_ds_and_sara_occupancy_and_effective_groups(tmp_path):
    """What the GPU run prints after engine_time: each policy's occupancy and effective groups
    per engine-second at the defaults, and SARA's gain over DS."""
    result = {"policies": {
        "ds": {"engine_occupancy": 0.99, "engine_occupancy_ci95": 0.01,
               "effective_groups_per_engine_s": 9.1, "effective_groups_per_engine_s_ci95": 0.6,
               "batches_in_flight": 0.6},
        "sara": {"engine_occupancy": 0.97, "effective_groups_per_engine_s": 11.0,
                 "batches_in_flight": 0.8, "engine_gain_vs_ds": 1.21, "saving_kept": 0.97}}}
    path = tmp_path / "engine_time.json"
    path.write_text(json.dumps(result))
    proc = subprocess.run([sys.executable, str(HELPER), "engine", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].split() == ["DS", "occupancy", "99%", "±", "1,", "9.10", "±", "0.60",
                                "effective", "groups", "/", "engine-s,", "age", "0.60", "batches"]
    assert "SARA  occupancy 97%" in lines[2] and "11.00" in lines[2]
    assert "SARA / DS effective groups per engine-s: 1.21" in lines[3] and "0.97" in lines[3]
    missing = subprocess.run([sys.executable, str(HELPER), "engine", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no engine-time result" in missing.stdout
