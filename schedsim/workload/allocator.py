"""A model of PyTorch's CUDA caching allocator: what ``torch.cuda.memory_stats()``
reports as ``reserved_bytes.all`` (the segments taken from ``cudaMalloc``) for a stream of
allocations and frees, beside ``allocated_bytes.all`` (the blocks handed out).

The rules are those of ``DeviceCachingAllocator`` in pytorch/pytorch
``c10/cuda/CUDACachingAllocator.cpp`` (read at commit ``001074d``; the constants and the
functions named below are the same at torch ``1963fc8``, Dec 2024, the commit
torchtitan's benchmark names), under the default configuration (no
``max_split_size_mb``, no ``garbage_collection_threshold``, no
``roundup_power2_divisions``, no CUDA graphs):

- **rounding** (``round_size``): a request rounds up to a multiple of 512 bytes
  (``kMinBlockSize``), 512 at least;
- **pools** (``get_pool``): requests up to 1 MiB (``kSmallSize``) use the small pool, the
  rest the large one; each pool keeps its free blocks per stream, ordered by (size,
  address) (``BlockComparatorSize``);
- **best fit** (``get_free_block``): the smallest free block of the request's pool and
  stream that is at least the rounded size (the lowest address among equal sizes);
- **segment sizes** (``get_allocation_size``): when no free block fits, a new segment of
  2 MiB (``kSmallBuffer``) for a small request, 20 MiB (``kLargeBuffer``) for one under
  10 MiB (``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
- **splitting** (``should_split``, ``alloc_found_block``): a block is split when what
  remains is at least 512 bytes (small pool) or more than 1 MiB (large pool); the request
  takes the lower addresses, the remainder goes back to the pool;
- **coalescing** (``free_block``, ``try_merge_blocks``): a freed block merges with a free
  neighbour on either side within its segment;
- **at capacity** (``malloc``): when a new segment would take reserved memory past the
  capacity, every cached segment that is wholly free is released (``release_cached_blocks``
  releases the blocks that are not split) and the segment is tried again; if it still
  does not fit the request is out of memory (:class:`OutOfMemory`).

With ``expandable=True`` (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, Note
[Expandable Segments] of the same file): one segment per pool and stream, a virtual range
mapped page by page (2 MiB pages for the small pool, 20 MiB for the large), grows at its
end when no free block fits (a free block at the end is extended); any block splits when
512 bytes or more remain (``should_split``); at capacity the free pages at each segment's
end are unmapped and the growth retried.

Approximated: addresses. Segments get increasing addresses in the order they are made
(``cudaMalloc``'s addresses only break ties between free blocks of equal size). An
expandable segment unmaps only its free end at capacity (torch unmaps the whole pages of
every free block and maps the lowest gap that fits). Not modelled: ``max_split_size_mb``
(whose oversize-block rules are off by default), cross-stream use (``record_stream``
delays a free until the other stream's work is done; here a free is immediate) and the
allocator's CUDA events.

Work: ``O(log n)`` search plus an ``O(n)`` list insertion per event, ``n`` the free blocks
of one pool and stream (bisect on a sorted list). Sizes are integer bytes. Plain Python.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass

MIN_BLOCK = 512                 # kMinBlockSize
SMALL_SIZE = 1 << 20            # kSmallSize: the largest small request
SMALL_BUFFER = 2 << 20          # kSmallBuffer
MIN_LARGE_ALLOC = 10 << 20      # kMinLargeAlloc
LARGE_BUFFER = 20 << 20         # kLargeBuffer
ROUND_LARGE = 2 << 20           # kRoundLarge


def round_size(nbytes: int) -> int:
    """The bytes a request of ``nbytes`` takes (``round_size``): a multiple of 512, at
    least 512."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * -(-nbytes // MIN_BLOCK)


def segment_size(nbytes: int) -> int:
    """The size of a new segment for a rounded request of ``nbytes``
    (``get_allocation_size``)."""
    if nbytes <= SMALL_SIZE:
        return SMALL_BUFFER
    if nbytes < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-nbytes // ROUND_LARGE)


class OutOfMemory(Exception):
    """A request that fits in no cached block and no new segment within the capacity:
    ``request`` (bytes asked), ``reserved`` and ``allocated`` at that moment."""

    def __init__(self, request: int, reserved: int, allocated: int, capacity: int) -> None:
        super().__init__(f"out of memory: {request:,} bytes asked with {reserved:,} "
                         f"reserved ({allocated:,} allocated) of {capacity:,}")
        self.request, self.reserved, self.allocated = request, reserved, allocated


