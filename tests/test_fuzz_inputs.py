"""Inputs nobody tried: every malformed trace, config or flag ends with exit status 2 and one stderr
line naming the file (and line) or the field; no traceback, no hang."""
import json
import lzma
import subprocess
import sys

import pytest

from pddsim.cli import main
from pddsim.config import bundled

GOOD = {"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}
NATIVE = {"arrival_s": 0, "input_tokens": 100, "output_tokens": 5}


def line(obj) -> bytes:
    return json.dumps(obj).encode() + b"\n"


TRACES = {   # name: (bytes, what the error line must name)
    "empty.jsonl": (b"", "empty.jsonl"),
    "binary.jsonl": (bytes(range(256)), "binary.jsonl:1"),
    "utf8.jsonl": (line(GOOD)[:-2] + b', "x": "\xff\xfe"}\n', "utf8.jsonl:1"),
    "utf8_late.jsonl": (line(GOOD) + b"\xff\n", "utf8_late.jsonl:2"),
    "type.jsonl": (line(GOOD | {"input_length": "many"}), "type.jsonl:1"),
    "nan.jsonl": (b'{"timestamp": NaN, "input_length": 1000, "output_length": 10, "hash_ids": [1]}\n',
                  "nan.jsonl:1"),
    "inf.jsonl": (b'{"timestamp": 0, "input_length": Infinity, "output_length": 10, "hash_ids": [1]}\n',
                  "inf.jsonl:1"),
    "negative.jsonl": (line(GOOD | {"output_length": -5}), "negative.jsonl:1"),
    "float.jsonl": (line(GOOD | {"output_length": 1e12}), "float.jsonl:1"),
    "dangling.jsonl": (line(NATIVE | {"follows": 7}), "dangling.jsonl:1"),
    "azure.csv": (b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,abc,10\n", "azure.csv:2"),
    "azure_utf8.csv": (b"TIMESTAMP,ContextTokens,GeneratedTokens\n\xff\xfe,1,10\n", "azure_utf8.csv"),
    "cut.jsonl.xz": (lzma.compress(line(GOOD) * 50)[:40], "cut.jsonl.xz"),
    "cut.json.xz": (lzma.compress(b'{"a": 1}' * 100)[:40], "cut.json.xz"),
}


@pytest.mark.parametrize("name", sorted(TRACES))
def test_malformed_trace(tmp_path, capsys, input_error, name):
    data, where = TRACES[name]
    path = tmp_path / name
    path.write_bytes(data)
    code = main(["run", str(bundled("same_dc_pd.yaml")), "--trace", str(path), "--quiet"])
    input_error(code, capsys.readouterr().err, where)


def test_an_absurd_output_length_is_refused_not_simulated(tmp_path, input_error):
    path = tmp_path / "huge.jsonl"
    path.write_bytes(line(GOOD | {"output_length": 10**12}))
    p = subprocess.run([sys.executable, "-m", "pddsim.cli", "run", str(bundled("same_dc_pd.yaml")),
                        "--trace", str(path), "--quiet"], capture_output=True, text=True, timeout=120)
    input_error(p.returncode, p.stderr, "huge.jsonl", "request 0", "workload.max_tokens")


CONFIGS = {
    "yaml.yaml": (b"name: [unclosed\n", "yaml.yaml:2"),
    "types.yaml": (b"name: x\nmodel: 5\nclusters: 3\n", "types.yaml"),
    "utf8.yaml": (b"name: \xff\xfe\n", "utf8.yaml"),
    "list.yaml": (b"- 1\n- 2\n", "list.yaml"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_malformed_config(tmp_path, capsys, input_error, name):
    data, where = CONFIGS[name]
    (tmp_path / name).write_bytes(data)
    input_error(main(["run", str(tmp_path / name), "--quiet"]), capsys.readouterr().err, where)


def test_a_directory_as_config(tmp_path, capsys, input_error):
    input_error(main(["run", str(tmp_path), "--quiet"]), capsys.readouterr().err, str(tmp_path))


def test_an_impossible_deployment(capsys, input_error):
    code = main(["run", str(bundled("pdd.yaml")), "--set", "clusters.b.instances.0.tp=1", "--quiet"])
    input_error(code, capsys.readouterr().err, "clusters.b.instances.0")


@pytest.mark.parametrize("override, field", [
    ("nope.x=1", "nope"),
    ("wan.bandwidth_gbps=[1", "wan.bandwidth_gbps"),
    ("wan.bandwidth_gbps=abc", "wan.bandwidth_gbps"),
    ("wan.bandwidth_gbps=.nan", "wan.bandwidth_gbps"),
    ("clusters=5", "clusters"),
    ("noequals", "noequals"),
])
def test_bad_set(capsys, input_error, override, field):
    code = main(["run", str(bundled("pdd.yaml")), "--set", override, "--quiet"])
    input_error(code, capsys.readouterr().err, field)
