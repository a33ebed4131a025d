"""`pddsim bench serve`: measured serving benchmarks read in their own format, replayed as the
benchmarks that produced them, compared and reported; and the figures pinned on the fit rows."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pddsim import catalog, cli
from pddsim.experiments.backends import Processes
from pddsim.experiments.serve_bench import cases, group_floor, read_rows, replay, scenario, summarise

HEADER = ("id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
          "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
          "moe_ep_size,prefill_batch_size,prefill_num_workers,prefill_tp_size,prefill_pp_size,"
          "prefill_attention_dp_size,prefill_moe_tp_size,prefill_moe_ep_size,decode_batch_size,"
          "decode_num_workers,decode_tp_size,decode_pp_size,decode_attention_dp_size,"
          "decode_moe_tp_size,decode_moe_ep_size,silicon_ttft_ms,silicon_tpot_ms")
EMPTY_DISAGG = "," * 14              # the 14 prefill_* and decode_* fields


def agg(model="meta-llama/Llama-3.1-70B", system="h100_sxm", backend="vllm", conc=4, isl=512,
        osl=64, tp=8, pp=1, adp=1, moe_tp=1, moe_ep=1, ttft=100.0, tpot=10.0, quant="fp8",
        batch=None, version="1"):
    return (f"r,src; silicon_concurrency={conc},{backend},{version},{model},{system},{quant},agg,{isl},{osl},"
            f"{quant},{quant},{conc if batch is None else batch},{tp},{pp},{adp},{moe_tp},{moe_ep},"
            f"{EMPTY_DISAGG}{ttft},{tpot}")


def disagg(conc=8, isl=512, osl=32, ttft=200.0, tpot=12.0, workers=1):
    w = workers if workers else ""
    return (f"r,src; silicon_concurrency={conc},trtllm,1,meta-llama/Llama-3.1-70B,h100_sxm,fp8,disagg,"
            f"{isl},{osl},fp8,fp8,,,,,,,1,{w},8,1,1,1,1,{conc},{w},8,1,1,1,1,{ttft},{tpot}")


def write(tmp_path, *lines) -> Path:
    path = tmp_path / "measured.csv"
    path.write_text("\n".join([HEADER, *lines]) + "\n")
    return path


def test_a_row_becomes_its_deployment_and_benchmark(tmp_path):
    rows = read_rows(write(tmp_path, agg(conc=16, isl=1024, osl=128, tp=4), disagg()))
    cfg = scenario(rows.iloc[0].to_dict())
    group = cfg.clusters["a"].instances[0]
    assert (cfg.model, cfg.clusters["a"].gpu, cfg.perf.engine) == ("llama-3.1-70b", "h100-sxm", "vllm")
    assert (group.role, group.tp, group.dp, group.max_batch) == ("colocated", 4, 1, 16)
    assert (cfg.quant.weights, cfg.quant.kv) == ("fp8", "fp8")
    knobs = cfg.workload.synthetic.knobs
    assert (knobs.concurrency, knobs.isl, knobs.osl, knobs.warmup_requests) == (16, 1024, 128, 32)
    pd_cfg = scenario(rows.iloc[1].to_dict())
    assert [(g.role, g.count, g.tp) for g in pd_cfg.clusters["a"].instances] == [
        ("prefill", 1, 8), ("decode", 1, 8)]


def test_an_fp4_label_on_an_mxfp4_release_is_that_release(tmp_path):
    """gpt-oss is published only with MXFP4 experts and 16-bit other weights: a row labelling it
    NVFP4 is served as that checkpoint (its FP8 KV kept); another model's FP4 label stands."""
    rows = read_rows(write(tmp_path, agg("openai/gpt-oss-120b", "b200_sxm", quant="nvfp4", tp=1),
                           agg("deepseek-ai/DeepSeek-R1", "b200_sxm", "sglang", quant="nvfp4", moe_tp=8)))
    oss, dsr1 = (scenario(rows.iloc[i].to_dict()) for i in (0, 1))
    assert (oss.quant.weights, oss.quant.experts, oss.quant.kv) == (None, None, "fp8")
    assert oss.served_model().routed_dtype == "mxfp4"
    assert (dsr1.quant.weights, dsr1.quant.experts) == ("fp4", "fp4")