class _Block:
    __slots__ = ("addr", "size", "prev", "next", "free", "key")

    def __init__(self, addr: int, size: int, key: tuple[bool, int]) -> None:
        self.addr, self.size, self.key = addr, size, key
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.free = True


@dataclass
class AllocatorStats:
    """What :meth:`CachingAllocator.stats` gives (bytes): ``reserved`` and ``allocated``
    (the blocks handed out, rounded and unsplit remainders included) now, their peaks,
    ``requested`` (the sum of live requests as asked) and its peak, ``segments`` and
    ``releases`` (times the cache was released to fit a segment)."""

    reserved: int
    allocated: int
    requested: int
    peak_reserved: int
    peak_allocated: int
    peak_requested: int
    segments: int
    releases: int


class CachingAllocator:
    """One device's caching allocator (module docstring). ``capacity``: the bytes the
    segments may take (None: no bound); ``expandable``: expandable segments.

    >>> a = CachingAllocator()
    >>> x = a.malloc(3 << 20)          # 3 MiB: a 20 MiB segment, split
    >>> a.reserved, a.allocated
    (20971520, 3145728)
    """

    def __init__(self, capacity: int | None = None, expandable: bool = False) -> None:
        self.capacity, self.expandable = capacity, expandable
        self._tail: dict[tuple[bool, int], _Block] = {}   # expandable: its last block
        self._base: dict[tuple[bool, int], int] = {}      # expandable: its address
        self._free: dict[tuple[bool, int], list[tuple[int, int]]] = {}
        self._at: dict[int, _Block] = {}          # every block by its address
        self._asked: dict[int, int] = {}          # live block address -> bytes asked
        self._next_addr = 0
        self.reserved = self.allocated = self.requested = 0
        self.peak_reserved = self.peak_allocated = self.peak_requested = 0
        self.segments = self.releases = 0

    def stats(self) -> AllocatorStats:
        return AllocatorStats(self.reserved, self.allocated, self.requested,
                              self.peak_reserved, self.peak_allocated, self.peak_requested,
                              self.segments, self.releases)

    def malloc(self, nbytes: int, stream: int = 0) -> int:
        """Allocate ``nbytes`` (> 0) on ``stream``; returns the block's address (the
        handle :meth:`free` takes). Raises :class:`OutOfMemory` (nothing allocated; the cache may have been released)."""
        nbytes = int(nbytes)
        size = MIN_BLOCK * -(-nbytes // MIN_BLOCK) if nbytes > MIN_BLOCK else MIN_BLOCK
        key = (size <= SMALL_SIZE, stream)
        pool = self._free.setdefault(key, [])
        i = bisect_left(pool, (size, -1))
        if i < len(pool):
            block = self._at[pool.pop(i)[1]]
        elif self.expandable:
            block = self._grow(size, key, nbytes)
        else:
            block = self._new_segment(size, key, nbytes)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if key[0] or self.expandable else remaining > SMALL_SIZE:
            rest = _Block(block.addr + size, remaining, key)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self._at[rest.addr] = rest
            insort(pool, (remaining, rest.addr))
            if self._tail.get(key) is block:
                self._tail[key] = rest
        block.free = False
        self.allocated += block.size
        self.requested += nbytes
        self._asked[block.addr] = nbytes
        if self.allocated > self.peak_allocated:
            self.peak_allocated = self.allocated
        if self.requested > self.peak_requested:
            self.peak_requested = self.requested
        return block.addr

    def _new_segment(self, size: int, key: tuple[bool, int], asked: int) -> _Block:
        seg = segment_size(size)
        if self.capacity is not None and self.reserved + seg > self.capacity:
            self.release_cached()
            self.releases += 1
            if self.reserved + seg > self.capacity:
                raise OutOfMemory(asked, self.reserved, self.allocated, self.capacity)
        block = _Block(self._next_addr, seg, key)
        self._next_addr += seg
        self._at[block.addr] = block
        self.reserved += seg
        self.segments += 1
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        return block

    def _grow(self, size: int, key: tuple[bool, int], asked: int) -> _Block:
        """Map pages at the end of the expandable segment of ``key`` (made on first use)
        until its last block, free, holds ``size``; returns that block (out of the
        pool)."""
        page = SMALL_BUFFER if key[0] else LARGE_BUFFER
        last = self._tail.get(key)
        have = last.size if last is not None and last.free else 0
        grow = page * -(-(size - have) // page)
        if self.capacity is not None and self.reserved + grow > self.capacity:
            self.release_cached()
            self.releases += 1
            last = self._tail.get(key)
            have = last.size if last is not None and last.free else 0
            grow = page * -(-(size - have) // page)
            if self.reserved + grow > self.capacity:
                raise OutOfMemory(asked, self.reserved, self.allocated, self.capacity)
        if have:
            pool = self._free[key]
            del pool[bisect_left(pool, (last.size, last.addr))]
            last.size += grow
            block = last
        else:
            if last is None:
                addr = self._base[key] = self._next_addr
                self._next_addr += 1 << 48        # the segment's virtual range
                self.segments += 1
            else:
                addr = last.addr + last.size
            block = _Block(addr, grow, key)
            block.prev = last
            if last is not None:
                last.next = block
            self._at[addr] = block
            self._tail[key] = block
        self.reserved += grow
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        return block

    def free(self, addr: int) -> None:
        """Free the block at ``addr`` (from :meth:`malloc`); it merges with free
        neighbours in its segment. Raises KeyError for an address not allocated."""
        self.requested -= self._asked.pop(addr)
        block = self._at[addr]
        block.free = True
        self.allocated -= block.size
        pool = self._free[block.key]
        for other in (block.prev, block.next):
            if other is not None and other.free:
                del pool[bisect_left(pool, (other.size, other.addr))]
                gone = self._at.pop(max(block.addr, other.addr))
                if self._tail.get(block.key) is gone:
                    self._tail[block.key] = other if other is block.prev else block
                if other is block.prev:
                    other.size += block.size
                    other.next = block.next
                    if block.next is not None:
                        block.next.prev = other
                    block = other
                else:
                    block.size += other.size
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
        insort(pool, (block.size, block.addr))

    def release_cached(self) -> int:
        """Release every free segment that is not split (``release_cached_blocks``, as
        ``torch.cuda.empty_cache`` does); returns the bytes released."""
        out = 0
        if self.expandable:
            return self._unmap_tails()
        for key, pool in self._free.items():
            keep = []
            for size, addr in pool:
                b = self._at[addr]
                if b.prev is None and b.next is None:
                    del self._at[addr]
                    out += size
                    self.segments -= 1
                else:
                    keep.append((size, addr))
            pool[:] = keep                  # in place: a malloc in flight holds the list
        self.reserved -= out
        return out

    def _unmap_tails(self) -> int:
        """Expandable segments: unmap the whole pages at each segment's free end."""
        out = 0
        for key, last in list(self._tail.items()):
            if not last.free:
                continue
            page = SMALL_BUFFER if key[0] else LARGE_BUFFER
            base = self._base[key]
            first = base + page * -(-(last.addr - base) // page)   # first whole page
            cut = last.addr + last.size - first
            if cut <= 0:
                continue
            pool = self._free[key]
            del pool[bisect_left(pool, (last.size, last.addr))]
            out += cut
            if first == last.addr:                  # the whole block goes
                del self._at[last.addr]
                if last.prev is not None:
                    last.prev.next = None
                    self._tail[key] = last.prev
                else:                               # the segment is empty
                    del self._tail[key], self._base[key]
                    self.segments -= 1
            else:
                last.size -= cut
                insort(pool, (last.size, last.addr))
        self.reserved -= out
        return out

    def check(self) -> None:
        """Raise AssertionError unless the state is consistent: the free lists hold
        exactly the free blocks, sorted; neighbours are adjacent, of one pool; the
        allocated, requested and reserved sums agree with the blocks (for tests)."""
        free = sorted((b.key, b.size, b.addr) for b in self._at.values() if b.free)
        assert free == sorted((k, sz, ad) for k, p in self._free.items() for sz, ad in p)
        assert all(p == sorted(p) for p in self._free.values())
        for b in self._at.values():
            if b.next is not None:
                assert b.next.prev is b and b.next.addr == b.addr + b.size
                assert b.next.key == b.key and not (b.free and b.next.free)
        assert self.allocated == sum(b.size for b in self._at.values() if not b.free)
        assert self.requested == sum(self._asked.values())
        assert self.reserved == sum(b.size for b in self._at.values())

    def all_free(self) -> bool:
        """True when no block is allocated (every cached block is in a free list)."""
        return not self._asked and sum(len(p) for p in self._free.values()) == len(self._at)


__all__ = ["AllocatorStats", "CachingAllocator", "OutOfMemory", "round_size",
           "segment_size", "MIN_BLOCK", "SMALL_SIZE", "SMALL_BUFFER", "LARGE_BUFFER",
           "MIN_LARGE_ALLOC", "ROUND_LARGE"]
