"""Performance models on hand-computed cases."""

import numpy as np
import pytest

from pddsim import catalog
from pddsim.engine.perf import LinearRun, MeasuredTable, Roofline


def bare(name: str) -> catalog.ModelSpec:
    """A catalog model without its LM head and KV heads told apart: the hand computations below
    count every active parameter for every token and split the KV over any TP (those two are
    tested on their own)."""
    return catalog.model(name).model_copy(update={"vocab_size": 0, "kv_heads": None})


LLAMA = bare("llama-3.1-70b")
H100 = catalog.gpu("h100-sxm")
B200 = catalog.gpu("b200")
HBM8 = 8 * 3.35e12                                     # bytes/s of 8 x H100 at the peak


IDEAL = catalog.EngineProfile(name="ideal", linear_bf16=1, linear_fp8=1, attn_prefill=1,
                              attn_decode=1, memory=1, overhead_ms=0, allreduce_base_us=0,
                              allreduce_step_us=0)


def roofline(tp=1, model=LLAMA, gpu=H100, **engine):
    """The roofline at the hardware's peaks, with no fixed costs unless given."""
    return Roofline(model, gpu, tp, IDEAL.model_copy(update=engine))


def test_single_token_decode_is_the_weight_read():
    assert roofline().iteration(1, 0, 0) == pytest.approx(70.6e9 * 2 / 3.35e12)


def test_large_prefill_is_compute_bound():
    t, pairs = 8192, 8192 * 4096                        # causal: each token sees half the chunk
    flops = t * 2 * 70.6e9 + pairs * 4 * 64 * 128 * 80
    assert roofline().iteration(t, pairs, 0) == pytest.approx(flops / 989.4e12)


def test_decode_slows_as_every_context_is_read():
    p = roofline()
    assert p.iteration(64, 64 * 32000, 64 * 32000) == pytest.approx(
        (141.2e9 + 64 * 32000 * 327_680) / 3.35e12)


def test_small_prefill_chunks_cost_more_per_token():
    p = roofline(overhead_ms=2)

    def per_token(c):
        return p.iteration(c, c * c / 2, 0) / c
    assert per_token(64) > 4 * per_token(4096)      # the weight read and overhead dominate


def test_tensor_parallel_adds_ring_all_reduces():
    """Two all-reduces per layer: latency base + step x 2(n-1), then 2(n-1)/n of the payload
    over the bus bandwidth H100s reach (360 GB/s, below NVLink 4's 450 GB/s each way)."""
    p1 = roofline()
    for tp in (2, 4, 8):
        p = roofline(tp, allreduce_base_us=10, allreduce_step_us=2)
        latency = 160 * (10e-6 + 2e-6 * 2 * (tp - 1))
        for tokens in (1, 4096):
            payload = 160 * 2 * (tp - 1) / tp * tokens * 8192 * 2 / 360e9
            assert p.iteration(tokens, 0, 0) == pytest.approx(
                p1.iteration(tokens, 0, 0) / tp + latency + payload)


def test_fixed_costs_do_not_shrink_with_tp():
    """Batch-1 decode gains little from TP2 to TP8 once the overhead and all-reduce latency
    are counted: the weight read shrinks 4x, the rest grows."""
    times = {tp: roofline(tp, overhead_ms=10, allreduce_base_us=20, allreduce_step_us=5)
             .iteration(1, 1000, 1000, 1000) for tp in (2, 8)}
    assert times[8] > 0.5 * times[2]
    assert roofline(8, overhead_ms=10).iteration(1, 0, 0) > 0.010


def test_moe_reads_more_experts_as_the_batch_grows():
    qwen = bare("qwen3-235b-a22b")
    p = roofline(8, model=qwen)
    assert p.weights_read_s(1) * HBM8 == pytest.approx(22e9 * 2)      # one token reads its active params
    assert p.weights_read_s(4096) * HBM8 == pytest.approx(qwen.weight_bytes, rel=1e-6)


def test_moe_shared_experts_are_always_read():
    """DeepSeek-V3: 17.0B shared (attention, shared experts, dense layers, embeddings) are read
    by any batch; each token reads (37 - 17) / (671 - 17) of the routed experts."""
    p = roofline(8, model=bare("deepseek-v3"))
    share = 20 / 654
    for tokens in (1, 2, 16):
        expected = 17.0e9 + 654e9 * (1 - (1 - share) ** tokens)      # FP8: one byte a weight
        assert p.weights_read_s(tokens) * HBM8 == pytest.approx(expected)
    # treating every parameter as routed would read only 37B at one token but 72B at two
    assert p.weights_read_s(2) * HBM8 < 671e9 * (1 - (1 - 37 / 671) ** 2)


def test_w4a16_weights_are_read_as_int4_but_computed_at_the_bf16_peak():
    pdd = bare("pdd-1t-moe")
    p = roofline(8, model=pdd)
    tokens = 16384                                         # compute-bound, no attention
    assert p.iteration(tokens, 0, 0) == pytest.approx(
        tokens * 2 * 32e9 / (8 * 989.4e12) + tokens * p.comm_s_per_token)
    assert p.weights_read_s(10**6) * HBM8 == pytest.approx(1040e9 * 0.5)


def test_fp8_compute_runs_at_the_fp8_peak():
    p = roofline(8, model=bare("deepseek-v3"))
    tokens = 16384
    assert p.iteration(tokens, 0, 0) == pytest.approx(
        tokens * 2 * 37e9 / (8 * 1978.9e12) + tokens * p.comm_s_per_token)


