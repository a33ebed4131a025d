"""Serving as engines run it: the benchmark workload (clients, warm-up, ramp), the front end, and
the engines' scheduling and admission policies, each on a case whose outcome is computed by hand
(the linear measured table of the fixtures makes every iteration's time exact)."""
import numpy as np
import pytest

from pddsim.config import from_dict
from pddsim.sim import load_workload, simulate
from pddsim.workload.synthetic import benchmark


def bench_config(make_config, knobs, **overrides):
    raw = make_config(roles=(("colocated", 1),), **overrides).model_dump(exclude={"base_dir"})
    raw["workload"] = {"synthetic": {"kind": "benchmark", "knobs": knobs}}
    return from_dict(raw, "test")


def run(cfg):
    return simulate(cfg, load_workload(cfg))


def in_flight_max(df):
    """Most requests in flight at once, from their issue and finish times."""
    events = sorted([(t, 1) for t in df["arrival_s"]] + [(t, -1) for t in df["finish_s"]],
                    key=lambda e: (e[0], e[1]))
    return max(np.cumsum([d for _, d in events]))


def test_benchmark_clients_keep_their_concurrency_and_the_measured_phase_starts_drained(make_config):
    cfg = bench_config(make_config, {"concurrency": 4, "isl": 200, "osl": 20, "requests": 12,
                                     "warmup": 6})
    result = run(cfg)
    df = result.requests
    warm, measured = df[df["warmup"]], df[~df["warmup"]]
    assert (len(warm), len(measured)) == (6, 12)
    assert in_flight_max(df) == 4
    # the measured phase starts once the warm-up has drained, every client at once
    assert measured["arrival_s"].min() == pytest.approx(warm["finish_s"].max())
    first = measured.nsmallest(4, "arrival_s")["arrival_s"]
    assert first.nunique() == 1
    # figures cover the measured phase only
    s = result.summary
    assert (s["requests_total"], s["warmup_requests"]) == (12, 6)
    assert s["ttft_mean_s"] == pytest.approx(measured["ttft_s"].mean())


def test_benchmark_ramp_and_think_time(make_config):
    # each request decodes for ~5 s (10 ms iterations): none ends before the ramp is over
    cfg = bench_config(make_config, {"concurrency": 4, "isl": 100, "osl": 500, "requests": 8,
                                     "warmup": 0, "ramp_s": 3.0, "think_s": 0.5})
    df = run(cfg).requests
    starts = sorted(df["arrival_s"])[:4]
    assert starts == pytest.approx([0.0, 0.75, 1.5, 2.25])
    # each client's next request leaves think_s after its previous one ended
    later = df.sort_values("arrival_s").iloc[4:]
    ends = sorted(df["finish_s"])[:4]
    assert sorted(later["arrival_s"]) == pytest.approx([e + 0.5 for e in ends])


def test_benchmark_lengths_and_jitter_are_seeded():
    from pddsim.config import BenchmarkSpec
    spec = BenchmarkSpec(concurrency=2, isl=1000, osl=100, requests=50, isl_jitter=0.1, osl_jitter=0.2)
    a, b = benchmark(spec, seed=3), benchmark(spec, seed=3)
    assert [r.input_tokens for r in a.requests] == [r.input_tokens for r in b.requests]
    inputs = np.array([r.input_tokens for r in a.requests])
    assert len(a.requests) == 54 and 900 < inputs.mean() < 1100 and inputs.std() > 50
    plain = benchmark(BenchmarkSpec(concurrency=2, isl=1000, osl=100, requests=4), seed=0)
    assert {(r.input_tokens, r.output_tokens) for r in plain.requests} == {(1000, 100)}
    # no prefix is shared between two requests
    blocks = [h for r in plain.requests for h in r.hash_ids]
    assert len(blocks) == len(set(blocks))


def test_a_benchmark_brings_its_own_load(make_config):
    from pddsim.errors import InputError
    raw = make_config(roles=(("colocated", 1),)).model_dump(exclude={"base_dir"})
    raw["workload"] = {"synthetic": {"kind": "benchmark", "knobs": {"concurrency": 2, "isl": 10,
                                                                     "osl": 2}},
                       "replay": "closed"}
    with pytest.raises(InputError, match="its own closed-loop load"):
        from_dict(raw, "test")