def test_mla_past_one_node_is_read_as_attention_data_parallel(tmp_path):
    rows = read_rows(write(tmp_path, agg("deepseek-ai/DeepSeek-R1", "gb200", "sglang", conc=512,
                                         tp=72, moe_tp=72)))
    group = scenario(rows.iloc[0].to_dict()).clusters["a"].instances[0]
    assert (group.tp, group.dp, group.ep, group.max_batch) == (1, 72, 72, 512)


def test_a_worker_written_as_ep_by_ep_gpus_is_the_ep_gpus_it_was(tmp_path):
    """One export of the source writes an expert-parallel worker of ep GPUs as ep x ep (its
    attention size multiplied by ep, MoE tensor parallelism ep, the per-rank batch divided by
    ep); the same measurements in the other export are laid out over ep GPUs. Both read alike.
    A row with a blank attention_dp_size (MoE TP x EP over the worker's GPUs, as the older
    TensorRT-LLM rows are written) stands as written."""
    r1 = "deepseek-ai/DeepSeek-R1"
    rows = read_rows(write(
        tmp_path, agg(r1, "b200_sxm", "sglang", tp=16, moe_tp=4, moe_ep=4),
        agg(r1, "b200_sxm", "sglang", tp=4, moe_tp=1, moe_ep=4),
        agg(r1, "b200_sxm", "trtllm", conc=64, tp=1, adp=64, moe_tp=8, moe_ep=8, batch=1),
        agg(r1, "b200_sxm", "trtllm", conc=64, tp=1, adp=8, moe_tp=1, moe_ep=8, batch=8),
        agg("Qwen/Qwen3-235B-A22B-FP8", "h100_sxm", "trtllm", tp=4, adp="", moe_tp=2, moe_ep=2)))
    groups = [scenario(r).clusters["a"].instances[0] for r in rows.to_dict("records")]
    got = [(g.tp, g.dp, g.ep, g.max_batch) for g in groups]
    assert got[0] == got[1] == (4, 1, 4, 4)
    assert got[2] == got[3] == (1, 8, 8, 64)
    assert got[4] == (4, 1, 2, 4)


def test_a_per_rank_batch_cap_without_a_dp_size_is_read_as_attention_data_parallel(tmp_path):
    """TensorRT-LLM's attention DP recorded with a blank attention_dp_size: a cap of 10 per rank
    on 8 GPUs for 80 clients is 8 ranks of 10, not one rank queueing 70 clients; with the DP
    size given (or the cap covering the clients) the row is read as it stands."""
    rows = read_rows(write(tmp_path, *(agg("deepseek-ai/DeepSeek-R1", "b200_sxm", "trtllm", conc=80,
                                           tp=8, adp=adp, moe_tp=1, moe_ep=8, batch=batch)
                                       for adp, batch in (("", 10), (1, 10), ("", 80)))))
    groups = [scenario(r).clusters["a"].instances[0] for r in rows.to_dict("records")]
    assert [(g.tp, g.dp, g.ep, g.max_batch) for g in groups] == [
        (1, 8, 8, 80), (8, 1, 8, 10), (8, 1, 8, 80)]


def test_a_batch_cap_dividing_the_concurrency_is_that_many_workers(tmp_path):
    rows = read_rows(write(tmp_path, agg(conc=64, tp=2, batch=16), agg(conc=64, tp=2, batch=24)))
    groups = [scenario(r).clusters["a"].instances[0] for r in rows.to_dict("records")]
    assert [(g.count, g.tp, g.max_batch) for g in groups] == [(4, 2, 16), (1, 2, 24)]


def test_rows_that_cannot_be_represented_are_counted_by_reason(tmp_path):
    path = write(tmp_path, agg(), agg(model="acme/Unknown-1B"), agg(pp=2),
                 agg(model="deepseek-ai/DeepSeek-R1", system="b200_sxm", moe_tp=2, moe_ep=2),
                 agg(system="tpu_v9"), disagg(workers=0))
    table = cases(read_rows(path), Processes(1))
    summary = summarise(table)
    assert summary["rows"] == 6 and summary["rows_compared"] == 1
    assert summary["rows_skipped"] == {
        "model not in the catalog: acme/Unknown-1B": 1, "pipeline parallelism is not modelled": 1,
        "MoE layout does not cover the worker's GPUs": 1, "GPU not in the catalog: tpu_v9": 1,
        "disagg row without prefill and decode worker counts": 1}


