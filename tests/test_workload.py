import json
import lzma
import pickle
from dataclasses import replace
from pathlib import Path

import pytest

from pddsim.config import AgentSpec
from pddsim.engine.chain import Chain
from pddsim.errors import InputError
from pddsim.workload.model import FlatIds, TraceRequest, TraceTable, Workload
from pddsim.workload.readers import read_workload, write_mooncake, write_native
from pddsim.workload.synthetic import agent_workload, poisson_workload

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def write_lines(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ---- the requests as columns ----------------------------------------------------------------------------

def test_a_table_reads_back_the_requests_it_was_given():
    rows = [TraceRequest(0.5, 600, 7, (0, 1), 512),
            TraceRequest(1.25, 100, 1, Chain.run(3, 2), 64, session_id=2, think_s=0.5, follows=0)]
    table = TraceTable.of(rows)
    assert table == rows and list(table) == rows and len(table) == 2
    assert table[-1] == rows[-1] and table[1:] == rows[1:] and table != rows[:1]
    assert table.column("follows").tolist() == [-1, 0] and table.column("think_s").tolist() == [0.0, 0.5]
    with pytest.raises(ValueError):                     # a column is read, never written through
        table.column("arrival_s")[0] = 9.0
    back = pickle.loads(pickle.dumps(Workload(table)))  # as a plan sends it to its workers
    assert back.requests == rows and Workload(rows).requests == table
    assert TraceTable.of([]) == [] and not Workload([]).requests


def test_generated_requests_are_held_as_numbers_not_objects():
    """A million generated requests held ~280 MB as objects; as columns a request holds its
    numbers and its chain's ids, 8 bytes each, and reads back the same."""
    w = poisson_workload(5000, 5.0, 1000, 150, shared_prefix_tokens=512, seed=1)
    table = w.requests
    ids = table.hash_ids
    assert isinstance(ids, FlatIds)
    numbers = ("arrival_s", "input_tokens", "output_tokens", "block_tokens", "session_id",
               "think_s", "follows")
    held = sum(len(getattr(table, c)) * 8 for c in numbers) + 8 * (len(ids.ids) + len(ids.offsets))
    blocks = sum(len(r.hash_ids) for r in table)
    assert held == 8 * (7 * len(w) + blocks + len(w) + 1)
    assert held / len(w) < 100
    assert ids[-1] == ids[len(w) - 1] and ids[1:3] == [ids[1], ids[2]]


# ---- Mooncake ------------------------------------------------------------------------------------------

def test_mooncake_maps_fields_and_sorts_backward_timestamps(tmp_path):
    p = write_lines(tmp_path / "m.jsonl", [
        {"timestamp": 1500, "input_length": 600, "output_length": 7, "hash_ids": [0, 1]},
        "",
        {"timestamp": 250, "input_length": 512, "output_length": 3, "hash_ids": [0]},
        {"timestamp": 1500, "input_length": 100, "output_length": 1, "hash_ids": [5]},
    ])
    w = read_workload(p)
    assert w.requests == [
        TraceRequest(0.25, 512, 3, (0,), 512),
        TraceRequest(1.5, 600, 7, (0, 1), 512),
        TraceRequest(1.5, 100, 1, (5,), 512),
    ]
    assert w.source == str(p) and w.sessions == 0 and w.extra["repairs"] == {}


@pytest.mark.parametrize("line, what", [
    ('{"timestamp": 1, "input_length": 5', "bad JSON"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1}', "'hash_ids'"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": [1], "x": 2}', "unknown field 'x'"),
    ('{"timestamp": -1, "input_length": 5, "output_length": 1, "hash_ids": [1]}', "'timestamp'"),
    ('{"timestamp": 1, "input_length": 5.5, "output_length": 1, "hash_ids": [1]}', "'input_length'"),
    ('{"timestamp": 1, "input_length": 5, "output_length": 1, "hash_ids": ["a"]}', "'hash_ids'"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 1, "hash_ids": []}', "input of 0 tokens"),
    ('{"timestamp": 1, "input_length": 2000, "output_length": 1, "hash_ids": [1]}', "1 hash ids"),
    ('[1, 2]', "expected a JSON object"),
])
def test_malformed_line_names_file_and_line(tmp_path, line, what):
    good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}'
    p = write_lines(tmp_path / "m.jsonl", [good, line])
    with pytest.raises(InputError) as e:
        read_workload(p, "mooncake")
    assert f"{p}:2: " in str(e.value) and what in str(e.value)


