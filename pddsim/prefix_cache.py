"""Prefix cache over prefix-chained block hashes (the radix cache of SGLang, flattened).

Because `hash_ids[i]` names the whole prefix up to block i, the set of resident blocks is kept
prefix-closed (only leaves are evicted), which makes a lookup a binary search over the chain.
Recency is refreshed leaf-first so a parent is never older than its children: the LRU front is
therefore always an evictable leaf. Pinned blocks (in use by a running request) leave the LRU list
until unpinned, so eviction never touches them and never scans.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class PrefixCache:
    """Resident prefix blocks of one instance, bounded by `capacity_tokens` (None: unbounded)."""

    __slots__ = ("capacity_tokens", "used_tokens", "_pins", "_lru", "_block_tokens", "evicted_tokens")

    def __init__(self, capacity_tokens: int | None):
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self.evicted_tokens = 0
        self._pins: dict[int, int] = {}                  # resident block -> pin count
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned resident blocks, oldest first
        self._block_tokens: dict[int, int] = {}          # resident block -> its size in tokens

    def __contains__(self, block: int) -> bool:
        return block in self._pins

    def match(self, hash_ids: Sequence[int]) -> int:
        """Number of leading blocks of the chain that are resident (no side effects)."""
        pins = self._pins
        lo, hi = 0, len(hash_ids)
        while lo < hi:                          # first non-resident index
            mid = (lo + hi) // 2
            if hash_ids[mid] in pins:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def pin(self, hash_ids: Sequence[int], n_blocks: int) -> None:
        """Mark the first `n_blocks` (resident) blocks as in use: they cannot be evicted."""
        pins, lru = self._pins, self._lru
        for block in hash_ids[:n_blocks]:
            if pins[block] == 0:
                del lru[block]
            pins[block] += 1

    def unpin(self, hash_ids: Sequence[int], n_blocks: int) -> None:
        """Release blocks pinned by `pin`; they become evictable, parents more recent than leaves."""
        pins, lru = self._pins, self._lru
        for i in range(n_blocks - 1, -1, -1):
            block = hash_ids[i]
            count = pins[block] - 1
            pins[block] = count
            if count == 0:
                lru[block] = None
            # a block pinned by another request is simply left out of the LRU list

    def touch(self, hash_ids: Sequence[int], n_blocks: int) -> None:
        """Refresh the recency of resident leading blocks, leaf first."""
        lru = self._lru
        for i in range(n_blocks - 1, -1, -1):
            block = hash_ids[i]
            if block in lru:
                lru.move_to_end(block)

    def insert(self, hash_ids: Sequence[int], block_tokens: int) -> int:
        """Make the chain resident (evicting LRU leaves as needed); returns blocks now resident.

        When the capacity cannot hold the whole chain, the longest prefix that fits is kept.
        """
        have = self.match(hash_ids)
        self.pin(hash_ids, have)                # the resident prefix must survive the evictions
        cap = self.capacity_tokens
        pins, lru, sizes = self._pins, self._lru, self._block_tokens
        n = have
        for block in hash_ids[have:]:
            if cap is not None:
                while self.used_tokens + block_tokens > cap and lru:
                    victim, _ = lru.popitem(last=False)
                    del pins[victim]
                    freed = sizes.pop(victim)
                    self.used_tokens -= freed
                    self.evicted_tokens += freed
                if self.used_tokens + block_tokens > cap:
                    break
            pins[block] = 0
            sizes[block] = block_tokens
            self.used_tokens += block_tokens
            n += 1
        for i in range(n - 1, have - 1, -1):    # new blocks enter leaf first ...
            lru[hash_ids[i]] = None
        self.unpin(hash_ids, have)              # ... then their resident prefix, fresher still
        return n