def test_the_front_end_adds_its_time_before_the_engine_sees_a_request(make_config):
    knobs = {"concurrency": 1, "isl": 500, "osl": 10, "requests": 3, "warmup": 0}
    plain = run(bench_config(make_config, knobs)).requests
    fronted = run(bench_config(make_config, knobs, perf__frontend_ms=40)).requests
    assert fronted["ttft_s"].to_numpy() == pytest.approx(plain["ttft_s"].to_numpy() + 0.040)
    assert fronted["tpot_s"].to_numpy() == pytest.approx(plain["tpot_s"].to_numpy())
    assert fronted["ttft_frontend_s"].to_numpy() == pytest.approx([0.040] * 3)
    stages = [c for c in fronted.columns if c.startswith("ttft_") and c.endswith("_s") and c != "ttft_s"]
    assert fronted[stages].sum(axis=1).to_numpy() == pytest.approx(fronted["ttft_s"].to_numpy())


def test_the_serving_process_takes_requests_sent_together_one_at_a_time(make_config):
    """Four clients start at once: the k-th request's turn in the serving process comes after
    k - 1 others' (frontend_serial_ms each), then frontend_ms; one client alone never queues."""
    knobs = {"concurrency": 4, "isl": 50, "osl": 2, "requests": 4, "warmup": 0}
    df = run(bench_config(make_config, knobs, perf__frontend_serial_ms=30,
                          perf__frontend_ms=5)).requests
    assert sorted(df["ttft_frontend_s"]) == pytest.approx([0.035, 0.065, 0.095, 0.125])
    alone = run(bench_config(make_config, {**knobs, "concurrency": 1}, perf__frontend_serial_ms=30,
                             perf__frontend_ms=5)).requests
    assert alone["ttft_frontend_s"].to_numpy() == pytest.approx([0.035] * 4)


def test_each_request_takes_its_intake_time_for_every_other_stream_without_queueing(make_config):
    """Four clients start at once (no serial intake): the k-th request issued finds k - 1 others
    live and takes frontend_stream_us for each, on top of frontend_ms; no request waits for
    another's intake. One client alone pays none of it."""
    knobs = {"concurrency": 4, "isl": 50, "osl": 2, "requests": 4, "warmup": 0}
    df = run(bench_config(make_config, knobs, perf__frontend_stream_us=10_000,
                          perf__frontend_ms=5)).requests
    assert df.sort_values("request")["ttft_frontend_s"].to_numpy() == pytest.approx(
        [0.005, 0.015, 0.025, 0.035])
    alone = run(bench_config(make_config, {**knobs, "concurrency": 1},
                             perf__frontend_stream_us=10_000, perf__frontend_ms=5)).requests
    assert alone["ttft_frontend_s"].to_numpy() == pytest.approx([0.005] * 4)


def test_reserve_admission_waits_for_the_whole_length_and_never_preempts(make_config):
    """KV for 2,448 tokens; each request needs 600 + 600. Optimistic admission takes all three
    prompts (1,824 tokens in 16-token blocks) and must preempt as they grow; a no-evict engine
    admits two (2 x 1,200) and the third waits until one has finished."""
    from test_instance import utilization_for as capacity_for
    knobs = {"concurrency": 3, "isl": 600, "osl": 600, "requests": 3, "warmup": 0}
    common = {"batching": {"memory_utilization": capacity_for(2448), "kv_block_tokens": 16}}
    optimistic = run(bench_config(make_config, knobs, **common))
    reserve = run(bench_config(make_config, knobs, perf__admission="reserve", **common))
    assert optimistic.instances["kv_capacity_tokens"].iloc[0] == 2448
    assert optimistic.instances["preemptions"].iloc[0] > 0
    assert reserve.instances["preemptions"].iloc[0] == 0
    df = reserve.requests.sort_values("ttft_s")
    first_two_end = df["finish_s"].iloc[:2].min()
    assert df["ttft_s"].iloc[2] >= first_two_end - 1e-9          # waited for a whole slot


def test_prefill_first_pauses_the_decoders(make_config):
    """A decoder meets a new 5,000-token prompt: mixed, the prompt's chunk runs in the decoder's
    iteration (one longer gap); prefill-first, the prompt runs alone and the decoder's next token
    waits for it as well (base 10 ms, 10 us a token)."""
    def config(**kw):
        raw = make_config(roles=(("colocated", 1),), **kw).model_dump(exclude={"base_dir"})
        return from_dict(raw, "test")
    from conftest import workload
    w = workload((0.0, 100, 50), (0.1, 5000, 2))
    mixed = simulate(config(), w).requests
    first = simulate(config(perf__scheduler="prefill_first"), w).requests
    # the long-running request's largest gap: mixed 10 ms + 5,001 tokens; prefill-first the
    # prompt's 10 ms + 5,000 tokens alone, then 10 ms + 2 tokens (the prompt decodes too)
    assert mixed["itl_max_s"].iloc[0] == pytest.approx(0.010 + 5001e-5)
    assert first["itl_max_s"].iloc[0] == pytest.approx(0.010 + 5000e-5 + 0.010 + 2e-5)
    assert first["tpot_s"].iloc[0] > mixed["tpot_s"].iloc[0]


