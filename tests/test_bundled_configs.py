"""A bundled scenario is reachable by name wherever the user stands (`paper/pdd`, `pdd.yaml`,
`configs/pdd.yaml`), a file on disk of that name still wins, and `pddsim configs list` shows them."""
import pytest

from pddsim import cli
from pddsim.config import bundled, load_config
from pddsim.errors import InputError


@pytest.mark.parametrize("name, file", [("paper/pdd", "paper/pdd.yaml"), ("pdd.yaml", "pdd.yaml"),
                                        ("configs/pdd.yaml", "pdd.yaml"), ("same_dc_pd", "same_dc_pd.yaml")])
def test_a_bundled_scenario_by_name_from_anywhere(name, file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config(name) == load_config(bundled(file))


def test_a_file_on_disk_wins_over_the_bundled_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pdd.yaml").write_text(bundled("pdd.yaml").read_text().replace("name: pdd", "name: mine", 1))
    assert load_config("pdd.yaml").name == "mine"
    assert load_config("pdd").name == "pdd"          # no file `pdd`: the bundled one


def test_an_unknown_name_says_where_to_look(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match="no such config file.*pddsim configs list"):
        load_config("paper/nope")


def test_configs_list_shows_the_scenarios_not_the_golden_or_plan_files(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["configs", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"pdd", "same_dc_pd", "paper/pdd", "faults/pdd"} <= set(names)
    assert not [n for n in names if n.startswith(("golden", "plans"))]
    for name in names:                                   # each name is what `run` takes
        assert cli.main(["validate", name]) == 0


def test_a_bundled_golden_file_by_name(tmp_path, monkeypatch):
    from pddsim.config import locate
    monkeypatch.chdir(tmp_path)
    assert locate("golden/paper_small") == locate("configs/golden/paper_small.yaml") == bundled(
        "golden/paper_small.yaml")
