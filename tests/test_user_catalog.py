"""A planner's own GPUs, models and engine profiles: from a config's `catalog:` or `--catalog
FILE`, in the bundled files' format, validated as they are, shadowing a bundled entry only when
asked; only an entry's fields matter, never its name or the route it came by."""
import json

import pytest
import yaml

from pddsim import catalog, cli
from pddsim.config import Config, bundled, load_config
from pddsim.errors import InputError

SMALL = ["--quiet", "--set", "workload.limit=150"]


def entry(kind: str, name: str, **changes) -> dict:
    """A bundled entry's fields, as its data file gives them, with `changes`."""
    return {**catalog.BUNDLED.known(kind)[name].model_dump(exclude={"name"}), **changes}


def write(path, tree) -> str:
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def run_json(capsys, *argv) -> dict:
    code = cli.main(["run", *map(str, argv), *SMALL, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return {k: v for k, v in json.loads(out).items() if k != "provenance"}


def test_a_copy_under_a_new_name_runs_exactly_as_the_original(tmp_path, capsys):
    """GPU, model and engine renamed: same summary, by file or inline in the config."""
    hw = write(tmp_path / "hw.yaml", {"gpus": {"my-h800": entry("gpus", "h800")},
                                      "models": {"my-moe": entry("models", "pdd-1t-moe")},
                                      "engines": {"my-engine": entry("engines", "distserve-2024")}})
    renamed = ["--set", "clusters.a.gpu=my-h800", "--set", "model=my-moe", "--set", "perf.engine=my-engine"]
    original = run_json(capsys, "same_dc_pd")
    assert run_json(capsys, "same_dc_pd", "--catalog", hw, *renamed) == original
    inline = yaml.safe_load(bundled("same_dc_pd.yaml").read_text())
    inline["catalog"] = yaml.safe_load(open(hw))
    config = write(tmp_path / "inline.yaml", {**inline, "base_dir": str(bundled(""))})
    assert run_json(capsys, config, *renamed) == original


def test_override_shadows_a_bundled_entry_only_when_asked(tmp_path, capsys, input_error):
    cheap = entry("gpus", "h800", price_per_hour=1.0)
    asked = write(tmp_path / "asked.yaml", {"gpus": {"h800": {**cheap, "override": True}}})
    base, shadowed = run_json(capsys, "same_dc_pd"), run_json(capsys, "same_dc_pd", "--catalog", asked)
    gpus = sum(g.count * g.gpus for g in load_config("same_dc_pd").clusters["a"].instances)
    assert base["cost_per_hour"] - shadowed["cost_per_hour"] == pytest.approx(gpus * (2.0 - 1.0))
    assert shadowed["ttft_p50_s"] == base["ttft_p50_s"]           # only the price changed
    silent = write(tmp_path / "silent.yaml", {"gpus": {"h800": cheap}})
    code = cli.main(["validate", "same_dc_pd", "--catalog", silent])
    input_error(code, capsys.readouterr().err, silent, "gpus.h800", "override: true")
    typo = write(tmp_path / "typo.yaml", {"gpus": {"h80": {**cheap, "override": True}}})
    code = cli.main(["validate", "same_dc_pd", "--catalog", typo])
    input_error(code, capsys.readouterr().err, typo, "gpus.h80.override", "no GPU 'h80'")


@pytest.mark.parametrize("kind, name, field, value, says", [
    ("gpus", "h800", "hbm_gb", -1, "Input should be greater than 0"),
    ("models", "pdd-1t-moe", "active_params_b", 5000, "active_params_b exceeds params_b"),
    ("engines", "vllm", "memory", 2, "Input should be less than or equal to 1"),
    ("gpus", "h800", "hbm_tb", 1, "Extra inputs are not permitted"),
    ("engines", "vllm", "host_layer_us", {"h100": 3}, "unknown GPU 'h100'"),
])
def test_a_bad_entry_is_one_line_naming_the_file_and_field(tmp_path, capsys, input_error,
                                                           kind, name, field, value, says):
    bad = write(tmp_path / "bad.yaml", {kind: {"mine": {**entry(kind, name), field: value}}})
    code = cli.main(["validate", "same_dc_pd", "--catalog", bad])
    place = f"{kind}.mine" if field in ("active_params_b", "host_layer_us") else f"{kind}.mine.{field}"
    input_error(code, capsys.readouterr().err, bad, place, says)


def test_a_name_defined_twice_is_an_error_naming_both(tmp_path, capsys, input_error):
    first = write(tmp_path / "a.yaml", {"gpus": {"mine": entry("gpus", "h800")}})
    second = write(tmp_path / "b.yaml", {"gpus": {"mine": entry("gpus", "h200")}})
    code = cli.main(["validate", "same_dc_pd", "--catalog", first, "--catalog", second])
    input_error(code, capsys.readouterr().err, second, "gpus.mine", f"also defined in {first}")


def test_unknown_names_say_what_is_known_including_yours(tmp_path, capsys, input_error):
    hw = write(tmp_path / "hw.yaml", {"gpus": {"mine": entry("gpus", "h800")}})
    code = cli.main(["validate", "same_dc_pd", "--catalog", hw, "--set", "clusters.a.gpu=yours"])
    input_error(code, capsys.readouterr().err, "clusters.a.gpu", "unknown GPU 'yours'", "mine")
    code = cli.main(["validate", "same_dc_pd", "--set", "model=nope"])
    input_error(code, capsys.readouterr().err, "model: unknown model 'nope'")


def test_include_reads_files_relative_to_the_config_and_only_there(tmp_path):
    write(tmp_path / "hw.yaml", {"gpus": {"mine": entry("gpus", "h800")}})
    raw = yaml.safe_load(bundled("same_dc_pd.yaml").read_text())
    raw["catalog"] = {"include": ["hw.yaml"]}
    raw["clusters"]["a"]["gpu"] = "mine"
    raw["workload"]["trace"] = str(bundled("same_dc_pd.yaml").parent / raw["workload"]["trace"])
    cfg = load_config(write(tmp_path / "c.yaml", raw))
    assert cfg.catalog.gpus["mine"].source == str(tmp_path / "hw.yaml") and cfg.catalog.include == []
    assert Config.model_validate(cfg.model_dump()) == cfg       # the resolved config stands alone
    with pytest.raises(ValueError, match="catalog.include is read by load_config"):
        Config.model_validate({**cfg.model_dump(), "catalog": {"include": ["hw.yaml"]}})


def test_set_appends_with_plus_equals(tmp_path):
    cfg = load_config("faults/pdd", ["faults.random+={role: decode, mtbf_s: 100, mttr_s: 5}"])
    assert cfg.faults.random[-1].mtbf_s == 100
    with pytest.raises(InputError, match="--set name\\+=: name is not a list"):
        load_config("pdd", ["name+=x"])


def test_catalog_list_and_show_say_where_each_entry_comes_from(tmp_path, capsys):
    hw = write(tmp_path / "hw.yaml", {"models": {"mine": entry("models", "llama-3.1-8b")}})
    assert cli.main(["catalog", "list", "models", "--catalog", hw]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["mine"].endswith(str(tmp_path / "hw.yaml"))
    assert rows["llama-3.1-8b"].endswith("pddsim/data/models.yaml")
    assert set(catalog.models()) | {"mine"} == set(rows)
    assert cli.main(["catalog", "show", "mine", "--catalog", hw]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"# model mine, from {tmp_path / 'hw.yaml'}")
    again = write(tmp_path / "again.yaml", {"models": yaml.safe_load(shown.replace("mine:", "again:", 1))})
    assert cli.main(["catalog", "show", "again", "--catalog", again]) == 0       # `show` is a file
    assert capsys.readouterr().out.split("\n", 1)[1] == shown.split("\n", 1)[1].replace("mine:", "again:", 1)


def test_catalog_list_or_show_of_nothing_known_is_one_line(capsys, input_error):
    input_error(cli.main(["catalog", "list", "gpu"]), capsys.readouterr().err, "gpus, models, engines")
    input_error(cli.main(["catalog", "show", "nope"]), capsys.readouterr().err, "'nope'")


def test_the_handoff_benchmark_runs_on_a_users_gpu(tmp_path, capsys):
    """`bench handoff` on a scenario whose MD GPU is the user's: a renamed copy measures the same."""
    from pddsim.experiments.handoff_bench import HandoffBenchSpec, scenario_handoff
    hw = write(tmp_path / "hw.yaml", {"gpus": {"my-h200": entry("gpus", "h200")}})
    spec = HandoffBenchSpec(runs=20)
    assert load_config("paper/pdd").clusters["b"].gpu == "h200"
    own = load_config("paper/pdd", [f"catalog.include+={hw}", "clusters.b.gpu=my-h200"])
    mine, bundled_gpu = scenario_handoff(own, spec), scenario_handoff(load_config("paper/pdd"), spec)
    assert mine.pop("setup") == {**bundled_gpu.pop("setup"), "md_gpu": "my-h200"}   # says whose
    assert mine == bundled_gpu
    assert cli.main(["bench", "handoff", "--runs", "20", "--catalog", hw, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scenario"]["config"] == "paper_pdd"