def test_rows_of_one_deployment_and_benchmark_are_replayed_once(tmp_path):
    """The file repeats measurements: rows that differ only in what was measured (and in their
    id and source) are replayed once and get that replay's prediction; any input that differs
    (here the concurrency, the output length) is a replay of its own, and each row is compared
    with its own measurement."""
    path = write(tmp_path, agg(ttft=100.0), agg(ttft=200.0).replace("r,src;", "s,other;"),
                 agg(conc=8), agg(osl=128), agg(pp=2), agg(pp=2))
    replayed, stands_for = [], []

    class Counting:
        def map(self, fn, items, shared=None, on_done=None):
            replayed.extend(items)
            return Processes(1).map(fn, items, shared, on_done)
    table = cases(read_rows(path), Counting(), on_done=stands_for.append)
    assert len(replayed) == 4 and sorted(stands_for) == [1, 1, 2, 2]
    first, repeat = table.iloc[0], table.iloc[1]
    assert first["predicted_ttft_ms"] == repeat["predicted_ttft_ms"]
    assert first["ttft_ratio"] == pytest.approx(2 * repeat["ttft_ratio"])
    assert table.iloc[2]["predicted_tpot_ms"] != first["predicted_tpot_ms"]
    assert list(table["skipped"].iloc[4:]) == ["pipeline parallelism is not modelled"] * 2


def test_a_row_is_replayed_under_the_profile_of_its_engine_version(tmp_path):
    """TensorRT-LLM 1.0's rows behave as with chunked prefill on: they replay under `trtllm-1.0`
    (trtllm's constants merged in, packed chunks); other versions, and a version no profile is
    named for, under their backend's. Rows that differ only in such a version are two replays."""
    prompts = {"conc": 8, "isl": 3000}          # more than a token budget at once: chunks matter
    rows = read_rows(write(tmp_path, agg(backend="trtllm", version="1.0.0rc3", **prompts),
                           agg(backend="trtllm", version="1.2.0rc6", **prompts),
                           agg(version="1.0.0rc3")))
    assert [scenario(r).perf.engine for r in rows.to_dict("records")] == ["trtllm-1.0", "trtllm", "vllm"]
    base, version = catalog.engine("trtllm"), catalog.engine("trtllm-1.0")
    assert {k for k in type(base).model_fields if getattr(base, k) != getattr(version, k)} == {
        "name", "chunk_packing", "attn_prefill"}
    assert (base.chunk_packing, version.chunk_packing) == ("whole", "packed")
    table = cases(rows.iloc[:2], Processes(1))
    assert list(table["engine"]) == ["trtllm-1.0", "trtllm"]
    assert table.iloc[0]["predicted_ttft_ms"] != table.iloc[1]["predicted_ttft_ms"]


def test_errors_and_ratios_are_computed_from_the_predictions(tmp_path):
    rows = read_rows(write(tmp_path, agg(ttft=100.0, tpot=10.0)))
    table = cases(rows, Processes(1))
    ttft, tpot = table["predicted_ttft_ms"].iloc[0], table["predicted_tpot_ms"].iloc[0]
    assert table["ttft_ratio"].iloc[0] == pytest.approx(ttft / 100.0)
    assert table["tpot_abs_err_pct"].iloc[0] == pytest.approx(100 * abs(tpot / 10.0 - 1))
    assert (ttft, tpot) == replay(rows.iloc[0].to_dict())        # the same replay, deterministic
    s = summarise(table)
    assert s["ttft_mdape_pct"] == pytest.approx(round(100 * abs(ttft / 100 - 1), 1))
    assert s["groups"]["band"]["1-8"]["rows"] == 1