# ---- Azure ---------------------------------------------------------------------------------------------

def test_azure_arrivals_are_seconds_since_first_row(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "2023-11-16 18:16:47.1805900,396,109\n"
                 "2023-11-16 18:15:46.7805900,10,0\n")
    w = read_workload(p)
    assert [r.arrival_s for r in w.requests] == pytest.approx([0.0, 0.1, 60.5])
    assert [(r.input_tokens, r.output_tokens, r.hash_ids) for r in w.requests] == [(374, 44, ()), (10, 1, ()),
                                                                                 (396, 109, ())]
    assert w.extra["repairs"] == {"output 0 -> 1 token": 1}


@pytest.mark.parametrize("row, what", [
    ("yesterday,5,5", "bad TIMESTAMP"),
    ("2023-11-16 18:15:46.68x,5,5", "bad TIMESTAMP"),
    ("2023-11-16 18:15:46.6,-5,5", "'ContextTokens'"),
    ("2023-11-16 18:15:46.6,5,many", "'GeneratedTokens'"),
    ("2023-11-16 18:15:46.6,5", "missing 'GeneratedTokens'"),
])
def test_azure_bad_row(tmp_path, row, what):
    p = tmp_path / "a.csv"
    p.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,1,1\n{row}\n")
    with pytest.raises(InputError, match=what) as e:
        read_workload(p)
    assert f"{p}:3: " in str(e.value)


# ---- native --------------------------------------------------------------------------------------------

def test_native_round_trip_and_defaults_omitted(tmp_path):
    w = Workload([
        TraceRequest(0.0, 100, 5),
        TraceRequest(0.125, 130, 9, (7, 8, 9), 64, session_id=3),
        TraceRequest(2.0, 1, 1, (), 16, session_id=4),
        TraceRequest(3.0, 140, 2, (7, 8, 9), 64, session_id=3, think_s=1.5, follows=1),
    ], sessions=2)
    p = write_native(w, tmp_path / "n.jsonl")
    assert p.read_text().splitlines()[0] == '{"arrival_s":0.0,"input_tokens":100,"output_tokens":5}'
    back = read_workload(p)
    assert back.requests == w.requests and back.sessions == 2


def test_a_generated_agent_workload_writes_the_files_of_its_ids(tmp_path):
    """The Agent generator's chains are runs of ids (engine/chain.py): its files are those of the
    same requests with tuples of the ids, and read back equal."""
    w = agent_workload(AgentSpec(sessions=3, turns_mean=3, context_mean=2000, append_mean=300,
                                 block_tokens=64), seed=1)
    as_tuples = Workload([replace(r, hash_ids=tuple(r.hash_ids)) for r in w.requests], sessions=3)
    for write in (write_native, write_mooncake):
        text = write(w, tmp_path / "w.jsonl").read_text()
        assert text == write(as_tuples, tmp_path / "t.jsonl").read_text()
    assert read_workload(write_native(w, tmp_path / "n.jsonl")).requests == w.requests


def test_mooncake_export_is_open_loop_in_512_token_blocks(tmp_path):
    w = Workload([TraceRequest(0.0, 600, 5, (1, 2), session_id=0),
                  TraceRequest(1.2344, 700, 9, (1, 2), session_id=0, think_s=1.0, follows=0),
                  TraceRequest(2.0, 600, 1, tuple(range(10, 20)), 64),     # 64-token blocks: ids 17, 19
                  TraceRequest(3.0, 600, 1, tuple(range(30, 39)), 64)])    # unhashed tail: 37 only
    back = read_workload(write_mooncake(w, tmp_path / "m.jsonl"))
    assert back.requests == [TraceRequest(0.0, 600, 5, (1, 2)), TraceRequest(1.234, 700, 9, (1, 2)),
                             TraceRequest(2.0, 600, 1, (17, 19)), TraceRequest(3.0, 600, 1, (37,))]
    with pytest.raises(InputError, match="request 0"):
        write_mooncake(Workload([TraceRequest(0.0, 100, 1, (1,), 100)]), tmp_path / "x.jsonl")


