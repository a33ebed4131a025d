"""Prefix cache over prefix-chained block hashes: a radix tree of path-compressed nodes.

Because `hash_ids[i]` names the whole prefix up to block i, a block hash says where it sits in
the tree, and two chains that differ at a block differ at every block after it. A node holds a run
of consecutive blocks of one chain with one pin count, as a range of a chain that passes through
it (block i of every chain sits at index i): it is found from its first block alone, and a lookup
walks the nodes of the chain's path, one comparison per node (the node's last block) and a binary
search in the node where the chain leaves the tree. So looking up, inserting, pinning, unpinning,
refreshing and evicting a prefix cost a step per node on its path, not per block (Agent contexts
run to thousands of blocks, re-sent every turn); only the hooks below, when set, see blocks. A node
is split where an operation stops inside it, and merged back into its only child when both become
evictable together (an index change each), so an Agent session's context stays a node or two.

Eviction is least-recently-used at block granularity. Recency is refreshed leaf first, so a
block is never older than the blocks below it, and the blocks of a node sit together in the LRU
order, deepest first: the LRU list holds nodes, and its front node's deepest block is the least
recently used block, always a leaf. Eviction takes blocks off that end. Pinned nodes (in use by a
running request) leave the LRU list until unpinned, so eviction never touches them and never
scans. Pins cover whole chain prefixes, so a node's pin count is never below its children's.

The cache is memory: `pinned_tokens` are shared with the requests using them (their owner counts
them), `evictable_tokens` are held by the cache alone, and `evict` gives them back on demand.
`on_added` / `on_removed`, when set, hear every block the cache gains or loses (an index of
which cache holds which block keeps itself current through them).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Sequence

from pddsim.engine.chain import BlockIds, Chain, id_at, parting
from pddsim.intmath import ceil_div

BlocksHook = Callable[[Sequence[int]], None]


class _Node:
    """The resident blocks `chain[lo:hi]` of a chain through it (indices are depths), pinned
    `pins` times, below `parent` (None: the root), with `children` nodes below its last block."""

    __slots__ = ("chain", "lo", "hi", "block_tokens", "pins", "parent", "children")

    def __init__(self, chain: BlockIds, lo: int, hi: int, block_tokens: int, pins: int,
                 parent: _Node | None, children: int = 0):
        self.chain = chain
        self.lo = lo
        self.hi = hi
        self.block_tokens = block_tokens
        self.pins = pins
        self.parent = parent
        self.children = children

    def tokens(self) -> int:
        return (self.hi - self.lo) * self.block_tokens


class PrefixCache:
    """Resident prefix blocks of one instance, bounded by `capacity_tokens` (None: unbounded)."""

    __slots__ = ("capacity_tokens", "used_tokens", "pinned_tokens", "on_added", "on_removed",
                 "_heads", "_lru", "_root")

    def __init__(self, capacity_tokens: int | None):
        self.capacity_tokens = capacity_tokens
        self.used_tokens = 0
        self.pinned_tokens = 0                           # resident tokens pinned at least once
        self.on_added: BlocksHook | None = None          # called with blocks made resident
        self.on_removed: BlocksHook | None = None        # called with blocks evicted
        self._heads: dict[int, _Node] = {}               # first block of a node -> the node
        self._lru: OrderedDict[_Node, None] = OrderedDict()  # unpinned nodes, oldest first
        self._root = _Node((), 0, 0, 0, 0, None)         # parent of the nodes at depth 0

    @property
    def evictable_tokens(self) -> int:
        return self.used_tokens - self.pinned_tokens

    def blocks(self) -> list[int]:
        """Every resident block (a step per block: for the hooks' index and for checks)."""
        return [b for node in self._heads.values() for b in node.chain[node.lo:node.hi]]

    def match(self, hash_ids: BlockIds) -> int:
        """Number of leading blocks of the chain that are resident (no side effects)."""
        heads, depth, n = self._heads, 0, len(hash_ids)
        while depth < n:
            node = heads.get(id_at(hash_ids, depth))
            if node is None:
                return depth
            chain, shift = node.chain, node.lo - depth
            end = depth + node.hi - node.lo
            if end <= n and id_at(chain, node.hi - 1) == id_at(hash_ids, end - 1):
                depth = end                     # the whole node: on to its child
                continue
            # the chain leaves the tree in this node
            return parting(chain, shift, hash_ids, depth + 1, min(end, n))
        return depth

    def pin(self, hash_ids: BlockIds, n_blocks: int, start: int = 0) -> None:
        """Mark the (resident) blocks `start` .. `n_blocks` - 1 as in use: they cannot be evicted.

        `start` is 0 or where an earlier pin of the chain ended (a request extending its pin)."""
        lru = self._lru
        for node in self._path(hash_ids, n_blocks, start):
            if node.pins == 0:
                del lru[node]
                self.pinned_tokens += node.tokens()
            node.pins += 1

    def unpin(self, hash_ids: BlockIds, n_blocks: int) -> None:
        """Release blocks pinned by `pin`; they become evictable, parents more recent than leaves."""
        lru, below = self._lru, None
        for node in reversed(self._path(hash_ids, n_blocks)):
            node.pins -= 1
            if node.pins == 0:
                lru[node] = None
                self.pinned_tokens -= node.tokens()
                below = self._merge(node, below)
            else:       # pinned by another request: simply left out of the LRU list
                below = None

    def insert(self, hash_ids: BlockIds, block_tokens: int, limit: int | None = None) -> int:
        """Make the chain resident (evicting LRU leaves as needed); returns blocks now resident.

        When the capacity (or `limit`, the room the memory tier leaves now, if lower) cannot hold
        the whole chain, the longest prefix that fits is kept. A `limit` must leave room for
        what is resident already (no smaller than `used_tokens`).
        """
        have = self.match(hash_ids)
        path = self._path(hash_ids, have)
        # The new blocks are admitted first, then trimmed back to capacity: that saves pinning and
        # unpinning the resident prefix to shield it from the evictions. They enter as one node,
        # leaf first, then the resident prefix is refreshed, fresher still.
        new = None
        if have < len(hash_ids):
            parent = path[-1] if path else self._root
            parent.children += 1
            chain = hash_ids if isinstance(hash_ids, (tuple, Chain)) else tuple(hash_ids)
            new = _Node(chain, have, len(chain), block_tokens, 0, parent)
            path.append(new)
            self._heads[id_at(chain, have)] = new
            self._lru[new] = None
            self.used_tokens += new.tokens()
        self._refresh(path)
        cap = self.capacity_tokens
        if limit is not None and (cap is None or limit < cap):
            cap = limit
        resident = len(hash_ids)
        if cap is not None and self.used_tokens > cap:
            resident = self._trim(new, resident, cap)
        if resident > have and self.on_added is not None:
            self.on_added(hash_ids[have:resident])
        return resident

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` by dropping least recently used unpinned blocks (or all of them
        if that is not enough); returns the tokens freed."""
        lru = self._lru
        freed = 0
        while freed < tokens and lru:
            node = next(iter(lru))
            freed += self._drop(node, ceil_div(tokens - freed, node.block_tokens), True)
        self.used_tokens -= freed
        return freed

    def clear(self) -> None:
        """Forget every block, pinned or not (the instance lost its memory); `on_removed` hears
        them all."""
        if self._heads and self.on_removed is not None:
            self.on_removed(self.blocks())
        self.used_tokens = self.pinned_tokens = 0
        self._heads, self._lru = {}, OrderedDict()
        self._root = _Node((), 0, 0, 0, 0, None)

    # -- internals ----------------------------------------------------------------------------
    def _path(self, hash_ids: BlockIds, n_blocks: int, start: int = 0) -> list[_Node]:
        """The nodes holding the (resident) blocks `start` .. `n_blocks` - 1 (a node begins at
        `start`), root side first; the last one is split if the run ends inside it."""
        heads, path, depth = self._heads, [], start
        while depth < n_blocks:
            node = heads[id_at(hash_ids, depth)]
            depth += node.hi - node.lo
            if depth > n_blocks:
                node = self._split(node, node.hi - node.lo - (depth - n_blocks))
            path.append(node)
        return path

    def _split(self, node: _Node, k: int) -> _Node:
        """Cut `node` after its first `k` blocks; returns the new upper node. The lower part keeps
        the node (its place in the LRU list: its blocks are the older ones); the upper part joins
        the LRU list's end if unpinned, for the caller to refresh or pin at once."""
        upper = _Node(node.chain, node.lo, node.lo + k, node.block_tokens, node.pins, node.parent, 1)
        node.parent = upper
        node.lo += k
        self._heads[id_at(node.chain, upper.lo)] = upper
        self._heads[id_at(node.chain, node.lo)] = node
        if upper.pins == 0:
            self._lru[upper] = None
        return upper

    def _refresh(self, path: list[_Node]) -> None:
        """Move the unpinned nodes of a path to the LRU list's end, leaf first."""
        move, below = self._lru.move_to_end, None
        for node in reversed(path):
            if node.pins == 0:
                move(node)
                below = self._merge(node, below)
            else:
                below = None

    def _merge(self, node: _Node, below: _Node | None) -> _Node:
        """`node` just joined the LRU list's end, right after `below` (None: not so): if `below`
        is its only child, of the same block size, `below` takes over its blocks and its place
        (the LRU order of the blocks is unchanged); returns the node now holding them."""
        if below is None or node.children != 1 or below.block_tokens != node.block_tokens:
            return node
        heads = self._heads
        del heads[id_at(below.chain, below.lo)]
        below.lo = node.lo                      # its chain passes through `node`'s blocks too
        heads[id_at(below.chain, below.lo)] = below
        below.parent = node.parent
        del self._lru[node]
        return below

    def _drop(self, node: _Node, k: int, announce: bool) -> int:
        """Remove up to `k` deepest blocks of the LRU front `node`; returns the tokens freed."""
        k = min(k, node.hi - node.lo)
        if announce and self.on_removed is not None:
            self.on_removed(node.chain[node.hi - k:node.hi])
        node.hi -= k
        if node.hi == node.lo:
            del self._heads[id_at(node.chain, node.lo)]
            self._lru.popitem(last=False)
            parent = node.parent
            assert parent is not None          # the root is never dropped
            parent.children -= 1
        return k * node.block_tokens

    def _trim(self, new: _Node | None, resident: int, cap: int) -> int:
        """Evict from the LRU front until `cap` holds; returns how many blocks of the inserted
        chain (`resident` blocks long) stay resident.

        The LRU list reads: older nodes, the `new` node of the chain, then its resident prefix.
        Older blocks are evicted first, in the order they would have been had the prefix been
        pinned. Once `new` comes up, nothing older is left, so evicting on takes back new blocks
        deepest first: the longest prefix that fits is kept. The resident prefix is never
        reached: the cache held it within capacity before the insert.
        """
        lru, total = self._lru, resident
        used = self.used_tokens
        while used > cap:
            node = next(iter(lru))
            fresh = node is new or resident < total    # never resident as far as callers know
            k = min(node.hi - node.lo, ceil_div(used - cap, node.block_tokens))
            used -= self._drop(node, k, not fresh)
            if fresh:
                resident -= k
        self.used_tokens = used
        return resident
