"""Engine profiles in configs and the predicted-vs-measured report."""
import json
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import given
from hypothesis import strategies as st

from pddsim import catalog, cli
from pddsim.config import DEFAULT_ENGINE, Perf, bundled, from_dict, load_config
from pddsim.engine.perf import MeasuredTable, Roofline
from pddsim.engine.perf_import import import_table
from pddsim.errors import InputError
from pddsim.experiments.perf_bench import compare, read_measured, roofline_of, summarise
from pddsim.system.deployment import build

HEADER = "model,gpu,tp,tokens,attn_pairs,kv_tokens,time_ms,source\n"
MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "measured" / "iterations.csv"
BAND = (0.85, 1.15)


def test_profile_fields_override_one_by_one():
    base = catalog.engine("modern-fp8")
    engine = Perf(engine="modern-fp8", overhead_ms=1.5).engine_profile()
    assert engine.overhead_ms == 1.5
    assert engine.model_copy(update={"overhead_ms": base.overhead_ms}) == base
    assert Perf().engine_profile() == catalog.engine(DEFAULT_ENGINE)


def test_host_launch_override_is_one_figure_or_one_per_known_gpu():
    assert Perf(engine="splitwise-2023", host_layer_us=50).engine_profile().host_layer_s("h200") == 50e-6
    per_gpu = Perf(engine="modern-fp8", host_layer_us={"a100-80gb": 300}).engine_profile()
    assert per_gpu.host_layer_s("a100-80gb") == 300e-6
    with pytest.raises(InputError, match=r"same_dc_pd.yaml: perf.host_layer_us: unknown GPU 'a100'"):
        load_config(bundled("same_dc_pd.yaml"), ["perf.host_layer_us={a100: 300}"])


def test_unknown_engine_is_a_field_error():
    """Names resolve against the bundled catalog and the config's own, so the config says."""
    with pytest.raises(InputError, match="same_dc_pd.yaml: clusters.a.perf.engine: unknown engine 'nope'"):
        load_config(bundled("same_dc_pd.yaml"), ["clusters.a.perf.engine=nope"])


def test_overhead_adds_to_every_iteration_exactly():
    model, gpu = catalog.model("llama-3.1-70b"), catalog.gpu("h100-sxm")
    low = Roofline(model, gpu, 4, Perf(overhead_ms=0).engine_profile())
    high = Roofline(model, gpu, 4, Perf(overhead_ms=7).engine_profile())
    assert high.iteration(512, 512 * 256, 0) - low.iteration(512, 512 * 256, 0) == pytest.approx(7e-3)
    assert high.decode_run(8, 8000, 10).total_s - low.decode_run(8, 8000, 10).total_s \
        == pytest.approx(70e-3)


def measured_file(tmp_path, rows):
    path = tmp_path / "measured.csv"
    path.write_text(HEADER + "".join(r + "\n" for r in rows))
    return path


def test_report_reproduces_hand_computed_errors(tmp_path):
    """Rows whose time is the profile's own prediction x 1.25 and x 0.8: the errors are 20% and
    25%, split by kind (a decode row attends exactly its KV) and source."""
    engine = catalog.engine("modern-fp8")
    p = Roofline(catalog.model("llama-3.1-70b"), catalog.gpu("h100-sxm"), 2, engine)
    prefill_ms = 1e3 * p.iteration(1024, 1024 * 512, 0)
    decode_ms = 1e3 * p.iteration(16, 16 * 2000, 16 * 2000, 16 * 2000)
    path = measured_file(tmp_path, [
        f"llama-3.1-70b,h100-sxm,2,1024,{1024 * 512},0,{prefill_ms * 1.25},a",
        f"llama-3.1-70b,h100-sxm,2,16,{16 * 2000},{16 * 2000},{decode_ms / 0.8},b"])
    df = read_measured(path)
    assert list(df["kind"]) == ["prefill", "decode"]
    summary = summarise(compare(df, {"m": roofline_of(engine)}, {"m": "b"}))["m"]
    assert summary["median_abs_err_pct"]["by_kind"] == {"decode": 20.0, "prefill": 20.0}
    assert summary["median_ratio"] == {"decode tp2": 0.8, "prefill tp2": 0.8}
    assert summary["by_source"] == {
        "a": {"fit": "held out", "median_abs_err_pct": {"all": 20.0, "prefill": 20.0},
              "median_ratio": {"prefill tp2": 0.8}},
        "b": {"fit": "fitted", "median_abs_err_pct": {"all": 20.0, "decode": 20.0},
              "median_ratio": {"decode tp2": 0.8}}}


