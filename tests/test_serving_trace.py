"""The request trace of `benchmarks/bench_serving_gpu.py` (`benchmarks/serving_trace.py`, issue
56): counts, length ranges, the shared system prompt, seeding and Poisson arrivals. The module
is loaded from its file (benchmarks/ is not a package), without the benchmark's heavy imports."""

import importlib.util
from pathlib import Path

import numpy as np

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "serving_trace.py"
_SPEC = importlib.util.spec_from_file_location("serving_trace", _PATH)
serving_trace = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(serving_trace)


def test_issue_56_trace_has_its_counts_ranges_and_shared_prefix():
    """512 requests at t=0, exactly half starting with one 1,024-token system prompt (and no
    cold one sharing even its first 16-token block), prompts of 64-2,048 tokens (shared ones at
    least 1,088), outputs of 32-512, the same trace for the same seed and another for another."""
    trace = serving_trace.make_trace(512, seed=0)
    assert len(trace) == 512 and all(r.arrival == 0 for r in trace)
    shared = [r for r in trace if r.shared]
    cold = [r for r in trace if not r.shared]
    assert len(shared) == 256
    system = shared[0].token_ids[:1024]
    assert all(r.token_ids[:1024] == system for r in shared)
    assert all(r.token_ids[:16] != system[:16] for r in cold)
    assert min(len(r.token_ids) for r in cold) >= 64 and max(len(r.token_ids) for r in cold) <= 2048
    assert min(len(r.token_ids) for r in shared) >= 1088
    assert max(len(r.token_ids) for r in shared) <= 2048
    outputs = [r.max_new_tokens for r in trace]
    assert min(outputs) >= 32 and max(outputs) <= 512 and len(set(outputs)) > 100
    assert serving_trace.make_trace(512, seed=0) == trace
    assert serving_trace.make_trace(512, seed=1) != trace


def test_poisson_arrivals_keep_the_requests_and_have_the_rate():
    trace = serving_trace.make_trace(512, seed=0)
    timed = serving_trace.with_poisson_arrivals(trace, rate=4.0, seed=0)
    arrivals = np.array([r.arrival for r in timed])
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    assert 3.4 < 511 / arrivals[-1] < 4.6  # about 4 requests per second
    assert [r.token_ids for r in timed] == [r.token_ids for r in trace]
