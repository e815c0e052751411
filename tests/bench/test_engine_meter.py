"""bench/_engine_meter.py: the CPU split the engine benches report, on real child processes."""

from __future__ import annotations

import subprocess
import sys

from .test_allocation_bench import _load

meter = _load("_engine_meter", "_engine_meter.py")

# Burns CPU, says so, then waits for stdin to close (so it is alive when sampled).
BURN = ("import sys, time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: "
        "pass\nprint('burnt', flush=True)\nsys.stdin.read()")


def _child(*title: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BURN, *title], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def test_engine_core_is_the_titled_child_and_part_of_the_engine():
    cpu = meter.CpuMeter(None)
    before = cpu.sample()
    core, model = _child("VLLM::EngineCore"), _child("VLLM::Worker")
    try:
        for child in (core, model):
            assert child.stdout.readline().strip() == "burnt"
        used = meter.CpuMeter.cores(before, cpu.sample(), 1.0)
    finally:
        for child in (core, model):
            child.stdin.close()
            child.wait(timeout=10)
    assert 0.25 <= used["engine-core"] < 0.5   # one child: 0.3 s burnt and its start-up
    assert used["engine"] >= used["engine-core"] + 0.25   # both children are the engine
    assert used["engine-core-waiting"] <= used["engine-waiting"]


def test_a_report_is_written_below_the_earlier_ones_only_when_asked(tmp_path, capsys):
    out = tmp_path / "results" / "r.txt"
    meter.publish_report("first\n", out, write=False)
    assert not out.exists() and "first" in capsys.readouterr().out
    meter.publish_report("first\n", out, write=True)
    meter.publish_report("second\n", out, write=True, append=True)
    assert out.read_text() == "first\n\n" + "=" * 100 + "\n\nsecond\n"
    meter.publish_report("third\n", out, write=True)
    assert out.read_text() == "third\n"
    assert meter.command_line("b.py", ["--out", "a b"]) == "python bench/b.py --out 'a b'"


def test_a_bench_sets_an_internal_setting_inside_the_serve_process(tmp_path):
    """`--work-floor` reaches the scheduler although no variable or flag can set it: the serve
    process is started through bench/_serve_internal.py (a real `sara serve`, /stats read)."""
    import httpx

    served = meter.ServeProcess(tmp_path / "floor", group_size=4, internal={"work_floor": 2.0},
                                env={"SARA_WORK_FLOOR": "3"}).start()
    try:
        config = httpx.get(f"{served.url}/stats", timeout=10).json()["config"]
        assert config["work_floor"] == 2.0 and config["group_size"] == 4
    finally:
        served.stop()
    plain = meter.ServeProcess(tmp_path / "plain", group_size=4,
                               env={"SARA_WORK_FLOOR": "3"}).start()
    try:
        assert httpx.get(f"{plain.url}/stats", timeout=10).json()["config"]["work_floor"] == 1.0
    finally:
        plain.stop()
