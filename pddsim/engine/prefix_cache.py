"""Prefix cache over prefix-chained block hashes (the radix cache of SGLang, flattened).

Because `hash_ids[i]` names the whole prefix up to block i, the set of resident blocks is kept
prefix-closed (only leaves are evicted), which makes a lookup a binary search over the chain.
Recency is refreshed leaf-first so a parent is never older than its children: the LRU front is
therefore always an evictable leaf. Pinned blocks (in use by a running request) leave the LRU list
until unpinned, so eviction never touches them and never scans.

The cache is memory: `pinned_tokens` are shared with the requests using them (their owner counts
them), `evictable_tokens` are held by the cache alone, and `evict` gives them back on demand.

Agent traces re-send contexts of thousands of blocks every turn, so `insert` is the hot path of
`trace stats`: it costs one recency pass over the resident prefix (in C where possible) plus work
per new or evicted block only.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Sequence


class PrefixCache:
    """Resident prefix blocks of one instance, bounded by `capacity_tokens` (None: unbounded)."""

    __slots__ = ("capacity_tokens", "used_tokens", "pinned_tokens", "_pins", "_lru", "_block_tokens",
                 "evicted_tokens")

    def __init__(self, capacity_tokens: int | None):
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self.pinned_tokens = 0                           # resident tokens pinned at least once
        self.evicted_tokens = 0
        self._pins: dict[int, int] = {}                  # resident block -> pin count
        self._lru: OrderedDict[int, None] = OrderedDict()  # unpinned resident blocks, oldest first
        self._block_tokens: dict[int, int] = {}          # resident block -> its size in tokens

    @property
    def evictable_tokens(self) -> int:
        return self.used_tokens - self.pinned_tokens

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
        pins, lru, sizes = self._pins, self._lru, self._block_tokens
        for block in hash_ids[:n_blocks]:
            if pins[block] == 0:
                del lru[block]
                self.pinned_tokens += sizes[block]
            pins[block] += 1

    def unpin(self, hash_ids: Sequence[int], n_blocks: int) -> None:
        """Release blocks pinned by `pin`; they become evictable, parents more recent than leaves."""
        pins, lru, sizes = self._pins, self._lru, self._block_tokens
        for block in reversed(hash_ids[:n_blocks]):
            count = pins[block] - 1
            pins[block] = count
            if count == 0:
                lru[block] = None
                self.pinned_tokens -= sizes[block]
            # a block pinned by another request is simply left out of the LRU list

    def touch(self, hash_ids: Sequence[int], n_blocks: int) -> None:
        """Refresh the recency of resident leading blocks, leaf first."""
        move = self._lru.move_to_end
        blocks = reversed(hash_ids[:n_blocks])
        try:
            # Usually every block is in the LRU list: `map` moves them all without a Python-level
            # loop or membership test (this is most of the time `trace stats` spends on a cache).
            deque(map(move, blocks), maxlen=0)
        except KeyError:
            # A pinned (or absent) block: the checked loop resumes after it, `blocks` being shared.
            # Pins cover whole chain prefixes, so the blocks left are typically all pinned too.
            lru = self._lru
            for block in blocks:
                if block in lru:
                    move(block)

    def insert(self, hash_ids: Sequence[int], block_tokens: int, limit: int | None = None) -> int:
        """Make the chain resident (evicting LRU leaves as needed); returns blocks now resident.

        When the capacity (or `limit`, the room the memory tier leaves now, if lower) cannot hold
        the whole chain, the longest prefix that fits is kept. A `limit` must leave room for
        what is resident already (no smaller than `used_tokens`).
        """
        have = self.match(hash_ids)
        new = hash_ids[have:]
        # The whole chain is admitted first, then trimmed back to capacity: that saves pinning and
        # unpinning the resident prefix (two passes over thousands of blocks) to shield it from
        # the evictions. New blocks enter leaf first, then the resident prefix, fresher still.
        pins, sizes, lru = self._pins, self._block_tokens, self._lru
        for block in reversed(new):
            pins[block] = 0
            sizes[block] = block_tokens
            lru[block] = None
        self.used_tokens += len(new) * block_tokens
        self.touch(hash_ids, have)
        cap = self.capacity_tokens
        if limit is not None and (cap is None or limit < cap):
            cap = limit
        if cap is None or self.used_tokens <= cap:
            return len(hash_ids)
        return self._trim(hash_ids, cap)

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` by dropping least recently used unpinned blocks (or all of them
        if that is not enough); returns the tokens freed."""
        pins, sizes, lru = self._pins, self._block_tokens, self._lru
        freed = 0
        while freed < tokens and lru:
            victim, _ = lru.popitem(last=False)
            del pins[victim]
            freed += sizes.pop(victim)
        self.used_tokens -= freed
        self.evicted_tokens += freed
        return freed

    def _trim(self, hash_ids: Sequence[int], cap: int) -> int:
        """Pop the LRU front until `cap` holds; returns how many blocks of `hash_ids` stay resident.

        The LRU list reads: older blocks, the new blocks of `hash_ids` (deepest first), then its
        resident prefix. Older blocks are evicted first, in the order they would have been had
        the prefix been pinned. Once the deepest new block comes up, nothing older is left, so
        popping on takes back new blocks deepest first: the longest prefix that fits is kept. The
        resident prefix is never reached: the cache held it within capacity before the insert.
        """
        pins, sizes, popitem = self._pins, self._block_tokens, self._lru.popitem
        deepest, resident = hash_ids[-1], len(hash_ids)
        used, evicted = self.used_tokens, 0
        while used > cap:
            victim, _ = popitem(last=False)
            del pins[victim]
            freed = sizes.pop(victim)
            used -= freed
            if resident < len(hash_ids) or victim == deepest:
                resident -= 1                   # never resident as far as callers know
            else:
                evicted += freed
        self.used_tokens = used
        self.evicted_tokens += evicted
        return resident
