"""Importers of published profile formats, on small files written here in each format."""
import json

import pytest

from pddsim import cli
from pddsim.engine.perf import MeasuredTable
from pddsim.engine.perf_import import DECODE_BATCH, DECODE_CONTEXT, PREFILL_CONTEXT, PREFILL_TOKENS

FIT = {"prefill": [20.0, 0.1, 1e-5], "decoding_smallbs": [15.0, 5e-4, 0.05],
       "decoding_largebs": [10.0, 4e-4, 0.1], "decoding_large_small_bs_threshold": 95}


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr()


def test_distserve_table_reproduces_the_profile(tmp_path, capsys):
    src = tmp_path / "profile.json"
    src.write_text(json.dumps({"facebook/opt-13b": {"2": FIT}}))
    out = tmp_path / "t.csv"
    code, _ = run(capsys, "perf", "import", "--from", "distserve", src, "--model", "opt-13b",
                  "--gpu", "a100-80gb", "--tp", 2, "-o", out, "--commit", "abc", "--licence", "Apache-2.0")
    assert code == 0
    table = MeasuredTable(out)
    a, b, c = FIT["prefill"]
    for t in PREFILL_TOKENS[1:]:
        for kv in PREFILL_CONTEXT:      # a chunk over a prefix: t^2 + 2tP squared length
            assert table.iteration(t, t * (kv + t / 2), kv) == pytest.approx(
                (a + b * t + c * (t * t + 2 * t * kv)) / 1e3)
    for n in DECODE_BATCH:
        da, db, dc = FIT["decoding_smallbs"] if n < 95 else FIT["decoding_largebs"]
        for ctx in DECODE_CONTEXT:
            assert table.iteration(n, n * ctx, n * ctx, n * ctx) == pytest.approx(
                (da + db * n * ctx + dc * n) / 1e3)
    prov = json.loads((tmp_path / "t.csv.provenance.json").read_text())
    assert (prov["source"], prov["commit"], prov["licence"], prov["tp"]) == ("distserve", "abc",
                                                                            "Apache-2.0", 2)
    assert len(prov["files"][0]["sha256"]) == 64


def test_distserve_missing_tp_is_input_error(input_error, tmp_path, capsys):
    src = tmp_path / "profile.json"
    src.write_text(json.dumps({"facebook/opt-13b": {"2": FIT}}))
    code, io = run(capsys, "perf", "import", "--from", "distserve", src, "--model", "opt-13b",
                   "--gpu", "a100-80gb", "--tp", 4, "-o", tmp_path / "t.csv")
    input_error(code, io.err, str(src), "tp 4")


def write_csv(path, header, rows):
    path.write_text(",".join(header) + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
       "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def test_vidur_table_adds_operators_attention_and_all_reduces(tmp_path, capsys):
    """Per layer: operators 0.01 ms per op per token-unit, attention from its own profile, two
    all-reduces; 80 layers of Llama-2-70B."""
    tokens = (1, 2, 64, 128)
    mlp = write_csv(tmp_path / "mlp.csv",
                    [f"time_stats.{op}.median" for op in OPS]
                    + ["num_tokens", "num_tensor_parallel_workers"],
                    [[0.01 * t] * len(OPS) + [t, 2] for t in tokens]
                    + [[9] * len(OPS) + [t, 4] for t in tokens])
    attn_rows = [[0, t, kv, 0.001 * t * (kv + 1), ""] for t in (64, 128) for kv in (0, 1024)]
    attn_rows += [[n, 0, kv, "", 0.002 * n * kv] for n in (1, 2) for kv in (256, 1024)]
    attn = write_csv(tmp_path / "attention.csv",
                     ["batch_size", "prefill_chunk_size", "kv_cache_size",
                      "time_stats.attn_prefill.median", "time_stats.attn_decode.median"], attn_rows)
    ar = write_csv(tmp_path / "all_reduce.csv",
                   ["size", "num_workers", "time_stats.all_reduce.median"],
                   [[8192, 2, 0.02], [8192 * 128, 2, 0.1]])
    out = tmp_path / "t.csv"
    code, io = run(capsys, "perf", "import", "--from", "vidur", mlp, attn, ar, "--model", "llama-2-70b",
                   "--gpu", "a100-80gb", "--tp", 2, "-o", out)
    assert code == 0, io.err
    table = MeasuredTable(out)
    # prefill: 128 tokens over a 1,024-token prefix; the all-reduce of 128 x 8192 elements is measured
    layer = 9 * 0.01 * 128 + 0.001 * 128 * 1025 + 2 * 0.1
    assert table.iteration(128, 128 * (1024 + 64), 1024) == pytest.approx(80 * layer / 1e3)
    # decode: one request over 256 tokens; its all-reduce (8192 elements) is measured too
    layer = 9 * 0.01 * 1 + 0.002 * 1 * 256 + 2 * 0.02
    assert table.iteration(1, 256, 256, 256) == pytest.approx(80 * layer / 1e3)


def test_vidur_needs_both_profiles(input_error, tmp_path, capsys):
    mlp = write_csv(tmp_path / "mlp.csv", ["num_tokens"], [[1]])
    code, io = run(capsys, "perf", "import", "--from", "vidur", mlp, "--model", "llama-2-70b",
                   "--gpu", "a100-80gb", "--tp", 1, "-o", tmp_path / "t.csv")
    input_error(code, io.err, "attention.csv")


SPLITWISE = ["model", "hardware", "prompt_size", "batch_size", "token_size", "prompt_time",
             "token_time", "tensor_parallel"]


def test_splitwise_grid_is_imported_and_ragged_points_refused(input_error, tmp_path, capsys):
    # a full grid: prompts 128/512 at batch 1, decode batches 1/2 over the same contexts
    rows = [["llama2-70b", "a100-80gb", p, b, o, 10 + p / 10, 40 + b + p / 1000, 4]
            for p in (128, 512) for b in (1, 2) for o in (128,)]
    src = write_csv(tmp_path / "perf_model.csv", SPLITWISE,
                    rows + [r[:5] + [r[5] + 2, r[6], 4] for r in rows])
    out = tmp_path / "t.csv"
    code, io = run(capsys, "perf", "import", "--from", "splitwise", src, "--model", "llama-2-70b",
                   "--gpu", "a100-80gb", "--tp", 4, "-o", out)
    assert code == 0, io.err
    table = MeasuredTable(out)
    assert table.iteration(512, 512 * 256, 0) == pytest.approx((10 + 51.2 + 1) / 1e3)   # median
    assert table.iteration(2, 2 * 576, 2 * 576, 2 * 576) == pytest.approx((42 + 0.512) / 1e3)
    # the published shape: batch 1 over several contexts, batch 2 at one: not a grid
    ragged = write_csv(tmp_path / "ragged.csv", SPLITWISE, rows + [
        ["llama2-70b", "a100-80gb", 1024, 1, 128, 110, 41, 4]])
    code, io = run(capsys, "perf", "import", "--from", "splitwise", ragged, "--model", "llama-2-70b",
                   "--gpu", "a100-80gb", "--tp", 4, "-o", tmp_path / "r.csv")
    input_error(code, io.err, "decode rows must be a full grid", "missing tokens=2")
    assert not (tmp_path / "r.csv").exists()
