from pddsim.prefix_cache import PrefixCache


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