def test_decode_pairs_tell_a_mixed_iteration_apart(tmp_path):
    """With `decode_pairs`, an iteration of a 512-token chunk over a 1,000-token prefix and 16
    decodes is `mixed`, priced with its decode pairs as decode attention (a time 1.25x that
    prediction reads 20%); a blank cell falls back to `attn_pairs == kv_tokens` for a decode."""
    engine = catalog.engine("modern-fp8")
    p = Roofline(catalog.model("llama-3.1-70b"), catalog.gpu("h100-sxm"), 4, engine)
    chunk, decodes = 512 * (1000 + 256), 16 * 3000
    mixed_ms = 1e3 * p.iteration(512 + 16, chunk + decodes, 1000 + decodes, decodes)
    path = tmp_path / "m.csv"
    path.write_text(HEADER.rstrip("\n") + ",decode_pairs\n"
                    f"llama-3.1-70b,h100-sxm,4,528,{chunk + decodes},{1000 + decodes},"
                    f"{mixed_ms * 1.25},a,{decodes}\n"
                    "llama-3.1-70b,h100-sxm,4,16,48000,48000,30,a,\n"
                    "llama-3.1-70b,h100-sxm,4,512,131072,0,90,a,0\n")
    df = read_measured(path)
    assert list(df["kind"]) == ["mixed", "decode", "prefill"]
    cases = compare(df, {"m": roofline_of(engine)})
    assert cases["predicted_ms"][0] == pytest.approx(mixed_ms, rel=1e-12)
    summary = summarise(cases)["m"]
    assert summary["median_abs_err_pct"]["by_kind"]["mixed"] == 20.0
    assert summary["median_ratio"]["mixed tp4"] == 0.8


@pytest.mark.parametrize("header, row, where", [
    (HEADER.rstrip("\n") + ",decode_pairs\n", "llama-3.1-70b,h100-sxm,2,8,80,80,5,a,81",
     ":2: .*decode_pairs within"),
    (HEADER.rstrip("\n") + ",batch\n", "llama-3.1-70b,h100-sxm,2,8,80,80,5,a,8",
     "unknown column.s. batch"),
    (HEADER, "llama-3.1-70b,h100-sxm,2,8,80,80,5", ":2: not the header's 8 fields"),
    (HEADER, "llama-3.1-70b,h100-sxm,2,8,80,80,5,a,extra", ":2: not the header's 8 fields"),
])
def test_bad_measured_columns_are_named(tmp_path, header, row, where):
    path = tmp_path / "m.csv"
    path.write_text(header + row + "\n")
    with pytest.raises(Exception, match=where):
        read_measured(path)


@pytest.mark.parametrize("row, where", [
    ("llama-3.1-70b,h100-sxm,two,1,1,1,5,a", ":2:"),
    ("llama-3.1-70b,h100-nope,2,1,1,1,5,a", ":2: unknown GPU"),
    ("llama-3.1-70b,h100-sxm,2,1,1,1,-5,a", ":2: tp and tokens"),
])
def test_bad_measured_rows_name_the_line(tmp_path, row, where):
    path = measured_file(tmp_path, [row])
    with pytest.raises(Exception, match=where):
        read_measured(path)