def test_rows_beyond_the_fit_files_gpus_and_models_are_replayed(tmp_path):
    """The fit rows hold no H200, A100 or Kimi-K2.5 row; the catalogs do, so such a row (as the
    held-out part of the source may hold) is replayed under every engine, not skipped. The same
    small-batch row decodes faster on a GPU with more HBM bandwidth, and prefills slower on one
    with less compute (A100 against H100: no FP8 matmuls, a third of the 16-bit peak)."""
    dense = [agg(system=gpu, tp=4, conc=2, isl=1024, osl=32)
             for gpu in ("h100_sxm", "h200_sxm", "a100_sxm")]
    kimi = [agg("moonshotai/Kimi-K2.5", "h200_sxm", backend, conc=2, isl=1024, osl=16,
                moe_tp=8, quant="int4_wo") for backend in ("vllm", "sglang", "trtllm")]
    table = cases(read_rows(write(tmp_path, *dense, *kimi)), Processes(1))
    assert (table["skipped"] == "").all(), table["skipped"].tolist()
    assert table["model"].tolist() == ["llama-3.1-70b"] * 3 + ["kimi-k2.5"] * 3
    assert np.isfinite(table[["predicted_ttft_ms", "predicted_tpot_ms"]].to_numpy()).all()
    ttft, tpot = table["predicted_ttft_ms"].tolist(), table["predicted_tpot_ms"].tolist()
    assert tpot[1] < tpot[0] and ttft[2] > ttft[0]


def test_the_measured_phase_is_rounds_of_every_client(tmp_path):
    """R rounds of N clients: R x N measured requests after the 2N warm-up; a longer phase
    weighs its first round, the burst of every client at once, less."""
    row = read_rows(write(tmp_path, agg(conc=32, isl=2048, osl=16, tp=2))).iloc[0].to_dict()
    knobs = scenario(row, rounds=4).workload.synthetic.knobs
    assert (knobs.requests, knobs.warmup_requests) == (128, 64)
    assert replay(row, rounds=2)[0] > replay(row, rounds=20)[0]


def test_the_noise_floor_is_the_spread_of_repeated_deployments(tmp_path):
    rows = read_rows(write(tmp_path, agg(ttft=100, tpot=10), agg(ttft=150, tpot=10),
                           agg(ttft=125, tpot=12), agg(ttft=125, tpot=12), agg(conc=8, ttft=50)))
    table = cases(rows, Processes(1))
    floor = summarise(table)["noise_floor"]
    # the fourth row lists the third's measurement again: not a repeat
    assert (floor["ttft_repeated_rows"], floor["tpot_repeated_rows"]) == (3, 2)
    # |100/125 - 1| = 20%, |150/125 - 1| = 20%, 0: median 20%; TPOT 10 and 12 around 11: 9.1% each
    assert (floor["ttft_repeat_mdape_pct"], floor["tpot_repeat_mdape_pct"]) == (20.0, 9.1)


def test_the_scatter_across_concurrencies_is_each_inner_point_against_its_neighbours(tmp_path):
    """An inner concurrency is judged against the log-log line through its neighbours (batch caps
    that follow the clients do not split a deployment); a deployment at two concurrencies has
    no inner one."""
    rows = read_rows(write(tmp_path, agg(conc=1, ttft=10, tpot=5), agg(conc=2, ttft=22, tpot=5),
                           agg(conc=4, ttft=40, tpot=5), agg(conc=8, ttft=80, tpot=5),
                           agg(conc=2, isl=1024, ttft=1), agg(conc=4, isl=1024, ttft=9)))
    floor = summarise(cases(rows, Processes(1)))["noise_floor"]
    # conc 2: the line through (1, 10) and (4, 40) gives 20, 22 is 10% off; conc 4: the line
    # through (2, 22) and (8, 80) gives sqrt(22 x 80) = 41.95, 40 is 4.6% off: median 7.3%
    assert floor["smooth_rows"] == 2
    assert floor["ttft_smooth_mdape_pct"] == pytest.approx((10 + 100 * (1 - 40 / (22 * 80) ** 0.5)) / 2,
                                                           abs=0.05)
    assert floor["tpot_smooth_mdape_pct"] == 0.0


