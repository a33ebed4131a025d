"""The bathtub command: its output's shape, and the tail-chunk mechanism on a deployment whose
iteration time is exactly base + per-token cost."""
import json

import pytest

from pddsim.cli import main
from pddsim.experiments.bathtub import Stream, bathtub, parse_hits, shared_tokens


def test_json_points_default_policy_first(capsys):
    code = main(["bathtub", "configs/same_dc_pd.yaml", "--hits", "0,0.5,0.9", "--context", "4096",
                 "--requests", "30", "--rate", "20", "--json", "--quiet"])
    assert code == 0
    points = json.loads(capsys.readouterr().out)["points"]
    assert [p["policy"] for p in points] == ["packed"] * 3 + ["alone"] * 3
    assert [p["hit_rate"] for p in points[:3]] == [0.0, 0.5, 0.9]
    for p in points:
        assert {"policy", "hit_rate", "goodput_rps", "throughput_rps", "ttft_p50_s"} <= set(p)
        assert p["goodput_rps"] <= p["throughput_rps"] + 1e-12
    # the workload's hit rate is what the engine measured
    for p in points:
        assert p["measured_hit_rate"] == pytest.approx(p["hit_rate"], abs=0.05)


def test_bad_hits_are_one_line(input_error, capsys):
    code = main(["bathtub", "configs/same_dc_pd.yaml", "--hits", "0:1:0", "--quiet"])
    input_error(code, capsys.readouterr().err, "--hits")
    assert parse_hits("0:1:0.25") == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_tail_chunks_alone_waste_iterations_packing_recovers_them(make_config):
    """Iteration time = 50 ms + 10 us/token, chunks of 1,000 tokens, prompts of 10,000: a prompt
    whose uncached part is 3,000 tokens plus one block needs a fourth iteration for that block.
    Alone, that tail costs a whole fixed overhead; packed with the next prompt's chunk it does
    not. So computed tokens per second dip just past the step, and packing fills the dip."""
    cfg = make_config(roles=(("prefill", 1), ("decode", 1)), base=0.05, per_token=1e-5,
                 batching={"prefill_chunk": 1000, "token_budget": 2000})
    stream = Stream(context_tokens=10_000, output_tokens=2, rate_rps=1000.0, requests=40,
                    block_tokens=100)
    on_step, past_step = 0.7, 0.69                     # uncached 3,000 vs 3,100 tokens
    assert stream.context_tokens - shared_tokens(past_step, stream) == 3_100
    points = {(p["policy"], p["hit_rate"]): p for p in bathtub(cfg, [past_step, on_step], stream)}
    alone = {h: points[("alone", h)]["computed_tokens_per_s"] for h in (past_step, on_step)}
    packed = {h: points[("packed", h)]["computed_tokens_per_s"] for h in (past_step, on_step)}
    assert alone[past_step] < 0.9 * alone[on_step]           # the dip: a tail of 100 tokens alone
    assert packed[past_step] > 0.97 * packed[on_step]        # packed: no dip
    assert packed[past_step] > alone[past_step]


def test_defaults_are_one_set_and_show_the_phenomenon_on_the_bundled_config(capsys):
    """The API's and the CLI's stream are the same; on the bundled config it saturates the prefill
    pool at low hit rates (throughput far below the offered rate, rising with the hit rate) while
    some requests meet the SLO at every hit rate (goodput never 0)."""
    from dataclasses import fields

    from pddsim.config import load_config
    from pddsim.experiments.bathtub import Stream
    stream = Stream()
    helps = {a.dest: a.help for a in cli_parser_actions("bathtub")}
    for f, flag in zip(fields(Stream), ("context", "output", "rate", "requests", "block")):
        assert f"(default {getattr(stream, f.name):g}" in helps[flag]     # the help says Stream's
    hits = [0.0, 0.3, 0.6]
    api = bathtub(load_config("configs/same_dc_pd.yaml"), hits, policies=("packed",))
    assert main(["bathtub", "--hits", "0,0.3,0.6", "--policy", "packed", "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["points"] == json.loads(json.dumps(api))
    tput = [p["throughput_rps"] for p in api]
    assert tput[0] < 0.25 * stream.rate_rps and tput[1] < 0.25 * stream.rate_rps   # saturated
    assert tput[0] < tput[1] < tput[2] and tput[2] > 1.5 * tput[0]
    assert all(p["goodput_rps"] > 0 for p in api)


def cli_parser_actions(command: str):
    from pddsim.cli import parser
    sub = next(a for a in parser()._actions if a.dest == "command")
    return sub.choices[command]._actions