def test_bench_perf_cli(input_error, tmp_path, capsys):
    path = measured_file(tmp_path, ["llama-3.1-70b,h100-sxm,8,1,1000,1000,30,x",
                                    "llama-3.1-70b,h100-sxm,8,4096,8388608,0,400,x"])
    cases = tmp_path / "cases.csv"
    assert cli.main(["bench", "perf", "--against", str(path), "--json", "--cases", str(cases)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {f"roofline/{n}" for n in catalog.engines()}
    assert {name: s["by_source"]["x"]["fit"] for name, s in out.items()} == {
        f"roofline/{n}": "held out" for n in catalog.engines()}
    assert len(cases.read_text().splitlines()) == 1 + 2 * len(catalog.engines())
    bad = measured_file(tmp_path, ["llama-3.1-70b,h100-sxm,8,1,1,1"])
    code = cli.main(["bench", "perf", "--against", str(bad)])
    input_error(code, capsys.readouterr().err, f"{bad}:2")


def test_bench_perf_what_if_sets_a_constant_and_keeps_the_fit(input_error, tmp_path, capsys):
    """--set overhead_ms=+3 ms adds exactly 3 ms to every predicted iteration (the profile has no
    host floor); the overridden profile keeps the source it was fitted to; a field that is no
    engine constant, or a value out of range, is one error line naming it."""
    fitted = catalog.engine("distserve-2024").fitted_to
    path = measured_file(tmp_path, [f"opt-66b,a100-80gb,8,8,8192,8192,25,{fitted} (test)",
                                    f"opt-66b,a100-80gb,8,512,131072,0,60,{fitted} (test)"])

    def run(*settings):
        cases = tmp_path / "cases.csv"
        argv = ["bench", "perf", "--against", str(path), "--engine", "distserve-2024", "--json",
                "--cases", str(cases)]
        assert cli.main(argv + [a for s in settings for a in ("--set", s)]) == 0
        out = json.loads(capsys.readouterr().out)
        return out, pd.read_csv(cases)["predicted_ms"].to_numpy()

    base_ms = catalog.engine("distserve-2024").overhead_ms
    plain, plain_ms = run()
    what_if, what_if_ms = run(f"overhead_ms={base_ms + 3}")
    assert list(what_if) == [f"roofline/distserve-2024 [overhead_ms={base_ms + 3}]"]
    assert what_if_ms == pytest.approx(plain_ms + 3.0)
    assert [s["by_source"][f"{fitted} (test)"]["fit"] for s in (*plain.values(), *what_if.values())] \
        == ["fitted", "fitted"]
    for setting, named in (("table=x", "--set table: not an engine constant"),
                           ("memory=1.5", "--set: memory"), ("fitted_to=x", "--set fitted_to")):
        code = cli.main(["bench", "perf", "--against", str(path), "--set", setting])
        input_error(code, capsys.readouterr().err, named)


def test_bench_perf_tests_a_table_on_the_cases_of_its_model_gpu_and_tp(input_error, tmp_path,
                                                                        capsys):
    """A table imported from a DistServe profile prices only its own model, GPU and TP, inside its
    grid: a case 1.25x its prediction reads 20%, a case of another TP and one beyond the grid's
    largest batch are counted as not covered; its source is marked as the one it came from."""
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"facebook/opt-13b": {"2": {
        "prefill": [20.0, 0.1, 1e-5], "decoding_smallbs": [15.0, 5e-4, 0.05],
        "decoding_largebs": [10.0, 4e-4, 0.1], "decoding_large_small_bs_threshold": 95}}}))
    table = tmp_path / "t.csv"
    import_table("distserve", [profile], table, model="opt-13b", gpu="a100-80gb", tp=2)
    own_ms = 1e3 * MeasuredTable(table).iteration(8, 8 * 1000, 8 * 1000, 8 * 1000)
    path = measured_file(tmp_path, [f"opt-13b,a100-80gb,2,8,8000,8000,{own_ms / 0.8},DistServe@x",
                                    "opt-13b,a100-80gb,4,8,8000,8000,30,DistServe@x",
                                    "opt-13b,a100-80gb,2,512,512000,512000,30,other"])
    assert cli.main(["bench", "perf", "--against", str(path), "--engine", "modern-fp8",
                     "--table", str(table), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)[f"table/{table}"]
    assert (out["cases"], out["not_covered"]) == (1, 2)
    assert out["by_source"] == {"DistServe@x": {
        "fit": "fitted", "median_abs_err_pct": {"all": 20.0, "decode": 20.0},
        "median_ratio": {"decode tp2": 0.8}}}
    (tmp_path / "t.csv.provenance.json").unlink()
    code = cli.main(["bench", "perf", "--against", str(path), "--table", str(table)])
    input_error(code, capsys.readouterr().err, f"{table}: no t.csv.provenance.json")


def test_a_cluster_uses_its_own_perf(make_config, perf_table, tmp_path):
    """A two-cluster deployment: the cluster that carries its own perf gets it, the other the
    config's."""
    cfg = make_config(roles=(("prefill", 1), ("decode", 1)), two_clusters=True, roofline=True,
                 wan={"bandwidth_gbps": 100})
    table = perf_table(tmp_path / "b.csv", 0.02, 1e-5)
    raw = cfg.model_dump()
    raw["clusters"]["b"]["perf"] = {"kind": "table", "table": str(table)}
    cfg = from_dict(raw, "t")
    dep = build(simpy.Environment(), cfg, 0)
    perf = {i.cluster: i.perf for pool in dep.pools.values() for i in pool}
    assert isinstance(perf["b"], MeasuredTable) and isinstance(perf["a"], Roofline)
    assert perf["b"].iteration(100, 100 * 50, 0) == pytest.approx(0.02 + 100e-5)


def test_profiles_meet_the_targets_on_the_bundled_measurements():
    """The README's report, pinned. On the source each profile was fitted to, the median absolute
    error is <= 15% for prefill and for decode and the median decode ratio is in 0.85-1.15 at
    every TP (no TP trend left). The default is within 20% pooled over every case, as the issue
    measured its errors, and on the 2023-24 engine held out from its fit. `modern-fp8`, fitted to
    nothing, is within 20% on the modern FP8 engine, its decode ratio in the band."""
    df = read_measured(MEASURED)
    summary = summarise(compare(df, {n: roofline_of(p) for n, p in catalog.engines().items()},
                                {n: p.fitted_to for n, p in catalog.engines().items()}))

    def source(name, prefix):
        (v,) = (v for src, v in summary[name]["by_source"].items() if src.startswith(prefix))
        return v

    def within(err, pct):
        return max(err["prefill"], err["decode"]) <= pct

    def in_band(ratios):
        decode = [r for k, r in ratios.items() if k.startswith("decode")]
        return decode and all(BAND[0] <= r <= BAND[1] for r in decode)

    fitted = {n: p.fitted_to for n, p in catalog.engines().items() if p.fitted_to}
    assert DEFAULT_ENGINE in fitted and len(fitted) >= 2
    for name, prefix in fitted.items():
        v = source(name, prefix)
        assert v["fit"] == "fitted" and within(v["median_abs_err_pct"], 15), (name, v)
        assert in_band(v["median_ratio"]), (name, v)
    assert within(summary[DEFAULT_ENGINE]["median_abs_err_pct"]["by_kind"], 20)
    assert within(source(DEFAULT_ENGINE, "splitwise")["median_abs_err_pct"], 20)
    nim = source("modern-fp8", "NIM")
    assert nim["fit"] == "held out" and within(nim["median_abs_err_pct"], 20), nim
    assert in_band(nim["median_ratio"]), nim


@cache
def a100_tp8_batch1_decodes_at_1024() -> pd.Series:
    df = read_measured(MEASURED)
    point = df[(df["gpu"] == "a100-80gb") & (df["tp"] == 8) & (df["tokens"] == 1)
               & (df["kv_tokens"] == 1024)].set_index("model")["time_ms"]
    assert sorted(point.index) == ["llama-2-70b", "opt-66b"]
    return point


@given(st.floats(0.05, 1), st.floats(0.05, 1), st.floats(0.01, 1), st.floats(0.05, 1),
       st.floats(0, 50), st.floats(0, 500), st.floats(0, 100), st.floats(0, 2000))
def test_no_one_profile_fits_both_engines_batch1_decode_at_tp8(linear, attn_prefill, attn_decode,
                                                                memory, overhead_ms, base_us,
                                                                step_us, host_us):
    """Why the default cannot also match the held-out engine at TP8. Llama-2-70B has 80 layers,
    OPT-66B 64, and none of Llama's per-layer costs (weights, KV, all-reduce bytes, launches) is
    larger, so under any constants its predicted batch-1 decode takes at most 80/64 of OPT-66B's.
    Measured on A100 TP8 at a 1,024-token context the two engines are 1.91x apart (Splitwise
    44.8 ms, DistServe 23.4 ms): both ratios in 0.85-1.15 would need a predicted ratio >= 1.41."""
    engine = catalog.EngineProfile(
        name="any", linear_bf16=linear, linear_fp8=linear, attn_prefill=attn_prefill,
        attn_decode=attn_decode, memory=memory, overhead_ms=overhead_ms, allreduce_base_us=base_us,
        allreduce_step_us=step_us, host_layer_us=host_us)
    point = a100_tp8_batch1_decodes_at_1024()
    one = np.ones(1)
    predicted = {m: 1e3 * roofline_of(engine)(m, "a100-80gb", 8).iterations(
        one, 1024 * one, 1024 * one, 1024 * one)[0] for m in ("llama-2-70b", "opt-66b")}
    assert predicted["llama-2-70b"] / predicted["opt-66b"] <= 80 / 64 + 1e-9
    ratios = [predicted[m] / point[m] for m in predicted]
    assert not all(BAND[0] <= r <= BAND[1] for r in ratios)
