"""A small Python model of the prefix cache: the oracle for the native radix tree.

One node per cached page, named by the whole token prefix that ends with it. The same
policies as the engine: longest whole-page prefix; a logical clock touched on every match
and insert along the pages used; eviction of the least recently used leaf page that is
neither locked nor pinned; the pool counts tree pages plus the live sequence's own pages.
"""

from __future__ import annotations


class RefCache:
    def __init__(self, block: int, total_pages: int):
        self.B = block
        self.total = total_pages
        self.last: dict[tuple, int] = {}  # prefix (whole pages) -> last access
        self.pins: dict[tuple, int] = {}
        self.locks: dict[tuple, int] = {}
        self.clock = 0
        self.private = 0  # pages of the live sequence not in the tree
        self.evicted = 0  # pages evicted by the last operation

    # ---- tree ----
    def _prefixes(self, ids, n_pages):
        return [tuple(ids[: (i + 1) * self.B]) for i in range(n_pages)]

    def _is_leaf(self, key) -> bool:
        return not any(len(k) == len(key) + self.B and k[: len(key)] == key for k in self.last)

    def match(self, ids, max_tokens) -> list[tuple]:
        self.clock += 1
        path = []
        for key in self._prefixes(ids, min(len(ids), max_tokens) // self.B):
            if key not in self.last:
                break
            self.last[key] = self.clock
            path.append(key)
        return path

    def insert(self, ids, n_pages) -> None:
        self.clock += 1
        for key in self._prefixes(ids, n_pages):
            self.last[key] = self.clock

    def evict(self, n: int) -> int:
        done = 0
        while done < n:
            cands = [k for k in self.last if not self.pins.get(k) and not self.locks.get(k) and self._is_leaf(k)]
            if not cands:
                break
            victim = min(cands, key=lambda k: self.last[k])
            del self.last[victim]
            done += 1
        self.evicted += done
        return done

    @property
    def free(self) -> int:
        return self.total - len(self.last) - self.private

    # ---- a call: begin, forward (prompt, then one token at a time), finish ----
    def call(self, prompt, extra) -> tuple[int, bool]:
        """begin, forward(prompt tail), forward(t) for t in extra, finish.

        Returns (cached tokens, whether every forward fit in the pool). A forward that does
        not fit evicts what it can, stores nothing, and ends the call (then finish)."""
        self.evicted = 0
        path = self.match(prompt, len(prompt) - 1)
        for k in path:
            self.locks[k] = self.locks.get(k, 0) + 1
        cached = stored = len(path) * self.B
        held = len(path)  # pages in the sequence's page table
        tokens = list(prompt) + list(extra)
        fitted = True
        for target in [len(prompt)] + [len(prompt) + i + 1 for i in range(len(extra))]:
            need = -(-target // self.B) - held
            if need > 0 and need > self.free:
                self.evict(need - self.free)
            if need > self.free:
                fitted = False
                break
            if need > 0:
                self.private += need
                held += need
            stored = target
        self.insert(tokens[:stored], stored // self.B)
        self.private = 0
        for k in path:
            self.locks[k] -= 1
        return cached, fitted

    def pin(self, ids) -> int:
        path = self.match(ids, len(ids))
        for k in path:
            self.pins[k] = self.pins.get(k, 0) + 1
        return len(path) * self.B

    def unpin(self, ids) -> None:
        """Undo a pin of exactly these (whole-page) ids; does not touch the clock."""
        for key in self._prefixes(ids, len(ids) // self.B):
            self.pins[key] -= 1