def test_native_without_sessions_is_sorted_by_arrival(tmp_path):
    p = write_lines(tmp_path / "n.jsonl", [{"arrival_s": 3, "input_tokens": 4, "output_tokens": 1},
                                          {"arrival_s": 1, "input_tokens": 5, "output_tokens": 1}])
    assert [r.input_tokens for r in read_workload(p).requests] == [5, 4]


@pytest.mark.parametrize("row, what", [
    ({"arrival_s": 0, "input_tokens": 4, "output_tokens": 1, "prompt": "hi"}, "unknown field 'prompt'"),
    ({"arrival_s": 0, "input_tokens": 4}, "missing 'output_tokens'"),
    ({"arrival_s": 0, "input_tokens": 4, "output_tokens": 1, "follows": 1}, "earlier request"),
    ({"arrival_s": 0, "input_tokens": 4, "output_tokens": 1, "session_id": -2}, "'session_id'"),
    ({"arrival_s": 0, "input_tokens": 4, "output_tokens": 1, "think_s": "soon"}, "'think_s'"),
])
def test_native_rejects_bad_lines(tmp_path, row, what):
    p = write_lines(tmp_path / "n.jsonl", [{"arrival_s": 0, "input_tokens": 4, "output_tokens": 1}, row])
    with pytest.raises(InputError, match=what) as e:
        read_workload(p, "native")
    assert f"{p}:2: " in str(e.value)


def test_limit_and_max_tokens(tmp_path):
    p = write_lines(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 3000, "output_length": 2000, "hash_ids": [1, 2, 3, 4, 5, 6]},
        {"timestamp": 1, "input_length": 100, "output_length": 5000, "hash_ids": [7]},
        {"timestamp": 2, "input_length": 5000, "output_length": 10, "hash_ids": list(range(10, 20))},
        {"timestamp": 3, "input_length": 10, "output_length": 10, "hash_ids": [30]},
    ])
    w = read_workload(p, limit=3, max_tokens=4096)
    assert [(r.input_tokens, r.output_tokens, len(r.hash_ids)) for r in w.requests] == [
        (2096, 2000, 5), (1, 4095, 1), (4086, 10, 8)]
    assert read_workload(p, max_tokens=4096).requests[3] == read_workload(p).requests[3]


def test_format_detection_and_bad_arguments(tmp_path):
    p = write_lines(tmp_path / "trace.txt", [{"arrival_s": 0}])
    with pytest.raises(InputError, match="trace.txt"):
        read_workload(p)
    q = write_lines(tmp_path / "odd.jsonl", [{"when": 0}])
    with pytest.raises(InputError, match="odd.jsonl"):
        read_workload(q)
    with pytest.raises(InputError, match="no requests"):
        read_workload(write_lines(tmp_path / "empty.jsonl", ["", ""]), "mooncake")
    with pytest.raises(InputError, match="no such file"):
        read_workload(tmp_path / "missing.jsonl")
    with pytest.raises(InputError, match="unknown trace format"):
        read_workload(q, "sharegpt")
    with pytest.raises(InputError, match="shared_prefix"):
        read_workload(q, "mooncake", shared_prefix=True)


# ---- agent sessions ------------------------------------------------------------------------------------

