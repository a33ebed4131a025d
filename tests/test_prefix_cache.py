from hypothesis import example, given, settings
from hypothesis import strategies as st

from pddsim.engine.prefix_cache import PrefixCache


def test_match_is_longest_resident_prefix():
    c = PrefixCache(None)
    c.insert([1, 2, 3], 16)
    assert c.match([1, 2, 3, 4]) == 3
    assert c.match([1, 2, 9]) == 2
    assert c.match([7]) == 0
    assert c.used_tokens == 48


def test_lru_evicts_leaves_of_the_oldest_chain_first():
    c = PrefixCache(capacity_tokens=5 * 10)
    c.insert([1, 2, 3], 10)        # chain A
    c.insert([1, 4], 10)           # chain B shares block 1
    removed = []
    c.on_removed = removed.extend
    c.insert([5, 6], 10)           # needs one more block: evicts A's leaf 3
    assert removed == [3]
    assert 3 not in c.blocks() and 2 in c.blocks() and 1 in c.blocks()
    assert c.match([1, 2, 3]) == 2
    assert c.used_tokens == 50


def test_pinned_blocks_are_never_evicted():
    c = PrefixCache(capacity_tokens=30)
    c.insert([1, 2, 3], 10)
    c.pin([1, 2, 3], 3)
    assert c.insert([7, 8], 10) == 0       # nothing evictable: nothing inserted
    c.unpin([1, 2, 3], 3)
    assert c.insert([7, 8], 10) == 2
    assert c.match([1, 2, 3]) == 1        # leaves 3 then 2 went first
    assert c.used_tokens == 30


def test_insert_keeps_the_longest_prefix_that_fits():
    c = PrefixCache(capacity_tokens=20)
    assert c.insert([1, 2, 3, 4], 10) == 2
    assert c.match([1, 2, 3, 4]) == 2


def test_insert_never_evicts_its_own_prefix():
    c = PrefixCache(capacity_tokens=30)
    c.insert([1, 2], 10)
    c.insert([9], 10)
    assert c.insert([1, 2, 3, 4], 10) == 3   # evicts 9, never 1 or 2
    assert 9 not in c.blocks() and c.match([1, 2, 3, 4]) == 3


def test_a_growing_session_context_stays_one_node():
    """Each turn re-sends the context plus new blocks, pinned while it runs: the turns' nodes
    merge back once evictable, so the work per turn does not grow with the turns."""
    c, chain = PrefixCache(capacity_tokens=None), []
    for turn in range(50):
        chain += range(turn * 10, turn * 10 + 10)
        have = c.match(chain)
        c.pin(chain, have)
        c.pin(chain[have:], c.insert(chain, 16) - have)
        c.unpin(chain, len(chain))
        assert len(c._heads) == 1 and c.match(chain) == len(chain)


class ReferenceCache:
    """The semantics of `PrefixCache` at block level, written for clarity instead of speed.

    `order` lists the unpinned resident blocks, least recently used first. An insert shields the
    resident prefix of its chain from eviction, admits new blocks one by one while they fit, then
    refreshes the chain leaf first: new blocks, then the unpinned blocks of the prefix.
    """

    def __init__(self, capacity_tokens):
        self.capacity_tokens = capacity_tokens
        self.size, self.pins, self.order = {}, {}, []
        self.used_tokens = 0

    @property
    def pinned_tokens(self):
        return sum(self.size[b] for b, n in self.pins.items() if n)

    def match(self, chain):
        n = 0
        while n < len(chain) and chain[n] in self.size:
            n += 1
        return n

    def pin(self, chain, n):
        for block in chain[:n]:
            if self.pins[block] == 0:
                self.order.remove(block)
            self.pins[block] += 1

    def unpin(self, chain, n):
        for block in reversed(chain[:n]):
            self.pins[block] -= 1
            if self.pins[block] == 0:
                self.order.append(block)

    def touch(self, chain, n):
        for block in reversed(chain[:n]):
            if self.pins.get(block) == 0:
                self.order.remove(block)
                self.order.append(block)

    def _drop(self, block):
        self.order.remove(block)
        del self.pins[block]
        freed = self.size.pop(block)
        self.used_tokens -= freed
        return freed

    def evict(self, tokens):
        freed = 0
        while freed < tokens and self.order:
            freed += self._drop(self.order[0])
        return freed

    def insert(self, chain, tokens, limit=None):
        cap = self.capacity_tokens if limit is None else min(limit, self.capacity_tokens or limit)
        have = self.match(chain)
        added = []
        for block in chain[have:]:
            while cap is not None and self.used_tokens + tokens > cap:
                victims = [b for b in self.order if b not in chain[:have]]
                if not victims:
                    break
                self._drop(victims[0])
            if cap is not None and self.used_tokens + tokens > cap:
                break
            self.size[block], self.pins[block] = tokens, 0
            self.used_tokens += tokens
            added.append(block)
        self.order += reversed(added)
        self.touch(chain, have)
        return have + len(added)