def test_mla_prefill_attends_unabsorbed_and_decode_absorbed():
    """DeepSeek-V3 per layer: prefill 2*128*(128+64) + 2*128*128 = 81,920 FLOPs per pair,
    decode 2*128*(512+64) + 2*128*512 = 278,528; 61 layers."""
    p = roofline(1, model=bare("deepseek-v3"))
    t, pairs = 8192, 8192 * (100_000 + 4096)
    linear = t * 2 * 37e9 / 1978.9e12                  # FP8 matmuls; attention runs in BF16
    assert p.iteration(t, pairs, 100_000) == pytest.approx(linear + pairs * 61 * 81_920 / 989.4e12)
    # the same pairs attended by decode tokens cost the absorbed rate
    assert p.iteration(t, pairs, 100_000, pairs) == pytest.approx(
        linear + pairs * 61 * 278_528 / 989.4e12)
    # a mixed iteration prices each part at its rate
    mixed = p.iteration(t, pairs + 64 * 50_000, 100_000, 64 * 50_000)
    assert mixed == pytest.approx(linear + (pairs * 61 * 81_920 + 64 * 50_000 * 61 * 278_528)
                                  / 989.4e12)
    # a decode run uses the absorbed cost too
    compute_bound = roofline(1, model=bare("deepseek-v3"), linear_fp8=1e-3, attn_decode=1e-3)
    run = compute_bound.decode_run(4, 4 * 10_000, 1)
    assert run.total_s == pytest.approx(4 * 2 * 37e9 / (1978.9e12 * 1e-3)
                                        + 40_000 * 61 * 278_528 / (989.4e12 * 1e-3))


def test_decode_run_closed_form_matches_iteration_by_iteration():
    rng = np.random.default_rng(0)
    for _ in range(500):
        a, b, c, d = rng.uniform(0, 1, 4) * [1, rng.choice([0, 0.01, 1]), 1, rng.choice([0, 0.01, 1])]
        k, fixed = int(rng.integers(1, 60)), rng.uniform(0, 0.1)
        run = LinearRun((a, b), (c, d), fixed, k)
        times = np.maximum(a + b * np.arange(k), c + d * np.arange(k)) + fixed
        for m in range(k + 1):
            assert run.elapsed(m) == pytest.approx(times[:m].sum(), abs=1e-9)
        assert run.longest(k) == pytest.approx(times.max())
        t = rng.uniform(0, times.sum())
        assert run.cut(t) == min(int(np.searchsorted(np.cumsum(times), t)) + 1, k)


def test_roofline_decode_run_agrees_with_single_iterations():
    p = roofline(8, overhead_ms=2, allreduce_base_us=8, allreduce_step_us=1)
    run = p.decode_run(32, 32 * 5000, 100)
    singles = [p.iteration(32, 32 * 5000 + 32 * i, 32 * 5000 + 32 * i) for i in range(100)]
    assert run.total_s == pytest.approx(sum(singles))


def test_vector_iterations_match_single_ones():
    p = roofline(8, overhead_ms=2, allreduce_base_us=8, allreduce_step_us=1)
    tokens, pairs, kv = np.array([1, 64, 8192]), np.array([0, 64 * 900, 8192 * 4096]), np.array([0, 900, 0])
    assert p.iterations(tokens, pairs, kv) == pytest.approx(
        [p.iteration(t, a, k) for t, a, k in zip(tokens.tolist(), pairs.tolist(), kv.tolist())])
    assert p.iterations(tokens, pairs, kv, pairs) == pytest.approx(
        [p.iteration(t, a, k, a) for t, a, k in zip(tokens.tolist(), pairs.tolist(), kv.tolist())])


def test_measured_table_interpolates_bilinearly(perf_table, tmp_path):
    table = MeasuredTable(perf_table(tmp_path / "t.csv", 0.01, 1e-5))
    assert table.iteration(500, 0, 123) == pytest.approx(0.01 + 500e-5)
    run = table.decode_run(4, 100, 10)
    assert run.total_s == pytest.approx(10 * (0.01 + 4e-5))


def write_table(path, rows):
    path.write_text("phase,tokens,context,time_s\n" + "".join(f"{r}\n" for r in rows))
    return path


def two_phase_table(tmp_path):
    """prefill: 1 ms + 1 us/token + 1 ns per token x prefix token; decode: 2 ms + 0.1 us per KV
    token read."""
    rows = [f"prefill,{t},{c},{1e-3 + 1e-6 * t + 1e-9 * t * c}" for t in (100, 1000) for c in (0, 4000)]
    rows += [f"decode,{n},{c},{2e-3 + 1e-7 * n * c}" for n in (1, 64) for c in (100, 10_000)]
    return MeasuredTable(write_table(tmp_path / "t.csv", rows))


def test_measured_table_prices_prefill_by_attention_and_decode_by_kv(tmp_path):
    table = two_phase_table(tmp_path)
    # corner cells reproduce the measured points
    assert table.iteration(1000, 1000 * 4500, 4000) == pytest.approx(1e-3 + 1e-3 + 4e-3)
    # a chunk of 550 tokens over a 2,000-token prefix: bilinear between the four cells
    t, c = 550, 2000
    cells = {(a, b): 1e-3 + 1e-6 * a + 1e-9 * a * b for a in (100, 1000) for b in (0, 4000)}
    fx, fy = (t - 100) / 900, c / 4000
    expected = ((1 - fx) * (1 - fy) * cells[100, 0] + fx * (1 - fy) * cells[1000, 0]
                + (1 - fx) * fy * cells[100, 4000] + fx * fy * cells[1000, 4000])
    assert table.iteration(t, t * (c + t / 2), c) == pytest.approx(expected)
    # a decode iteration: every pair is a decode pair; priced by the KV each request reads
    assert table.iteration(1, 5000, 5000, 5000) == pytest.approx(2e-3 + 1e-7 * 5000)
    run = table.decode_run(1, 5000, 3)
    assert run.total_s == pytest.approx(sum(2e-3 + 1e-7 * (5000 + i) for i in range(3)))