def conversation():
    """Main chain r0, r2, r4; a completed sub-agent (t = its end); an async one holding a nested sub-agent."""
    return {"id": "c", "block_size": 4, "system_tokens": 5, "tool_tokens": 3, "requests": [
        {"t": 0.0, "type": "n", "in": 10, "out": 2, "hash_ids": [1, 2], "api_time": 2.0, "think_time": 0.0},
        {"t": 5.0, "type": "subagent", "duration_ms": 2500, "subagent_type": "Explore", "system_tokens": 4,
         "tool_tokens": 0, "requests": [
             {"t": 0.0, "type": "n", "in": 8, "out": 1, "hash_ids": [10, 11], "api_time": 1.0,
              "think_time": 0.0},
             {"t": 1.5, "type": "n", "in": 12, "out": 1, "hash_ids": [10, 11, 12], "api_time": 0.5,
              "think_time": 0.5}]},
        {"t": 6.0, "type": "s", "in": 14, "out": 3, "hash_ids": [1, 2, 3], "api_time": 1.0,
         "think_time": 1.0},
        {"t": 6.5, "type": "subagent", "duration_ms": None, "status": "async_launched",
         "subagent_type": "Explore", "system_tokens": 4, "tool_tokens": 0, "requests": [
             {"t": 0.0, "type": "n", "in": 4, "out": 2, "hash_ids": [40]},
             {"t": 1.0, "type": "subagent", "duration_ms": 500, "system_tokens": 0, "tool_tokens": 0,
              "requests": [{"t": 0.0, "type": "n", "in": 5, "out": 1, "hash_ids": [50]}]}]},
        {"t": 9.0, "type": "s", "in": 20, "out": 1, "hash_ids": [1, 2, 3, 4, 5], "api_time": 0.1},
    ]}


def write_conversation(path: Path, doc) -> Path:
    text = json.dumps(doc).encode()
    path.write_bytes(lzma.compress(text) if path.suffix == ".xz" else text)
    return path


def test_agent_chains_subagents_and_think_times(tmp_path):
    w = read_workload(write_conversation(tmp_path / "c.json", conversation()))
    got = [(r.arrival_s, r.input_tokens, r.output_tokens, r.hash_ids, r.follows, r.think_s)
           for r in w.requests]
    assert got == [
        (0.0, 10, 2, (0, 1), -1, 0.0),           # r0
        (2.5, 8, 1, (5, 6), 0, 0.5),             # sub-agent start 5.0 - 2.5 s, 0.5 s after r0 ended
        (4.0, 12, 1, (5, 6, 7), 1, 0.5),
        (6.0, 14, 3, (0, 1, 2), 0, 1.0),         # r2: the main chain ignores its sub-agents
        (6.5, 4, 2, (8,), 3, 0.0),               # async sub-agent: t is its launch, r2 still running
        (7.0, 5, 1, (9,), 4, 0.5),               # nested sub-agent follows its parent's request
        (9.0, 20, 1, (0, 1, 2, 3, 4), 3, 0.0),   # r4: think_time absent
    ]
    assert {(r.block_tokens, r.session_id) for r in w.requests} == {(4, 0)}
    assert w.sessions == 1
    assert w.extra["repairs"] == {"think_time missing -> 0": 1, "api_time missing -> 0": 1}


def test_agent_ids_are_ranks_whatever_a_request_shares_with_the_one_it_follows(tmp_path):
    doc = conversation()
    doc["requests"][-1]["hash_ids"] = [1, 2, 9, 4, 5]     # r4 no longer extends r2's chain
    w = read_workload(write_conversation(tmp_path / "c.json", doc))
    assert [r.hash_ids for r in w.requests] == [(0, 1), (6, 7), (6, 7, 8), (0, 1, 2), (9,), (10,),
                                                (0, 1, 5, 3, 4)]


def test_agent_directory_sessions_ids_and_limit(tmp_path):
    write_conversation(tmp_path / "b.json", conversation())
    write_conversation(tmp_path / "a.json.xz", conversation())
    (tmp_path / "MANIFEST.tsv").write_text("not a trace\n")
    w = read_workload(tmp_path)
    assert w.sessions == 2 and len(w) == 14
    assert [r.session_id for r in w.requests] == [0] * 7 + [1] * 7
    assert [r.follows for r in w.requests[7:]] == [-1, 7, 8, 7, 10, 11, 10]
    first = {h for r in w.requests[:7] for h in r.hash_ids}
    assert first.isdisjoint(h for r in w.requests[7:] for h in r.hash_ids)
    assert len(read_workload(tmp_path, limit=3)) == 7
    assert len(read_workload(tmp_path, limit=8)) == 14


