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
    c.insert([5, 6], 10)           # needs one more block: evicts A's leaf 3
    assert 3 not in c and 2 in c and 1 in c
    assert c.match([1, 2, 3]) == 2
    assert c.used_tokens == 50
    assert c.evicted_tokens == 10


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
    assert 9 not in c and c.match([1, 2, 3, 4]) == 3


class ReferenceCache:
    """The semantics of `PrefixCache`, written for clarity instead of speed.

    `order` lists the unpinned resident blocks, least recently used first. An insert shields the
    resident prefix of its chain from eviction, admits new blocks one by one while they fit, then
    refreshes the chain leaf first: new blocks, then the unpinned blocks of the prefix.
    """

    def __init__(self, capacity_tokens):
        self.capacity_tokens = capacity_tokens
        self.size, self.pins, self.order = {}, {}, []
        self.used_tokens = self.evicted_tokens = 0

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

    def _fits(self, tokens):
        return self.capacity_tokens is None or self.used_tokens + tokens <= self.capacity_tokens

    def insert(self, chain, tokens):
        have = self.match(chain)
        added = []
        for block in chain[have:]:
            while not self._fits(tokens):
                victims = [b for b in self.order if b not in chain[:have]]
                if not victims:
                    break
                self.order.remove(victims[0])
                del self.pins[victims[0]]
                freed = self.size.pop(victims[0])
                self.used_tokens -= freed
                self.evicted_tokens += freed
            if not self._fits(tokens):
                break
            self.size[block], self.pins[block] = tokens, 0
            self.used_tokens += tokens
            added.append(block)
        self.order += reversed(added)
        self.touch(chain, have)
        return have + len(added)


def random_chains(rng, n_chains):
    """Prefix chains of a random tree: each forks a random prefix of an earlier one."""
    chains, next_block = [[]], 0
    for _ in range(n_chains):
        base = rng.choice(chains)
        grow = rng.randint(0 if base else 1, 6)
        chain = base[:rng.randint(0, len(base))] + list(range(next_block, next_block + grow))
        next_block += grow
        chains.append(chain)
    return chains[1:]


def test_matches_the_reference_on_random_workloads():
    import random

    for seed in range(300):
        rng = random.Random(seed)
        chains = random_chains(rng, rng.randint(5, 40))
        blocks = {b for chain in chains for b in chain}
        capacity = None if seed % 10 == 0 else rng.randint(1, 80)
        fast, ref = PrefixCache(capacity), ReferenceCache(capacity)
        pinned = []                                  # (chain, n) pinned by "running requests"
        for step in range(150):
            chain, op = rng.choice(chains), rng.random()
            have = ref.match(chain)
            assert fast.match(chain) == have, (seed, step)
            if op < 0.5:
                tokens = rng.choice((1, 2, 3, 8))
                if capacity is None and rng.random() < 0.3:    # trace_stats: the missing suffix
                    chain = chain[have:]
                assert fast.insert(chain, tokens) == ref.insert(chain, tokens), (seed, step)
            elif op < 0.65 and have:
                n = rng.randint(1, have)
                fast.pin(chain, n), ref.pin(chain, n)
                pinned.append((chain, n))
            elif op < 0.8 and pinned:
                chain, n = pinned.pop(rng.randrange(len(pinned)))
                fast.unpin(chain, n), ref.unpin(chain, n)
            else:
                n = rng.choice((have, len(chain)))   # past the resident prefix too
                fast.touch(chain, n), ref.touch(chain, n)
            assert {b for b in blocks if b in fast} == set(ref.size), (seed, step)
            assert (fast.used_tokens, fast.evicted_tokens) == \
                (ref.used_tokens, ref.evicted_tokens), (seed, step)
