"""The parsed-trace cache: a hit gives the very workload a fresh read gives; an entry that is damaged,
unusable or for other bytes is never used; trouble is said once; orjson decodes as the standard library."""
import json
import lzma
from pathlib import Path

import orjson
import pytest
from test_workload import TRACES, conversation, write_conversation

from pddsim.workload import readers, trace_cache
from pddsim.workload.readers import read_workload


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache of the test's own, and trouble said afresh."""
    directory = tmp_path / "cache"
    monkeypatch.setenv(trace_cache.ENV, str(directory))
    monkeypatch.setattr(trace_cache, "_said", set())
    return directory / "traces"


def entries(cache: Path) -> list[Path]:
    return sorted(cache.iterdir()) if cache.exists() else []


def same(a, b) -> bool:
    return (a.requests == b.requests and a.sessions == b.sessions and a.source == b.source
            and a.extra == b.extra and list(a.extra["repairs"]) == list(b.extra["repairs"]))


def uncached(path: Path, monkeypatch, **kw):
    """A read that neither uses nor fills the cache."""
    with monkeypatch.context() as m:
        m.setattr(trace_cache, "load", lambda name: None)
        m.setattr(trace_cache, "store", lambda name, payload: None)
        return read_workload(path, **kw)


@pytest.mark.parametrize("shared_prefix", [False, True])
def test_a_hit_reads_what_a_fresh_read_reads(tmp_path, cache, monkeypatch, capsys, shared_prefix):
    doc = conversation()
    doc["requests"][-1]["hash_ids"] = [1, 2, 9, 4, 5]     # a request not extending the one it follows
    doc["requests"][2]["out"] = 0                          # and every repair
    write_conversation(tmp_path / "a.json", doc)
    write_conversation(tmp_path / "b.json.xz", conversation())
    fresh = uncached(tmp_path, monkeypatch, shared_prefix=shared_prefix)
    assert entries(cache) == []
    miss = read_workload(tmp_path, shared_prefix=shared_prefix)
    assert len(entries(cache)) == 2
    stamps = [p.stat().st_mtime_ns for p in entries(cache)]
    monkeypatch.setattr(readers, "_decode_json", lambda file, raw: pytest.fail("decoded on a hit"))
    hit = read_workload(tmp_path, shared_prefix=shared_prefix)
    assert same(miss, fresh) and same(hit, fresh)
    assert set(fresh.extra["repairs"]) == {"think_time missing -> 0", "api_time missing -> 0",
                                           "output 0 -> 1 token"}
    assert [p.stat().st_mtime_ns for p in entries(cache)] == stamps
    assert capsys.readouterr().err == ""


def test_a_hit_names_the_file_read_now(tmp_path, cache):
    """The same bytes under another name hit, and a bad request is reported under the new name."""
    doc = conversation()
    doc["requests"][0]["hash_ids"] = [1]                  # 1 id for 10 tokens in blocks of 4
    for name in ("first.json", "second.json"):
        with pytest.raises(readers.InputError, match=f"{name}: request 0: 1 hash ids"):
            read_workload(write_conversation(tmp_path / name, doc))
    assert len(entries(cache)) == 1


def test_other_bytes_or_options_are_other_entries(tmp_path, cache):
    path = write_conversation(tmp_path / "c.json", conversation())
    before = read_workload(path)
    read_workload(path, shared_prefix=True)
    doc = conversation()
    doc["requests"][0]["out"] = 7
    after = read_workload(write_conversation(path, doc))
    assert len(entries(cache)) == 3
    assert before.requests[0].output_tokens == 2 and after.requests[0].output_tokens == 7


def edit_output_tokens(entry: Path) -> None:
    """A well-formed entry that would give a wrong result: its first request's output changed."""
    digest, _, payload = entry.read_bytes().partition(b"\n")
    doc = orjson.loads(payload)
    doc["rows"][0][3] += 1
    entry.write_bytes(digest + b"\n" + orjson.dumps(doc))


def test_an_edited_entry_is_a_miss_said_once(tmp_path, cache, monkeypatch, capsys):
    for name in ("a.json", "b.json"):
        doc = conversation()
        doc["id"] = name
        write_conversation(tmp_path / name, doc)
    fresh = uncached(tmp_path, monkeypatch)
    read_workload(tmp_path)
    for entry in entries(cache):
        edit_output_tokens(entry)
    got = read_workload(tmp_path)
    assert same(got, fresh)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "is damaged" in err[0] and str(cache) in err[0]
    assert same(read_workload(tmp_path), fresh)           # re-written whole on the miss
    assert capsys.readouterr().err == ""


def test_an_entry_that_checks_but_cannot_be_used_is_a_miss(tmp_path, cache, monkeypatch, capsys):
    path = write_conversation(tmp_path / "c.json", conversation())
    fresh = uncached(path, monkeypatch)
    read_workload(path)
    (entry,) = entries(cache)
    payload = orjson.dumps({"block": 4, "repairs": {}, "rows": [["0", 0.0]]})
    entry.write_bytes(trace_cache.hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)
    assert same(read_workload(path), fresh)
    assert "is unusable (ValueError" in capsys.readouterr().err


def test_a_cache_that_cannot_be_written_is_said_once(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(trace_cache.ENV, str(blocker))
    monkeypatch.setattr(trace_cache, "_said", set())
    write_conversation(tmp_path / "a.json", conversation())
    write_conversation(tmp_path / "b.json", conversation())
    assert same(read_workload(tmp_path), uncached(tmp_path, monkeypatch))
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "cannot write the trace cache" in err[0]


def test_the_default_directory_is_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(trace_cache.ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert trace_cache.directory() == tmp_path / ".cache" / "pddsim" / "traces"


def test_keys_do_not_collide_on_how_bytes_are_split():
    assert trace_cache.key(b"ab", b"c") != trace_cache.key(b"a", b"bc")


def test_a_document_that_could_nest_too_deep_for_orjson_reads_the_same(tmp_path, cache, monkeypatch):
    path = write_conversation(tmp_path / "c.json", conversation())
    fresh = uncached(path, monkeypatch)
    monkeypatch.setattr(readers, "ORJSON_MAX_BRACKETS", 0)
    monkeypatch.setattr(orjson, "loads", lambda text: pytest.fail("orjson decoded it"))
    assert same(uncached(path, monkeypatch), fresh)


def real_agent_files():
    folder = TRACES / "kv_cache_tester"
    if not folder.exists():
        pytest.skip(f"{folder} is absent")
    return sorted(folder.glob("*.json.xz"))


def test_orjson_decodes_the_agent_traces_as_the_standard_library():
    files = real_agent_files()
    for file in files[:5] + files[-5:]:
        raw = lzma.decompress(file.read_bytes())
        assert repr(orjson.loads(raw)) == repr(json.loads(raw)), file      # 1 and 1.0 differ too


def test_a_real_trace_reads_the_same_cached(cache, monkeypatch):
    folder = real_agent_files()[0].parent
    fresh = uncached(folder, monkeypatch, limit=3_000)
    assert same(read_workload(folder, limit=3_000), fresh)
    assert same(read_workload(folder, limit=3_000), fresh)