def test_the_group_floor_is_what_one_factor_per_group_leaves():
    """Two groups whose rows lie 0.5x / 1x / 2x their median and 0.9x / 1.1x theirs: errors of
    50%, 0, 100%, 10%, 10% from the centred ratios, median 10%. A group's predictions scaled by
    any factor leave it unchanged (a fitted constant could centre them), while the plain median
    error moves."""
    table = pd.DataFrame({"backend": ["a"] * 3 + ["b"] * 2, "model": "m", "gpu": "g", "band": "1-8",
                          "ttft_ratio": [1.0, 2.0, 4.0, 0.9, 1.1], "tpot_ratio": 1.0})
    floor = group_floor(table)
    assert (floor["ttft_group_floor_pct"], floor["tpot_group_floor_pct"]) == (10.0, 0.0)
    scaled = table.assign(ttft_ratio=table["ttft_ratio"] * np.where(table["backend"] == "b", 3.0, 1.0))
    assert group_floor(scaled) == floor


def test_the_deployment_floor_leaves_only_how_each_deployment_moves_with_load():
    """One group, two deployments (prompt lengths) at two concurrencies each. TTFT levels 1x and
    3x, flat in the clients: one factor per deployment leaves nothing, one per group 50%. TPOT
    ratios 0.8x -> 1.2x and 1.6x -> 2.4x: each deployment 20% off its median whatever its level,
    the group 28.6% off its."""
    table = pd.DataFrame({"backend": "a", "model": "m", "gpu": "g", "band": "1-8",
                          "isl": [1024, 1024, 2048, 2048], "concurrency": [1, 2, 1, 2],
                          "ttft_ratio": [1.0, 1.0, 3.0, 3.0], "tpot_ratio": [0.8, 1.2, 1.6, 2.4]})
    floor = group_floor(table)
    assert (floor["ttft_deployment_floor_pct"], floor["ttft_group_floor_pct"]) == (0.0, 50.0)
    assert (floor["tpot_deployment_floor_pct"], floor["tpot_group_floor_pct"]) == (20.0, 28.6)


def test_bad_files_are_one_line(tmp_path, input_error, capsys):
    def fails(argv, *named):
        code = cli.main(["bench", "serve", "--jobs", "1", "--quiet", *argv])
        input_error(code, capsys.readouterr().err, *named)
    path = tmp_path / "bad.csv"
    path.write_text("model_path,system\nx,y\n")
    fails(["--against", str(path)], f"{path}: missing column(s)")
    ragged = write(tmp_path, agg() + ",extra")
    fails(["--against", str(ragged)], f"{ragged}:2: 35 fields, the header has 34")
    fails(["--against", str(write(tmp_path, agg())), "--set", "memory=2"], "memory")
    fails(["--against", str(tmp_path / "none.csv")], "cannot read")
    fails(["--against", str(write(tmp_path, agg())), "--by", "versoin"], "--by", "'versoin'")


def test_bench_serve_cli_json(tmp_path, capsys):
    path = write(tmp_path, agg(), agg(model="acme/Unknown-1B"))
    out = tmp_path / "cases.csv"
    assert cli.main(["bench", "serve", "--against", str(path), "--json", "--jobs", "1", "--quiet",
                     "--cases", str(out), "--set", "frontend_ms=5"]) == 0
    s = json.loads(capsys.readouterr().out)
    for key in ("ttft_mdape_pct", "tpot_mdape_pct", "rows_compared", "rows_skipped", "groups",
                "noise_floor", "group_floor"):
        assert key in s
    assert s["rows_compared"] == 1 and set(s["groups"]) == {"model", "gpu", "backend", "mode", "band"}
    assert len(pd.read_csv(out)) == 2


def test_figures_by_any_column_of_the_file(tmp_path, capsys):
    """`--by` adds a group per column named (a file's own, such as its engine versions, or the
    engine a row was replayed under); a row without a value is a group of its own, not dropped."""
    path = write(tmp_path, agg(version="0.19.0", ttft=100.0), agg(conc=8, version="0.19.0"),
                 agg(conc=2, version=""))
    assert cli.main(["bench", "serve", "--against", str(path), "--json", "--jobs", "1", "--quiet",
                     "--by", "backend_version", "--by", "engine"]) == 0
    s = json.loads(capsys.readouterr().out)
    versions = s["groups"]["backend_version"]
    assert sum(f["rows"] for f in versions.values()) == s["rows_compared"] == 3
    assert versions["0.19.0"]["rows"] == 2 and len(versions) == 2
    assert s["groups"]["engine"] == {"vllm": s["groups"]["backend"]["vllm"]}
    assert list(s["groups"])[:5] == ["model", "gpu", "backend", "mode", "band"]
    table = cases(read_rows(path), Processes(1))        # through the API: a missing value read as NaN
    table.loc[2, "backend_version"] = np.nan
    assert summarise(table, ["backend_version"])["groups"]["backend_version"]["nan"]["rows"] == 1


