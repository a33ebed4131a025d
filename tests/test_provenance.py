"""Every output says what produced it, and two identical runs differ only in when they ran and
how long they took (`provenance.run_info`): the summary itself is byte-identical."""
import hashlib
import json
import re

import yaml

import pddsim
from pddsim import cli
from pddsim.config import Config, bundled, load_config
from pddsim.provenance import config_sha256

SMALL = ["--quiet", "--set", "workload.limit=120"]
RUN_INFO = re.compile(r',\n {4}"run_info": \{[^}]*\}')


def cli_out(capsys, *argv) -> str:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_two_identical_runs_give_the_same_bytes_but_for_run_info(tmp_path, capsys, monkeypatch):
    runs = []
    for i in range(2):                  # the same command line, run in two places
        (tmp_path / str(i)).mkdir()
        monkeypatch.chdir(tmp_path / str(i))
        runs.append(cli_out(capsys, "run", "same_dc_pd", *SMALL, "--json", "--out", "out"))
    assert runs[0] != runs[1]                      # the wall time, at least
    assert RUN_INFO.sub("", runs[0]) == RUN_INFO.sub("", runs[1])
    assert "run_info" not in RUN_INFO.sub("", runs[0])
    summary = [(tmp_path / str(i) / "out" / "summary.json").read_bytes() for i in range(2)]
    assert summary[0] == summary[1] and b"wall_s" not in summary[0]
    prov = [json.loads((tmp_path / str(i) / "out" / "provenance.json").read_text()) for i in range(2)]
    assert [p.pop("run_info").keys() for p in prov] == [{"date", "wall_s"}] * 2
    assert prov[0] == prov[1]


def test_provenance_names_version_config_trace_seed_catalog_and_command(tmp_path, capsys):
    doc = json.loads(cli_out(capsys, "run", "same_dc_pd", *SMALL, "--seed", "3", "--json"))
    prov = doc["provenance"]
    cfg = load_config("same_dc_pd", ["workload.limit=120"])
    assert prov["pddsim"] == pddsim.__version__
    assert prov["seed"] == 3
    assert prov["command"] == "pddsim run same_dc_pd --quiet --set workload.limit=120 --seed 3 --json"
    assert Config.model_validate(prov["config"]) == cfg
    assert prov["config_sha256"] == config_sha256(cfg)
    trace = bundled("same_dc_pd.yaml").parent / cfg.workload.trace
    assert prov["trace"] == {"path": str(trace.resolve()),
                             "sha256": hashlib.sha256(trace.read_bytes()).hexdigest()}
    assert prov["catalog"] == [{"kind": "models", "name": "pdd-1t-moe", "source": "pddsim/data/models.yaml"},
                               {"kind": "gpus", "name": "h800", "source": "pddsim/data/gpus.yaml"},
                               {"kind": "engines", "name": "distserve-2024",
                                "source": "pddsim/data/engines.yaml"}]
    assert "wall_s" not in doc and set(prov["run_info"]) == {"date", "wall_s"}


def test_the_recorded_config_reproduces_the_run(tmp_path, capsys):
    """Provenance is enough to make the output again: its config, run at its seed."""
    first = json.loads(cli_out(capsys, "run", "pdd", *SMALL, "--seed", "2", "--json"))
    prov = first.pop("provenance")
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(prov["config"]))
    second = json.loads(cli_out(capsys, "run", again, "--quiet", "--seed", str(prov["seed"]), "--json"))
    assert second.pop("provenance")["config_sha256"] == prov["config_sha256"]
    assert second == first


def test_a_changed_trace_or_config_changes_its_hash(tmp_path, capsys):
    trace = bundled("same_dc_pd.yaml").parent / load_config("same_dc_pd").workload.trace
    shorter = tmp_path / "t.jsonl"
    shorter.write_text("".join(trace.read_text().splitlines(keepends=True)[:-1]))
    base = json.loads(cli_out(capsys, "run", "same_dc_pd", *SMALL, "--json"))["provenance"]
    other = json.loads(cli_out(capsys, "run", "same_dc_pd", *SMALL, "--json",
                               "--trace", shorter))["provenance"]
    assert other["trace"]["path"] == str(shorter) and other["trace"]["sha256"] != base["trace"]["sha256"]
    assert other["config_sha256"] != base["config_sha256"]


def test_a_users_catalog_entry_is_recorded_with_its_file(tmp_path, capsys):
    from pddsim import catalog
    hw = tmp_path / "hw.yaml"
    hw.write_text(yaml.safe_dump({"gpus": {"mine": catalog.gpu("h800").model_dump(exclude={"name"})}}))
    prov = json.loads(cli_out(capsys, "run", "same_dc_pd", *SMALL, "--json", "--catalog", hw,
                              "--set", "clusters.a.gpu=mine"))["provenance"]
    assert {"kind": "gpus", "name": "mine", "source": str(hw)} in prov["catalog"]
    assert prov["config"]["catalog"]["gpus"]["mine"]["hbm_gb"] == catalog.gpu("h800").hbm_gb


def test_compare_and_capacity_outputs_carry_each_systems_provenance(tmp_path, capsys):
    out = tmp_path / "cmp"
    doc = json.loads(cli_out(capsys, "compare", "same_dc_pd", "pdd", *SMALL, "--no-capacity", "--json",
                             "--out", out))
    assert [s["provenance"]["config"]["name"] for s in doc] == ["same_dc_pd", "pdd"]
    for folder in sorted(out.iterdir()):
        prov = json.loads((folder / "provenance.json").read_text())
        assert folder.name.endswith(prov["config"]["name"])


def test_version(capsys):
    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"pddsim {pddsim.__version__}\n"