def test_measured_table_refuses_cells_out_of_range(tmp_path):
    from pddsim.errors import InputError
    table = two_phase_table(tmp_path)
    with pytest.raises(InputError, match="decode iteration of 128 tokens .* outside the measured"):
        table.decode_run(128, 128 * 500, 1)
    with pytest.raises(InputError, match="prefill iteration of 1000 tokens at context 8000"):
        table.iteration(1000, 1000 * 8500, 8000)


def test_measured_table_rejects_a_ragged_grid(tmp_path):
    from pddsim.errors import InputError
    path = write_table(tmp_path / "t.csv", ["prefill,1,0,0.1", "prefill,2,0,0.2", "prefill,1,5,0.1",
                                            "decode,1,0,0.1"])
    with pytest.raises(InputError, match="prefill rows must be a full grid.*tokens=2 context=5"):
        MeasuredTable(path)


def test_roofline_from_config_applies_the_config_overrides_to_its_profile():
    from pddsim import catalog
    from pddsim.config import Perf
    from pddsim.engine.perf import Roofline
    model, gpu = catalog.model("llama-3.1-70b"), catalog.gpu("h100-sxm")
    perf = Perf(memory=0.5, overhead_ms=3)
    engine = catalog.engine(perf.engine).model_copy(update={"memory": 0.5, "overhead_ms": 3})
    direct = Roofline(model, gpu, 8, engine)
    built = Roofline.from_config(model, gpu, 8, perf)
    default = Roofline.from_config(model, gpu, 8, Perf())
    for args in ((1, 1000, 1000), (4096, 4096 * 2048, 8192)):
        assert built.iteration(*args) == direct.iteration(*args) != default.iteration(*args)