def test_pins_fail_when_an_error_rises_past_its_slack(tmp_path, capsys):
    path = write(tmp_path, *[agg(conc=c, ttft=100.0, tpot=10.0) for c in (1, 2, 4)])
    pins = tmp_path / "pins.json"
    argv = ["bench", "serve", "--against", str(path), "--jobs", "1", "--quiet", "--check", str(pins)]
    assert cli.main(argv + ["--update"]) == 0
    assert cli.main(argv) == 0                                   # unchanged: passes
    pinned = json.loads(pins.read_text())
    pinned["ttft_mdape_pct"] -= 2.5                              # as if the error had been lower
    pins.write_text(json.dumps(pinned))
    capsys.readouterr()
    assert cli.main(argv) == 1
    assert "MOVED ttft_mdape_pct" in capsys.readouterr().err


def test_the_engine_fit_merges_repeats_and_moves_a_constant_the_way_the_rows_ask(tmp_path):
    """benchmarks/fit_serve.py: a deployment measured twice is one deployment at the median of its
    measurements, and the descent lowers the objective, moving a constant the way the rows ask."""
    import subprocess
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from fit_serve import deployments
    path = write(tmp_path, agg(conc=4, ttft=100), agg(conc=4, ttft=300), agg(conc=8, ttft=900))
    merged = deployments(read_rows(path))
    assert sorted(pd.to_numeric(merged["silicon_ttft_ms"])) == [200.0, 900.0]
    # the same deployment under two engine profiles (TensorRT-LLM 1.0 and 1.2) is two deployments
    (tmp_path / "versions").mkdir()
    versions = write(tmp_path / "versions", agg(backend="trtllm", version="1.0.0rc3", ttft=100),
                     agg(backend="trtllm", version="1.2.0rc6", ttft=300))
    assert sorted(pd.to_numeric(deployments(read_rows(versions))["silicon_ttft_ms"])) == [100.0, 300.0]
    done = subprocess.run([sys.executable, "benchmarks/fit_serve.py", "--against", str(path),
                           "--engine", "vllm", "--only", "frontend_ms", "--passes", "1", "--jobs", "1"],
                          cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    start = float(done.stderr.split("start ")[1].split()[0])
    final = float(done.stdout.split("objective ")[1].split()[0])
    assert final < start
    # the measured TTFTs are far above the engine's: the fit raises its front-end time
    fitted = float(done.stdout.split("  frontend_ms: ")[1].split()[0])
    assert fitted > 5 * catalog.engine("vllm").frontend_ms


def test_the_median_objective_counts_every_model_and_a_lost_row_as_a_miss():
    """benchmarks/fit_serve.py --objective median: the median errors over their targets, over
    all rows and averaged over the models with 20 rows or more, so a fit cannot give up a model
    for the others; a row the profile cannot represent counts as missed by 100%."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from fit_serve import median_objective

    def table(b_ttft, b_skipped=0):
        rows = ([("a", 10.0, 5.0, "")] * 25 + [("b", b_ttft, 10.0, "lost")] * b_skipped
                + [("b", b_ttft, 10.0, "")] * (20 - b_skipped) + [("c", 90.0, 90.0, "")] * 3)
        return pd.DataFrame(rows, columns=["model", "ttft_abs_err_pct", "tpot_abs_err_pct", "skipped"])
    # overall: a's rows hold the median, 10/20 + 5/10; per model a 0.5 + 0.5, b X/20 + 10/10
    # (c, 3 rows, is not averaged in)
    assert median_objective(table(20.0)) == pytest.approx(1.0 + (1.0 + 2.0) / 2)
    assert median_objective(table(60.0)) == pytest.approx(1.0 + (1.0 + 4.0) / 2)
    # 15 of b's 20 rows lost: b's medians are 100% and 100%
    assert median_objective(table(20.0, b_skipped=15)) == pytest.approx(1.0 + (1.0 + 15.0) / 2)