@st.composite
def chain_trees(draw):
    """Prefix chains of a random tree: each forks a random prefix of an earlier one."""
    chains, next_block = [[]], 0
    for _ in range(draw(st.integers(1, 12))):
        base = chains[draw(st.integers(0, len(chains) - 1))]
        chain = base[:draw(st.integers(0, len(base)))]
        grow = draw(st.integers(0 if chain else 1, 8))
        chains.append(chain + list(range(next_block, next_block + grow)))
        next_block += grow
    return chains[1:]


OPS = ("insert", "insert_limited", "pin", "extend_pin", "unpin", "evict", "drain", "crash")
operations = st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 99), st.integers(0, 99)),
                      max_size=60)


def run_against_reference(capacity, chains, ops):
    """Apply `ops` to both caches, as the engine does (pins are chain prefixes, extended by the
    rest of the chain), and compare everything observable after each: match on every chain, the
    resident blocks, the token counts, and the blocks the hooks announced."""
    fast, ref = PrefixCache(capacity), ReferenceCache(capacity)
    announced = set()
    fast.on_added = lambda blocks: announced.update(blocks)
    fast.on_removed = lambda blocks: announced.difference_update(blocks)
    pinned = []                                  # [chain, n] pinned by "running requests"
    for step, (op, a, b) in enumerate(ops):
        chain = chains[a % len(chains)]
        have = ref.match(chain)
        if op in ("insert", "insert_limited"):
            tokens = (1, 2, 3, 8)[b % 4]
            limit = ref.used_tokens + b % 20 if op == "insert_limited" else None
            assert fast.insert(chain, tokens, limit) == ref.insert(chain, tokens, limit), step
        elif op == "pin" and have:
            n = 1 + b % have
            fast.pin(chain, n), ref.pin(chain, n)
            pinned.append([chain, n])
        elif op == "extend_pin" and pinned:
            entry = pinned[b % len(pinned)]
            chain, n = entry
            more = ref.match(chain) - n
            if more > 0:
                to = n + 1 + a % more
                fast.pin(chain[n:to], to - n), ref.pin(chain[n:to], to - n)
                entry[1] = to
        elif op == "unpin" and pinned:
            chain, n = pinned.pop(b % len(pinned))
            fast.unpin(chain, n), ref.unpin(chain, n)
        elif op == "evict":
            assert fast.evict(b % 30) == ref.evict(b % 30), step
        elif op == "crash":                                 # the instance loses its memory
            fast.clear()
            pinned[:] = []
            ref.__init__(capacity)
        elif op == "drain":                                 # the requests end, the cache empties
            for chain, n in pinned:
                fast.unpin(chain, n), ref.unpin(chain, n)
            pinned.clear()
            assert fast.evict(fast.used_tokens) == ref.evict(ref.used_tokens), step
            assert fast.used_tokens == 0, step
        assert [fast.match(c) for c in chains] == [ref.match(c) for c in chains], step
        assert sorted(fast.blocks()) == sorted(ref.size) and set(ref.size) == announced, step
        assert (fast.used_tokens, fast.pinned_tokens) == (ref.used_tokens, ref.pinned_tokens), step


@settings(max_examples=300, deadline=None)
@example(capacity=1, chains=[[0]], ops=[("insert", 0, 1)])    # a chain trimmed whole was announced
@given(capacity=st.one_of(st.none(), st.integers(1, 80)), chains=chain_trees(), ops=operations)
def test_matches_the_reference_under_random_operations(capacity, chains, ops):
    run_against_reference(capacity, chains, ops)