def test_decode_run_cut_is_the_binary_search_over_prefix_sums():
    """Exactness: the closed-form guess in `cut` only shortcuts the search, across runs whose
    dominant roofline term switches mid-run, flat runs, and times at and between boundaries."""
    def searched(run, t):
        lo, hi = 1, run.k
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if run.elapsed(mid) >= t else (mid + 1, hi)
        return lo

    rng = np.random.default_rng(3)
    for _ in range(3000):
        slope = lambda: float(rng.choice([0.0, rng.uniform(0, 1e-4)]))  # noqa: E731
        run = LinearRun((rng.uniform(0, 0.05), slope()),
                        (rng.uniform(0, 0.05), slope()), rng.uniform(0, 0.01),
                        int(rng.integers(1, 3000)))
        ends = [run.elapsed(m) for m in (1, run.k // 2 or 1, run.k)]
        for t in [0.0, *ends, *rng.uniform(0, run.total_s * 1.1, 4)]:
            assert run.cut(t) == searched(run, t)


def test_host_launch_floor_by_hand():
    """80 layers x 100 us of launches = 8 ms of host time: a batch-1 decode on 8 H100s reads
    141.2 GB of weights in 5.27 ms, so the host paces it (8 ms + the 2 ms overhead); a 16k-token
    prefill (GPU work ~ 2.4 s) does not notice the floor."""
    eager = roofline(8, overhead_ms=2, host_layer_us=100)
    graph = roofline(8, overhead_ms=2)
    payload = 160 * 2 * 7 / 8 * 8192 * 2 / 360e9           # two all-reduces a layer, one token
    assert graph.iteration(1, 0, 0) == pytest.approx(141.2e9 / HBM8 + payload + 2e-3)
    assert eager.iteration(1, 0, 0) == pytest.approx(80 * 100e-6 + 2e-3)
    assert eager.iteration(16384, 16384 * 8192, 0) == graph.iteration(16384, 16384 * 8192, 0)
    # the floor does not shrink with TP: on 2 GPUs the 21 ms weight read is above it
    assert roofline(2, overhead_ms=2, host_layer_us=100).iteration(1, 0, 0) == pytest.approx(
        141.2e9 / (2 * 3.35e12) + 160 * 8192 * 2 / 360e9 + 2e-3)
    vector = eager.iterations(np.array([1, 16384]), np.array([0, 16384 * 8192]), np.array([0, 0]))
    assert vector.tolist() == [eager.iteration(1, 0, 0), eager.iteration(16384, 16384 * 8192, 0)]


def test_host_launch_figure_per_gpu():
    from pddsim.errors import InputError
    per_gpu = {"h100-sxm": 100.0, "a100-80gb": 300.0}
    assert roofline(8, host_layer_us=per_gpu).iteration(1, 0, 0) == pytest.approx(80 * 100e-6)
    a100 = catalog.gpu("a100-80gb")
    assert roofline(8, gpu=a100, host_layer_us=per_gpu).iteration(1, 0, 0) == pytest.approx(80 * 300e-6)
    with pytest.raises(InputError, match="no host_layer_us for GPU 'h200'"):
        roofline(8, gpu=catalog.gpu("h200"), host_layer_us=per_gpu)
    with pytest.raises(ValueError, match="engines.mine.host_layer_us: unknown GPU 'h100'"):
        catalog.Catalog(engines={"mine": {**IDEAL.model_dump(exclude={"name"}),
                                          "host_layer_us": {"h100": 5}}})


def test_a_zero_floor_changes_nothing_and_a_floored_run_matches_its_iterations():
    """host_layer_us 0 gives the very same numbers as before (the paper's graph-captured profile
    relies on it); with a floor, a decode run whose first iterations are host-bound and later ones
    GPU-bound (contexts grow) sums, cuts and peaks as its single iterations do."""
    base = roofline(8, overhead_ms=2, allreduce_base_us=8, allreduce_step_us=1)
    zero = roofline(8, overhead_ms=2, allreduce_base_us=8, allreduce_step_us=1, host_layer_us=0)
    assert zero.iteration(7, 7 * 900, 900) == base.iteration(7, 7 * 900, 900)
    assert type(zero.decode_run(4, 4000, 50)) is LinearRun
    for host_us, n, ctx, k, held in ((97, 64, 64 * 2000, 400, "some"), (500, 1, 0, 30, "all"),
                                     (1, 1, 0, 5, "none")):
        p = roofline(8, overhead_ms=2, host_layer_us=host_us)
        run = p.decode_run(n, ctx, k)
        singles = np.array([p.iteration(n, ctx + n * i, ctx + n * i, ctx + n * i) for i in range(k)])
        on_floor = int((singles == float(p.floor_s(n))).sum())
        assert {"none": on_floor == 0, "all": on_floor == k, "some": 0 < on_floor < k}[held]
        for m in range(k + 1):
            assert run.elapsed(m) == pytest.approx(singles[:m].sum(), abs=1e-12)
        assert run.first_s == pytest.approx(singles[0]) and run.longest(k) == pytest.approx(singles.max())
        cum = np.cumsum(singles)
        for t in [0.0, *cum[[0, k // 2, -1]], *np.linspace(0, cum[-1] * 1.1, 37)]:
            m = run.cut(t)
            assert run.elapsed(m) >= t or m == k
            assert m == 1 or run.elapsed(m - 1) < t


# -- serving engines' costs and parallel layouts ---------------------------------------------------

def test_lm_head_is_computed_for_sampled_tokens_and_the_embedding_is_a_lookup():
    """Llama-3.1-70B: 128,256 x 8,192 per matrix; a prefill of T tokens of one request runs the
    head once, a decode of n requests n times; the input embedding is gathered, never read whole."""
    full = catalog.model("llama-3.1-70b")
    head = 128_256 * 8_192
    p = roofline(model=full)
    t = 8192
    assert p.iteration(t, 0, 0, requests=1) == pytest.approx(
        (2 * (70.6e9 - 2 * head) * t + 2 * head) / 989.4e12)
    assert p.weights_read_s(1) * 3.35e12 == pytest.approx((70.6e9 - head) * 2)
    assert p.iteration(64, 0, 0, requests=64) < roofline().iteration(64, 0, 0, requests=64)


def test_kv_is_replicated_past_the_kv_heads_and_split_by_attention_data_parallelism():
    mla = catalog.model("deepseek-v3")                       # one latent head
    one, eight = Roofline(mla, H100, 1, IDEAL), Roofline(mla, H100, 8, IDEAL)
    assert eight.s_per_kv_token == one.s_per_kv_token         # each of 8 GPUs reads it all
    dp = Roofline(mla, H100, 1, IDEAL, dp=8, ep=8)
    assert dp.s_per_kv_token == pytest.approx(one.s_per_kv_token / 8)   # each rank its own
    # the non-expert weights are replicated per rank, the experts spread over all GPUs
    assert dp.shared_s == pytest.approx(one.shared_s) and dp.routed_s == pytest.approx(eight.routed_s)
    gqa = catalog.model("llama-3.1-70b")                     # 8 KV heads
    assert Roofline(gqa, H100, 16, IDEAL).s_per_kv_token == pytest.approx(
        Roofline(gqa, H100, 8, IDEAL).s_per_kv_token)


def test_grouped_gemms_pay_a_fixed_cost_per_touched_expert():
    """With expert_tokens_half m, a compute-bound MoE iteration costs m tokens' worth more per
    expert it touches: half the efficiency at m tokens per expert."""
    qwen = bare("qwen3-235b-a22b")
    routed_active = 22e9 - qwen.shared_params
    plain = roofline(1, model=qwen)                        # one GPU: no all-reduces
    grouped = roofline(1, model=qwen, grouped_gemm=0.5, expert_tokens_half=64)
    t = 65536                                              # every expert touched
    dense_part = 2 * (qwen.shared_params) * t / 989.4e12
    routed_part = 2 * (routed_active * t + 64 * qwen.routed_params) / (989.4e12 * 0.5)
    assert grouped.iteration(t, 0, 0) == pytest.approx(dense_part + routed_part, rel=1e-6)
    assert plain.iteration(t, 0, 0) == pytest.approx(2 * 22e9 * t / 989.4e12)


def test_expert_parallel_all_to_alls():
    """A dispatch and a combine per MoE layer: each GPU sends its tokens' k hidden vectors (BF16),
    (ep-1)/ep of them to other GPUs, over NVLink at 450 GB/s each way, plus a latency each."""
    dsv3 = bare("deepseek-v3")
    base = roofline(8, model=dsv3)
    ep = Roofline(dsv3, H100, 8, IDEAL.model_copy(update={"alltoall_us": 20}), ep=8)
    t = 1024
    payload = 2 * 58 * t * 8 * 7168 * 2 * (7 / 8) / 8 / 450e9
    assert ep.iteration(t, 0, 0) - base.iteration(t, 0, 0) == pytest.approx(payload + 2 * 58 * 20e-6)
    # each further peer adds its message's latency: 7 peers at EP8, 63 at EP64
    wide = IDEAL.model_copy(update={"alltoall_us": 20, "alltoall_step_us": 1.5})
    for n in (8, 64):
        stepped = Roofline(dsv3, H100, 8, wide, ep=n).iteration(t, 0, 0)
        flat = Roofline(dsv3, H100, 8, IDEAL.model_copy(update={"alltoall_us": 20}), ep=n)
        assert stepped - flat.iteration(t, 0, 0) == pytest.approx(2 * 58 * 1.5e-6 * (n - 1))


def test_all_to_alls_past_the_nvlink_domain_pay_the_scale_out_latency():
    """Expert parallelism over 16 H100s (two 8-GPU NVLink domains) pays the engine's scale-out
    latency on each dispatch and combine; the same 16 GPUs in one 72-GPU NVLink domain do not,
    nor do 8 GPUs in one node."""
    dsv3 = bare("deepseek-v3")
    engine = IDEAL.model_copy(update={"alltoall_us": 20, "alltoall_scaleout_us": 100})
    rack = H100.model_copy(update={"nvlink_domain": 72})

    def extra(gpu, dp):
        t = 1024
        return (Roofline(dsv3, gpu, 8, engine, dp=dp, ep=8 * dp).iteration(t, 0, 0)
                - Roofline(dsv3, gpu, 8, IDEAL.model_copy(update={"alltoall_us": 20}), dp=dp,
                           ep=8 * dp).iteration(t, 0, 0))
    assert extra(H100, 2) == pytest.approx(2 * 58 * 100e-6)
    assert extra(rack, 2) == 0.0
    assert extra(H100, 1) == 0.0


def test_attention_data_parallel_ranks_hold_whole_requests():
    """With attention data parallelism each request lives on one rank: a lone prompt on a worker
    of 4 ranks takes as long as on one rank alone (the other three idle), and 4 decoders, one a
    rank, as long as one decoder on one rank; 2,048 prompt tokens of which one request holds 896
    wait for the rank holding it (at 512 a rank they are balanced). One rank: nothing changes."""
    dense = LLAMA
    one, four = Roofline(dense, H100, 1, IDEAL), Roofline(dense, H100, 1, IDEAL, dp=4)
    assert four.iteration(1024, 1024 * 512, 0) == pytest.approx(one.iteration(1024, 1024 * 512, 0))
    assert four.iteration(4, 4 * 900, 4 * 900, 4 * 900) == pytest.approx(
        one.iteration(1, 900, 900, 900))
    assert four.decode_run(4, 4 * 900, 3).first_s == pytest.approx(one.decode_run(1, 900, 3).first_s)
    even = four.iteration(8 * 256, 0, 0, requests=8)
    assert four.iteration(8 * 256, 0, 0, requests=8, largest=896) == pytest.approx(even * 896 / 512)
    assert four.iteration(8 * 256, 0, 0, requests=8, largest=256) == even
    assert one.iteration(8 * 256, 0, 0, requests=8, largest=8 * 256) == one.iteration(8 * 256, 0, 0)


def test_a_prefill_chunk_on_one_rank_leaves_the_decoders_at_their_even_share():
    """In a mixed iteration on attention data-parallel ranks the rank holding the prefill chunk
    paces the dense layers, but the decoders live on every rank: each of 4 ranks reads a quarter
    of their KV whether or not a chunk rides along (it was priced at the chunk rank's pace, here
    2x, when one factor scaled all the work). Memory-bound: more decode context costs its even
    share of KV reads, with the chunk or without, on 1 rank or 4."""
    llama = catalog.model("llama-3.1-70b")

    def mixed(p, ctx):                  # a 64-token chunk beside 64 decoders of `ctx` in all
        return p.iteration(128, 64 * 32 + ctx, ctx, ctx, requests=65, largest=64)

    def decode(p, ctx):
        return p.iteration(64, ctx, ctx, ctx, requests=64)
    ctx = 64 * 8000
    for dp in (1, 4):
        p = Roofline(llama, H100, 1, IDEAL, dp=dp)
        assert mixed(p, 2 * ctx) - mixed(p, ctx) == pytest.approx(ctx * p.s_per_kv_token)
        assert decode(p, 2 * ctx) - decode(p, ctx) == pytest.approx(ctx * p.s_per_kv_token)


def test_collectives_past_the_nvlink_domain_cross_each_gpus_nic():
    """An all-reduce over two H100 nodes is hierarchical: the in-node ring on the full payload,
    then each GPU's 1/8 across the nodes over its own 400 Gbit/s NIC; an all-to-all over 16 GPUs
    sends 7/16 of its bytes over NVLink and 8/16 over the NIC at once. Both cost more than inside
    one node and far less than a flat ring at the NIC's rate; a faster NIC never slows them."""
    inside = 2 * 7 / 8 / 360e9
    assert H100.allreduce_s_per_byte(8) == pytest.approx(inside)
    assert H100.allreduce_s_per_byte(16) == pytest.approx(inside + 2 * (1 / 2) / 8 / 50e9)
    assert H100.allreduce_s_per_byte(16) < 2 * 15 / 16 / 50e9
    assert H100.alltoall_s_per_byte(8) == pytest.approx(7 / 8 / 450e9)
    assert H100.alltoall_s_per_byte(16) == pytest.approx(8 / 16 / 50e9)
    faster = H100.model_copy(update={"nic_gbps": 800})
    for gpus in (1, 8, 16, 32, 64):
        assert faster.allreduce_s_per_byte(gpus) <= H100.allreduce_s_per_byte(gpus)
        assert faster.alltoall_s_per_byte(gpus) <= H100.alltoall_s_per_byte(gpus)
        assert H100.allreduce_s_per_byte(gpus) <= H100.allreduce_s_per_byte(2 * gpus)
    assert H100.allreduce_s_per_byte(1) == H100.alltoall_s_per_byte(1) == 0.0


def test_overlapped_cpu_work_bounds_the_iteration_instead_of_adding():
    added = roofline(8, overhead_ms=3, seq_us=50)
    overlapped = roofline(8, overhead_ms=3, seq_us=50, overlap=True)
    gpu = roofline(8).iteration(64, 64 * 1000, 64 * 1000, 64 * 1000)
    cpu = 3e-3 + 64 * 50e-6
    assert added.iteration(64, 64 * 1000, 64 * 1000, 64 * 1000) == pytest.approx(gpu + cpu)
    assert overlapped.iteration(64, 64 * 1000, 64 * 1000, 64 * 1000) == pytest.approx(max(gpu, cpu))
    for p in (added, overlapped):
        run = p.decode_run(64, 64 * 1000, 20)
        singles = [p.iteration(64, 64 * (1000 + i), 64 * (1000 + i), 64 * (1000 + i)) for i in range(20)]
        assert run.total_s == pytest.approx(sum(singles))


def test_the_front_end_paces_an_iteration_of_many_streams():
    p = roofline(8, stream_us=100)
    assert p.iteration(512, 512 * 100, 512 * 100, 512 * 100) == pytest.approx(512 * 100e-6)
    assert p.iteration(1, 100, 100, 100) == pytest.approx(roofline(8).iteration(1, 100, 100, 100))
    assert p.decode_run(512, 512 * 100, 10).total_s == pytest.approx(10 * 512 * 100e-6)


def test_captured_decode_graphs_skip_the_launch_floor_but_mixed_iterations_pay_it():
    p = roofline(8, overhead_ms=1, host_layer_us=100, graph_max_batch=32)
    floor = 80 * 100e-6 + 1e-3
    assert p.iteration(16, 16 * 100, 16 * 100, 16 * 100) < floor                  # captured
    assert p.iteration(64, 64 * 100, 64 * 100, 64 * 100) == pytest.approx(floor)  # too large
    assert p.iteration(17, 16 * 100 + 1, 16 * 100, 16 * 100) == pytest.approx(floor)   # mixed
    assert p.decode_run(16, 1600, 5).total_s < 5 * floor
    assert p.decode_run(64, 6400, 5).total_s == pytest.approx(5 * floor)


def test_each_attention_rank_schedules_and_captures_its_own_requests():
    """Attention data-parallel ranks each run a scheduler and capture their own decode graphs:
    400 decoders on 4 ranks pay the per-request CPU work of 100 (overlapped, it bounds the
    iteration) and replay a graph of 100 where the limit is 128; on one rank the same 400 pay
    for all of them and launch eagerly. With fewer decoders than ranks each rank holds one."""
    def engines(**engine):
        return (Roofline(LLAMA, H100, 1, IDEAL.model_copy(update=engine), dp=dp) for dp in (1, 4))

    def decode(p, n):
        return p.iteration(n, n * 10, n * 10, n * 10, requests=n)
    one, four = engines(overhead_ms=1, seq_us=1000, overlap=True)
    assert four.floor_s(400) == pytest.approx(1e-3 + 100 * 1e-3)
    assert one.floor_s(400) == pytest.approx(1e-3 + 400 * 1e-3)
    assert four.floor_s(2) == pytest.approx(1e-3 + 1e-3)
    assert decode(four, 400) == pytest.approx(four.floor_s(400))       # the CPU bounds both
    assert decode(one, 400) == pytest.approx(one.floor_s(400))
    one, four = engines(host_layer_us=2000, graph_max_batch=128)
    launches = 80 * 2000e-6
    assert decode(one, 400) == pytest.approx(launches)                  # eager: the launch floor
    assert decode(four, 400) < launches                                 # captured on each rank
    assert four.decode_run(400, 4000, 3).total_s == pytest.approx(3 * decode(four, 400), rel=1e-3)


def test_per_request_state_is_read_every_iteration():
    """A linear-attention state of S bytes per request is read and written each iteration; a
    sliding window's KV is read for at most its window."""
    qwen35 = catalog.model("qwen3.5-397b-a17b")
    p = Roofline(qwen35, H100, 8, IDEAL)
    assert p.s_per_request == pytest.approx(2 * qwen35.state_bytes / 8 / 3.35e12)
    oss = catalog.model("gpt-oss-120b")
    q = Roofline(oss, H100, 1, IDEAL)
    assert q.s_per_request == pytest.approx(128 * oss.window_kv_bytes_per_token / 3.35e12)


def test_served_dtypes_set_the_bytes():
    llama = catalog.model("llama-3.1-70b")
    fp8 = llama.served(weights="fp8", kv="fp8")
    assert fp8.kv_bytes_per_token == llama.kv_bytes_per_token / 2
    assert fp8.weight_bytes == pytest.approx(70.6e9)
    dsv3 = catalog.model("deepseek-v3").served(experts="fp4")
    assert dsv3.weight_bytes == pytest.approx(17e9 + 654e9 * 0.5625)
    assert dsv3.weight_dtype == "fp8" and dsv3.routed_dtype == "fp4"
    # FP4 multiplies in FP4 on a chip with FP4 units, at 16 bits on one without
    assert catalog.gpu("b200").peak_tflops("fp4") == catalog.gpu("b200").fp4_tflops
    assert catalog.gpu("h100-sxm").peak_tflops("fp4") == catalog.gpu("h100-sxm").bf16_tflops


def test_expert_parallelism_waits_for_its_busiest_group():
    """Tokens pick experts at random: the busiest of ep groups gets more than its share of the
    T x k picks, a pace that fades as batches grow. Held to the picks drawn at random (each
    token k distinct experts of the model's, the groups holding consecutive experts): within 5%
    at 2-8 groups and 4-64 tokens (the draws' small counts are skewed, their maximum a little
    higher), where sqrt(2 ln ep) standard deviations (the expected maximum's limit) overstated
    it by 6-16% (EP4 at 4 tokens: 1.59 for 1.37 drawn)."""
    dsv3 = bare("deepseek-v3")
    assert Roofline(dsv3, H100, 8, IDEAL).imbalance(64) == 1.0
    rng = np.random.default_rng(0)
    for ep, tokens in ((8, 64), (4, 4), (2, 16), (8, 8)):
        p = Roofline(dsv3, H100, 8, IDEAL, ep=ep)
        per_group = [dsv3.experts // ep] * ep
        picks = rng.multivariate_hypergeometric(per_group, dsv3.experts_per_token,
                                                size=(4000, tokens)).sum(axis=1)
        drawn = picks.max(axis=1).mean() / (tokens * dsv3.experts_per_token / ep)
        assert p.imbalance(tokens) == pytest.approx(drawn, rel=0.05), (ep, tokens)
    p = Roofline(dsv3, H100, 8, IDEAL, ep=8)
    assert p.imbalance(1) <= 8 and p.imbalance(65536) < 1.02
    routed = p.s_per_routed_token
    assert p._routed_compute(64) == pytest.approx(64 * routed * p.imbalance(64))


def test_sparse_attention_attends_at_most_its_cap_and_indexes_every_token():
    """GLM-5 (DSA): a query attends to the 2,048 tokens its indexer picks, whose KV it reads; the
    indexer scores and reads the keys of the whole context. A decode run ends where the contexts
    reach the cap, so each run stays exact against its single iterations."""
    glm = catalog.model("glm-5")
    p = Roofline(glm, H100, 8, IDEAL.model_copy(update={"memory": 0.5}), dp=1)
    n, ctx = 4, 4 * 2000
    run = p.decode_run(n, ctx, 400)
    assert run.k == (4 * 2048 - ctx) // 4 + 1 == 49       # ends once the cap is reached
    singles = [p.iteration(n, ctx + n * i, ctx + n * i, ctx + n * i) for i in range(run.k)]
    assert run.total_s == pytest.approx(sum(singles))
    capped = p.decode_run(n, 4 * 5000, 50)
    assert capped.k == 50
    singles = [p.iteration(n, 4 * 5000 + n * i, 4 * 5000 + n * i, 4 * 5000 + n * i) for i in range(50)]
    assert capped.total_s == pytest.approx(sum(singles))
    # past the cap only the indexer grows with the context
    far, near = p.iteration(n, 4 * 60000, 4 * 60000, 4 * 60000), p.iteration(n, 4 * 3000, 4 * 3000, 4 * 3000)
    dense = Roofline(glm.model_copy(update={"sparse_attend_tokens": 0}), H100, 8, IDEAL)
    assert far - near < dense.iteration(n, 4 * 60000, 4 * 60000, 4 * 60000) - dense.iteration(
        n, 4 * 3000, 4 * 3000, 4 * 3000)
    assert glm.served(kv="fp8").kv_bytes_per_token == pytest.approx(89_856 / 2 + 10_296)


def test_sparse_attention_layers_pay_their_indexer_chain_in_every_iteration():
    """index_layer_us: each layer of a model with an indexer pays it in every iteration,
    prefill, decode and captured decode runs alike, whatever the batch; a model without an
    indexer pays nothing."""
    glm = catalog.model("glm-5")
    engine = IDEAL.model_copy(update={"index_layer_us": 50, "graph_max_batch": 64})
    p, plain = Roofline(glm, H100, 8, engine), Roofline(glm, H100, 8, IDEAL)
    per_iteration = 78 * 50e-6
    for args in ((4096, 4096 * 2048, 0), (1, 1, 4000, 1), (64, 64 * 4000, 64 * 4000, 64 * 4000)):
        assert p.iteration(*args) - plain.iteration(*args) == pytest.approx(per_iteration)
    assert p.decode_run(8, 8 * 100, 5).total_s - plain.decode_run(8, 8 * 100, 5).total_s == \
        pytest.approx(5 * per_iteration)
    dense, bare_dense = Roofline(LLAMA, H100, 8, engine), Roofline(LLAMA, H100, 8, IDEAL)
    decode = (32, 32 * 100, 32 * 100, 32 * 100)
    assert dense.iteration(*decode) == bare_dense.iteration(*decode)


def test_eager_iterations_pay_each_moe_layers_fixed_cost():
    dsv3 = bare("deepseek-v3")
    engine = IDEAL.model_copy(update={"eager_moe_layer_us": 1000, "graph_max_batch": 64})
    p, plain = Roofline(dsv3, H100, 8, engine), Roofline(dsv3, H100, 8, IDEAL)
    assert p.iteration(1024, 1024 * 512, 0) - plain.iteration(1024, 1024 * 512, 0) == pytest.approx(0.058)
    assert p.iteration(32, 32 * 100, 32 * 100, 32 * 100) == plain.iteration(32, 32 * 100, 32 * 100, 32 * 100)
    assert p.decode_run(128, 128 * 100, 3).total_s - plain.decode_run(128, 128 * 100, 3).total_s == \
        pytest.approx(3 * 0.058)


def test_eager_iterations_pay_for_each_routed_expert_they_touch():
    """Per routed expert touched, on every rank whatever its share of the experts: a prefill
    that touches all 256 of DeepSeek-V3's experts in its 58 MoE layers pays 256 x 58 of them,
    at TP8 as at EP8; a captured decode graph pays none."""
    dsv3 = bare("deepseek-v3")
    engine = IDEAL.model_copy(update={"eager_expert_us": 10, "graph_max_batch": 64})
    for tp, ep in ((8, 1), (8, 8)):
        p, plain = Roofline(dsv3, H100, tp, engine, ep=ep), Roofline(dsv3, H100, tp, IDEAL, ep=ep)
        extra = p.iteration(4096, 4096 * 2048, 0) - plain.iteration(4096, 4096 * 2048, 0)
        assert extra == pytest.approx(256 * 58 * 10e-6, rel=1e-6)
    # one token touches its share of the experts (about 8 of the 256 in each layer)
    one = p.iteration(1, 1, 0) - plain.iteration(1, 1, 0)
    assert one == pytest.approx(p.touched_share(1) * 256 * 58 * 10e-6)
    assert one == pytest.approx(8 * 58 * 10e-6, rel=0.03)
    assert p.iteration(32, 32 * 100, 32 * 100, 32 * 100) == plain.iteration(32, 32 * 100, 32 * 100, 32 * 100)
    touched = p.touched_share(128) * 256 * 58 * 10e-6
    assert p.decode_run(128, 128 * 100, 3).total_s - plain.decode_run(128, 128 * 100, 3).total_s == \
        pytest.approx(3 * touched)
    dense, bare_dense = Roofline(LLAMA, H100, 8, engine), Roofline(LLAMA, H100, 8, IDEAL)
    assert dense.iteration(1024, 1024 * 512, 0) == bare_dense.iteration(1024, 1024 * 512, 0)


def test_a_fused_moe_kernel_pays_no_per_expert_cost():
    """An engine that runs experts of a dtype as one fused kernel (routing inside it) pays no
    per-expert bookkeeping for them, and still pays it for experts of another dtype."""
    engine = IDEAL.model_copy(update={"eager_expert_us": 10, "fused_moe": ("mxfp4",)})
    for experts, pays in (("mxfp4", False), ("fp4", True)):
        dsv3 = bare("deepseek-v3").served(experts=experts)
        p, plain = Roofline(dsv3, B200, 8, engine), Roofline(dsv3, B200, 8, IDEAL)
        extra = p.iteration(4096, 4096 * 2048, 0) - plain.iteration(4096, 4096 * 2048, 0)
        assert extra == pytest.approx(256 * 58 * 10e-6 if pays else 0.0, abs=1e-12)


def test_each_moe_layer_takes_a_fixed_time_in_every_iteration_unless_fused():
    """moe_layer_us: a time per MoE layer whatever the batch, captured decode included; a dense
    model and experts run in a fused kernel that routes inside it pay none."""
    engine = IDEAL.model_copy(update={"moe_layer_us": 20, "fused_moe": ("mxfp4",), "graph_max_batch": 64})
    for experts, pays in (("fp8", True), ("mxfp4", False)):
        dsv3 = bare("deepseek-v3").served(experts=experts)
        p, plain = Roofline(dsv3, B200, 8, engine), Roofline(dsv3, B200, 8, IDEAL)
        want = 58 * 20e-6 if pays else 0.0
        for tokens in (1, 32, 4096):
            extra = p.iteration(tokens, tokens * 100, 0) - plain.iteration(tokens, tokens * 100, 0)
            assert extra == pytest.approx(want, abs=1e-12)
        run = p.decode_run(16, 16 * 100, 3).total_s - plain.decode_run(16, 16 * 100, 3).total_s
        assert run == pytest.approx(3 * want, abs=1e-12)
    dense, bare_dense = Roofline(LLAMA, H100, 8, engine), Roofline(LLAMA, H100, 8, IDEAL)
    assert dense.iteration(1024, 1024 * 512, 0) == bare_dense.iteration(1024, 1024 * 512, 0)


def test_expert_memory_speeds_only_the_routed_experts_reads():
    """expert_memory is the bandwidth share of the routed experts' reads alone: the non-expert
    weights and the KV keep `memory`, and a dense model does not move."""
    slow = IDEAL.model_copy(update={"memory": 0.5})
    fast = slow.model_copy(update={"expert_memory": 1.0})
    dsv3 = bare("deepseek-v3")
    a, b = Roofline(dsv3, H100, 8, slow), Roofline(dsv3, H100, 8, fast)
    assert b.shared_s == a.shared_s and b.s_per_kv_token == a.s_per_kv_token
    assert b.routed_s == pytest.approx(a.routed_s / 2)
    assert Roofline(LLAMA, H100, 8, fast).iteration(1, 1000, 1000, 1000) == \
        Roofline(LLAMA, H100, 8, slow).iteration(1, 1000, 1000, 1000)


def test_fp4_read_slows_only_the_reads_of_fp4_weights():
    """fp4_read scales the bandwidth of FP4 weights alone: an FP4 model's weight reads take
    1/fp4_read as long, its KV reads do not move, and FP8 and MXFP4 weights are read as before
    (the routed experts and the rest each by their own dtype)."""
    plain = IDEAL.model_copy(update={"memory": 0.8})
    slow = plain.model_copy(update={"fp4_read": 0.5})
    fp4 = catalog.model("llama-3.1-70b").served(weights="fp4")
    a, b = Roofline(fp4, B200, 4, plain), Roofline(fp4, B200, 4, slow)
    assert b.shared_s == pytest.approx(2 * a.shared_s) and b.s_per_kv_token == a.s_per_kv_token
    for dtype in ("fp8", "mxfp4"):
        other = catalog.model("llama-3.1-70b").served(weights=dtype)
        assert Roofline(other, B200, 4, slow).shared_s == Roofline(other, B200, 4, plain).shared_s
    experts = bare("deepseek-v3").served(experts="fp4")      # FP8 non-expert weights, FP4 experts
    c, d = Roofline(experts, B200, 8, plain), Roofline(experts, B200, 8, slow)
    assert d.routed_s == pytest.approx(2 * c.routed_s) and d.shared_s == c.shared_s


def test_mxfp4_weights_are_read_at_their_own_size_and_multiplied_in_fp4():
    """MXFP4 stores 4.25 bits a weight (one 8-bit scale per 32) where NVFP4 stores 4.5; both
    multiply on FP4 units where a chip has them, at 16 bits where it has none."""
    dsv3 = catalog.model("deepseek-v3")
    mx, nv = dsv3.served(experts="mxfp4"), dsv3.served(experts="fp4")
    assert (nv.weight_bytes - mx.weight_bytes) == pytest.approx(dsv3.routed_params * 0.25 / 8)
    assert B200.peak_tflops("mxfp4") == B200.fp4_tflops
    assert H100.peak_tflops("mxfp4") == H100.bf16_tflops
