"""A workload held as columns reads back exactly the requests a list of objects held, and the
Poisson generator builds no object per request (a million of them are what overran 1 GB)."""
import pickle
import tracemalloc
from dataclasses import fields

import numpy as np
import pytest

from pddsim.config import BenchmarkSpec, PoissonSpec
from pddsim.intmath import ceil_div
from pddsim.workload.model import RequestColumns, TraceRequest, Workload
from pddsim.workload.synthetic import AgentSpec, _lognormal, _tokens, agent_workload, benchmark, poisson


def listed_poisson(spec: PoissonSpec, seed: int) -> list[TraceRequest]:
    """The Poisson generator as it was, one TraceRequest per request: the reference."""
    n, prefix, bt = spec.n_requests, spec.shared_prefix_tokens, spec.block_tokens
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / spec.rate_rps, n))
    inputs = prefix + _tokens(_lognormal(rng, spec.input_mean - prefix, spec.input_sigma, n))
    outputs = _tokens(_lognormal(rng, spec.output_mean, spec.output_sigma, n))
    shared = tuple(range(prefix // bt))
    fresh = ceil_div(inputs, bt) - len(shared)
    first_new = len(shared) + np.cumsum(fresh) - fresh
    return [TraceRequest(arrival_s=t, input_tokens=n_in, output_tokens=n_out,
                         hash_ids=shared + tuple(range(first, first + ceil_div(n_in, bt) - len(shared))),
                         block_tokens=bt)
            for t, n_in, n_out, first in zip(arrivals.tolist(), inputs.tolist(), outputs.tolist(),
                                             first_new.tolist())]


def same_fields(a: TraceRequest, b: TraceRequest) -> bool:
    """Equal field by field, each of the same Python type (an int64 is not an int)."""
    for f in fields(TraceRequest):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if x != y or type(x) is not type(y):
            return False
    return all(type(h) is int for h in a.hash_ids)


@pytest.mark.parametrize("spec", [
    PoissonSpec(n_requests=3000, rate_rps=40, input_mean=1000, output_mean=150, shared_prefix_tokens=512),
    PoissonSpec(n_requests=2000, rate_rps=3, input_mean=9000, output_mean=80, shared_prefix_tokens=700,
                block_tokens=64, input_sigma=0.4),
    PoissonSpec(n_requests=2000, rate_rps=1, input_mean=300, output_mean=20),
])
def test_poisson_columns_read_back_the_listed_requests(spec):
    columns = poisson(spec, 11).requests
    expected = listed_poisson(spec, 11)
    assert isinstance(columns, RequestColumns) and len(columns) == len(expected)
    assert all(same_fields(columns[i], r) for i, r in enumerate(expected))
    assert all(same_fields(a, b) for a, b in zip(columns, expected))          # iteration too
    assert repr(columns) == repr(expected)      # what the pinned digests hash


def test_generated_columns_equal_their_conversion_from_objects():
    """Benchmark and Agent workloads: the columns equal those built from their requests' objects."""
    for w in (benchmark(BenchmarkSpec(concurrency=4, isl=900, osl=50, isl_jitter=0.3), 2),
              agent_workload(AgentSpec(sessions=30, reset_prob=0.2), 5)):
        listed = list(w.requests)
        again = Workload(listed).requests
        assert all(same_fields(again[i], r) and same_fields(w.requests[i], r) for i, r in enumerate(listed))
        for name in RequestColumns.__slots__:
            assert np.array_equal(getattr(again, name), getattr(w.requests, name)), name


def test_poisson_builds_no_object_per_request():
    """200,000 requests as objects held 55 MB in 1.1 M blocks; as columns, 10 MB in tens."""
    spec = PoissonSpec(n_requests=200_000, rate_rps=40, input_mean=1000, output_mean=150,
                       shared_prefix_tokens=512)
    poisson(PoissonSpec(n_requests=10, rate_rps=1, input_mean=100, output_mean=10), 0)  # imports done
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        w = poisson(spec, 0)
        grown = tracemalloc.take_snapshot().compare_to(before, "filename")
    finally:
        tracemalloc.stop()
    blocks = sum(s.count_diff for s in grown)
    size = sum(s.size_diff for s in grown)
    assert len(w) == 200_000
    assert blocks < 1_000, blocks                       # objects: >= 1 block per request
    assert size < 200_000 * 80, size                    # 8 B a column, 8 B a hash id


def test_values_past_64_bits_and_int_arrivals_read_back_unchanged():
    """A column holds the objects themselves when a typed array would change them."""
    listed = [TraceRequest(0, 10, 2, (2 ** 70, 1)), TraceRequest(1.5, 2 ** 64, 2, (), session_id=3),
              TraceRequest(2.0, 10, 2, (5,), think_s=1, follows=0)]
    columns = Workload(listed).requests
    assert all(same_fields(columns[i], r) for i, r in enumerate(listed))
    assert repr(columns) == repr(listed)


def test_sequence_behaviour():
    listed = listed_poisson(PoissonSpec(n_requests=50, rate_rps=2, input_mean=2000, output_mean=10,
                                        shared_prefix_tokens=512), 3)
    columns = Workload(listed).requests
    assert columns == listed and listed == columns and columns != listed[:-1]
    assert columns[-1] == listed[-1] and columns[3:40:7] == listed[3:40:7]
    assert isinstance(columns[5:9], RequestColumns) and columns[5:9] == listed[5:9]
    assert columns.take(np.array([9, 2, 2])) == [listed[9], listed[2], listed[2]]
    assert columns[0:0] == [] and not Workload([]).requests
    with pytest.raises(IndexError):
        columns[50]
    with pytest.raises(ValueError):
        columns.arrival_s[0] = 1.0                      # read-only
    assert pickle.loads(pickle.dumps(columns)) == listed