def test_whole_prompt_packing_never_splits_a_prompt_it_can_defer(make_config):
    """Budget 2,000: packed, three 900-token prompts fill two iterations as 900+900+200 then 700;
    whole, 900+900 then 900: the third prompt's first token comes one iteration later, but
    it is never chunked (each iteration 10 ms + 10 us a token)."""
    from conftest import workload
    w = workload((0.0, 900, 1), (0.0, 900, 1), (0.0, 900, 1))

    def ttfts(packing):
        cfg = make_config(roles=(("colocated", 1),),
                          batching={"token_budget": 2000, "prefill_chunk": 2000, "chunk_packing": packing})
        return simulate(cfg, w).requests["ttft_s"].to_numpy()
    assert ttfts("packed") == pytest.approx([0.030, 0.030, 0.030 + 0.017])
    assert ttfts("whole") == pytest.approx([0.028, 0.028, 0.028 + 0.019])


def test_kv_capacity_follows_the_engines_memory_rule_and_the_layout(make_config):
    """Llama-3.1-70B in FP8 (70.6 GB, KV 160 KiB a token) on 8 x H100 with 4 GB a GPU kept for
    activations: `total` gives the KV 0.9 x 640 GB less weights and reserve, `free` 0.9 of what
    they leave; DeepSeek-V3 as 2 attention ranks of 4 GPUs keeps per rank its 17 GB of
    non-expert weights and half the experts, and the latent KV (one head) on every GPU of a rank
    (on B200s, 192 GB each)."""
    from pddsim import catalog
    from pddsim.system.deployment import kv_capacity_tokens

    def tokens(rule, model="llama-3.1-70b", tp=8, dp=1, gpu="h100-sxm"):
        cfg = make_config(roles=(("colocated", 1, tp),), model=model,
                          quant={"weights": "fp8", "kv": "fp8"})
        engine = catalog.engine("vllm").model_copy(update={"memory_rule": rule, "activation_gb": 4})
        group = cfg.clusters["a"].instances[0].model_copy(update={"tp": tp, "dp": dp, "ep": tp * dp})
        return kv_capacity_tokens(cfg, cfg.served_model(), catalog.gpu(gpu), group, engine, "t")

    kv = 327_680 / 2
    assert tokens("total") == int((0.9 * 640e9 - 70.6e9 - 32e9) // kv) // 16 * 16
    assert tokens("free") == int((0.9 * (640e9 - 70.6e9 - 32e9)) // kv) // 16 * 16
    rank = 4 * 192e9 * 0.9 - (17e9 + 654e9 * 4 / 8) - 16e9
    assert tokens("total", "deepseek-v3", tp=4, dp=2, gpu="b200") == \
        2 * (int(rank // (70_272 / 2 * 4)) // 16 * 16)


def test_ranks_that_schedule_apart_each_take_the_token_budget(make_config):
    """A worker of 4 attention data-parallel ranks: under an engine whose ranks schedule apart
    (vLLM, TensorRT-LLM) each takes the budget, 4 x 2,048 tokens an iteration in all; under one
    that splits its budget among them (SGLang) the worker takes 2,048. One rank: the budget."""
    from pddsim import catalog
    from pddsim.system.deployment import group_batching

    cfg = make_config(roles=(("colocated", 1),), batching={"token_budget": 2048})
    one = cfg.clusters["a"].instances[0]
    four = one.model_copy(update={"dp": 4})
    apart, split = catalog.engine("trtllm"), catalog.engine("sglang")
    assert apart.rank_budget and not split.rank_budget
    assert group_batching(cfg, four, apart).token_budget == 4 * 2048
    assert group_batching(cfg, four, split).token_budget == 2048
    assert group_batching(cfg, one, apart).token_budget == 2048


def test_a_reserving_engine_that_preempted_reserves_whole_lengths_from_then_on(make_config):
    """Reserving a third of each output lets three 600 + 600 requests into 2,448 tokens; they
    outgrow it, the newest is preempted once, and from then on whole lengths are reserved: one
    preemption, not one per readmission."""
    from test_instance import utilization_for
    knobs = {"concurrency": 3, "isl": 600, "osl": 600, "requests": 9, "warmup": 0}
    result = run(bench_config(make_config, knobs, perf__admission="reserve", perf__reserve_share=0.3,
                              batching={"memory_utilization": utilization_for(2448),
                                        "kv_block_tokens": 16}))
    assert result.instances["preemptions"].iloc[0] == 1
    assert (result.requests["status"] == "completed").all()
