"""A `Chain` (runs of consecutive block ids) reads exactly as the tuple of its ids, and the prefix
cache treats the two alike."""
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from pddsim.engine.chain import Chain, id_at
from pddsim.engine.prefix_cache import PrefixCache

# a chain grown turn by turn: keep a prefix of the last one (or of the first), add fresh ids
steps = st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(0, 12)), max_size=12)


def grown(first: int, steps_) -> list[tuple[Chain, tuple[int, ...]]]:
    """The chains of a session, each beside the tuple the same steps build."""
    chain, ids, next_id = Chain.run(0, first), tuple(range(first)), 1000
    out = [(chain, ids)]
    for restart, keep, count in steps_:
        if restart:
            chain, ids = out[0]
        keep = min(keep, len(ids))
        chain = chain.extended(keep, next_id, count)
        ids = ids[:keep] + tuple(range(next_id, next_id + count))
        next_id += count + (keep % 3)          # sometimes contiguous with the kept run, sometimes not
        out.append((chain, ids))
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20), steps, st.data())
def test_a_chain_reads_as_the_tuple_of_its_ids(first, steps_, data):
    for chain, ids in grown(first, steps_):
        assert len(chain) == len(ids) and bool(chain) == bool(ids)
        assert tuple(chain) == ids == chain.ids() and list(iter(chain)) == list(ids)
        assert chain == ids and ids == chain and not chain != ids
        assert hash(chain) == hash(ids) and repr(chain) == repr(ids)
        for i in range(-len(ids), len(ids)):
            assert chain[i] == ids[i]
        # in any order too (a chain remembers the run it read last), and through `id_at`
        order = data.draw(st.permutations(range(len(ids))))
        assert [chain[i] for i in order] == [ids[i] for i in order]
        assert [id_at(c, i) for c in (chain, ids, list(ids)) for i in order] == \
            [ids[i] for i in order] * 3
        for i in (len(ids), -len(ids) - 1):
            try:
                chain[i]
                raise AssertionError("an index past the end must fail")
            except IndexError:
                pass
        lo = data.draw(st.integers(-3, len(ids) + 3))
        hi = data.draw(st.integers(-3, len(ids) + 3))
        step = data.draw(st.sampled_from([None, 1, 2, 3, -1]))
        assert chain[lo:hi:step] == ids[lo:hi:step] and isinstance(chain[lo:hi:step], tuple)
        assert pickle.loads(pickle.dumps(chain)) == chain


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), steps, st.integers(5, 60))
def test_the_prefix_cache_treats_a_chain_as_its_tuple(first, steps_, capacity_blocks):
    chains = grown(first, steps_)
    as_chains, as_tuples = PrefixCache(capacity_blocks * 16), PrefixCache(capacity_blocks * 16)
    for chain, ids in chains:
        have = as_chains.match(chain)
        assert have == as_tuples.match(ids)
        half = have // 2                       # a pin in two steps, the second from where it ended
        as_chains.pin(chain, half), as_tuples.pin(ids, half)
        as_chains.pin(chain, have, half), as_tuples.pin(ids[half:], have - half)
        assert as_chains.pinned_tokens == as_tuples.pinned_tokens
        as_chains.unpin(chain, have), as_tuples.unpin(ids, have)
        assert as_chains.insert(chain, 16) == as_tuples.insert(ids, 16)
        assert as_chains.used_tokens == as_tuples.used_tokens
        assert sorted(as_chains.blocks()) == sorted(as_tuples.blocks())


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 20), steps, st.data())
def test_two_chains_part_where_their_ids_first_differ(first, steps_, data):
    chains = grown(first, steps_)
    (a, a_ids), (b, b_ids) = data.draw(st.sampled_from(chains)), data.draw(st.sampled_from(chains))
    shift = data.draw(st.integers(0, len(b_ids)))
    lo = data.draw(st.integers(0, max(0, min(len(a_ids), len(b_ids) - shift))))
    hi = data.draw(st.integers(lo, max(lo, min(len(a_ids), len(b_ids) - shift))))
    # the reference: the first difference in lo .. hi - 1 (chains part once and for all)
    expected = next((p for p in range(lo, hi) if a_ids[p] != b_ids[p + shift]), hi)
    if all(a_ids[p] == b_ids[p + shift] for p in range(lo)):
        assert a.agrees_until(b, shift, lo, hi) == expected