def test_agent_shared_prefix(tmp_path):
    write_conversation(tmp_path / "a.json", conversation())
    write_conversation(tmp_path / "b.json", conversation())
    w = read_workload(tmp_path, shared_prefix=True)
    a, b = w.requests[:7], w.requests[7:]
    main, explore = a[0].hash_ids[:2], a[1].hash_ids[:1]
    for conv in (a, b):
        assert [r.hash_ids[:2] for r in (conv[0], conv[3], conv[6])] == [main] * 3   # (5 + 3) // 4 blocks
        assert [r.hash_ids[:1] for r in (conv[1], conv[2], conv[4])] == [explore] * 3  # 4 // 4 blocks
    assert set(main).isdisjoint(explore)
    assert a[3].hash_ids[2] != b[3].hash_ids[2] and a[1].hash_ids[1] != b[1].hash_ids[1]
    assert a[5].hash_ids != b[5].hash_ids                  # no system or tool prompt: nothing shared


@pytest.mark.parametrize("edit, what", [
    (lambda d: d["requests"][2].update({"in": 0}), "request 2: input of 0 tokens"),
    (lambda d: d["requests"][2].update({"hash_ids": [1]}), "request 2: 1 hash ids for 14"),
    (lambda d: d["requests"][2].update({"t": -1.0}), "request 2: 't'"),
    (lambda d: d["requests"][4].update({"t": 5.5}), "request 4: 't' goes backwards"),
    (lambda d: d["requests"][1]["requests"][1].pop("out"), "request 1.1: missing 'out'"),
    (lambda d: d["requests"][3]["requests"][1]["requests"][0].update({"hash_ids": [True]}),
     "request 3.1.0: 'hash_ids'"),
    (lambda d: d["requests"][1].update({"duration_ms": 9000}), "request 1: sub-agent"),
    (lambda d: d.pop("block_size"), "missing 'block_size'"),
])
def test_agent_rejects_bad_requests(tmp_path, edit, what):
    doc = conversation()
    edit(doc)
    p = write_conversation(tmp_path / "c.json", doc)
    with pytest.raises(InputError, match=what):
        read_workload(p)


def test_agent_shared_prefix_needs_prompt_sizes(tmp_path):
    doc = conversation()
    del doc["tool_tokens"]
    with pytest.raises(InputError, match="missing 'tool_tokens'"):
        read_workload(write_conversation(tmp_path / "c.json", doc), shared_prefix=True)


# ---- real traces ---------------------------------------------------------------------------------------

def real(*parts) -> Path:
    path = TRACES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not available")
    return path


def test_real_mooncake_conversation():
    w = read_workload(real("mooncake", "conversation_trace.jsonl"))
    assert len(w) == 12_031 and w.sessions == 0
    assert w.requests[-1].arrival_s == 3536.999
    assert all(len(r.hash_ids) == -(-r.input_tokens // 512) for r in w.requests)


def test_real_azure():
    conv = read_workload(real("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv"))
    assert len(conv) == 19_366 and conv.requests[0].arrival_s == 0.0
    assert conv.requests[-1].arrival_s == pytest.approx(3501.721937)
    assert len(read_workload(real("azure_llm_2023", "AzureLLMInferenceTrace_code.csv"))) == 8_819


def test_real_agent_file_and_subagents():
    w = read_workload(real("kv_cache_tester", "trace_0001.json.xz"))
    assert w.sessions == 1 and len(w) == 41
    assert [r.follows for r in w.requests] == list(range(-1, 40))
    w = read_workload(real("kv_cache_tester", "trace_0010.json.xz"))
    first_sub = w.requests[1]              # launched by request 0 (t 0, api_time 8.81); returned at t 100.65
    assert first_sub.follows == 0 and first_sub.think_s < 1 and first_sub.arrival_s == pytest.approx(9.407)
    assert all(r.follows < i for i, r in enumerate(w.requests))


def test_real_agent_directory_prefix():
    w = read_workload(real("kv_cache_tester"), limit=2_000, shared_prefix=True)
    assert len(w) >= 2_000 and w.sessions == w.requests[-1].session_id + 1
    assert all(r.follows < i and (r.follows < 0 or w.requests[r.follows].session_id == r.session_id)
               for i, r in enumerate(w.requests))
    assert len({r.hash_ids[0] for r in w.requests if r.hash_ids}) < w.sessions   # one system prompt, mostly
