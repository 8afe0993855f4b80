"""A ClusterQueue's queue: priority, then FIFO, with inadmissible workloads parked.

Pending workloads are grouped into classes of equal shape (``records.shape_of``); each class
is a heap in FIFO order and the queue's head is the best head of the classes that are not
parked. When the head cannot be admitted:

* ``BestEffortFIFO`` parks its whole class (equal shapes would fail the same way) and the
  next class's head becomes the head, so a small job can pass a big one;
* ``StrictFIFO`` blocks the queue: nothing behind the head is tried.

``wake`` unparks and unblocks; the scheduler calls it when something changed that could
help (quota freed in the cohort tree, a spec changed). ``wake_for`` wakes only what was
parked with a given hint (free capacity on a topology helps only workloads whose placement
failed). Parking and waking cost O(classes),
not O(workloads), which keeps deep queues cheap.

With admission fair sharing (``set_fair``), classes are per LocalQueue and shape, and the
head is the best head of the LocalQueue with the lowest weighted decayed usage (Kueue's
``UsageBasedAdmissionFairSharing``): usage first, then priority, then FIFO. The usage is
read when the head is asked for, so an admission (which charges its LocalQueue) can hand
the next head to another LocalQueue within the same cycle; the cost is O(LocalQueues of the
ClusterQueue) per head instead of O(1).

``HeldWorkloads`` keeps the pending workloads that wait outside any ClusterQueue's queue
(LocalQueue or ClusterQueue missing, namespace not selected, LocalQueue stopped), grouped by
the LocalQueue they wait for, so that a queue change re-routes only the groups whose queues
changed, not every held workload.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable, Iterator

from phalanx.admission.decisions import Explanation, PendingReason
from phalanx.admission.model import QueueingStrategy
from phalanx.admission.records import Entry, Where

__all__ = ["ClusterQueueQueue", "HeldGroup", "HeldWorkloads", "QueueClass"]


class QueueClass:
    """Pending workloads of one shape; all share one priority (it is part of the shape)."""

    __slots__ = ("heap", "parked", "shape", "why")

    def __init__(self, shape: Hashable) -> None:
        self.shape = shape
        self.heap: list[tuple[int, int, int, Entry]] = []
        self.parked = False
        # Set when parking: why the head did not fit. Its equivalents, never tried, carry the
        # same explanation; its reason says what must change before a retry can succeed.
        self.why: Explanation | None = None


def _live(entry: Entry, cls: QueueClass, token: int) -> bool:
    return entry.where == Where.QUEUED and entry.queue_class is cls and entry.queue_token == token


class ClusterQueueQueue:
    """The pending workloads of one ClusterQueue, in Kueue's order."""

    __slots__ = (
        "_classes",
        "_heads",
        "_lq_heads",
        "_parked",
        "_pushes",
        "_tokens",
        "blocked",
        "blocked_why",
        "fair",
        "name",
        "pending",
        "strategy",
    )

    def __init__(self, name: str, strategy: QueueingStrategy) -> None:
        self.name = name
        self.strategy = strategy
        self.pending = 0
        self.blocked = False
        self.blocked_why: Explanation | None = None
        self._classes: dict[Hashable, QueueClass] = {}
        # (-priority, order_time, seq, push id, token, class, entry): the push id is unique,
        # so comparisons never reach the class or entry objects.
        self._heads: list[tuple[int, int, int, int, int, QueueClass, Entry]] = []
        self._pushes = 0
        self._parked: list[QueueClass] = []
        self._tokens = 0
        self.fair: Callable[[str], float] | None = None
        """LocalQueue key -> weighted decayed usage, with admission fair sharing."""
        # With ``fair``: the class heads per LocalQueue, each heap as ``_heads``.
        self._lq_heads: dict[str, list[tuple[int, int, int, int, int, QueueClass, Entry]]] = {}

    def set_fair(self, fair: Callable[[str], float] | None) -> None:
        """Turn admission fair sharing on (``fair`` gives a LocalQueue's usage) or off; the
        queued workloads are regrouped (classes become per LocalQueue), unparked."""
        if (fair is None) == (self.fair is None):
            self.fair = fair
            return
        queued = list(self.entries())
        self.fair = fair
        self._classes = {}
        self._heads = []
        self._lq_heads = {}
        self._parked = []
        self.blocked = False
        self.blocked_why = None
        self.pending = 0
        for entry in sorted(queued, key=lambda e: e.seq):
            self.push(entry)

    # -- membership --------------------------------------------------------------------------

    def push(self, entry: Entry) -> None:
        shape = entry.shape if self.fair is None else (entry.local_queue, entry.shape)
        cls = self._classes.get(shape)
        if cls is None:
            cls = QueueClass(shape)
            self._classes[shape] = cls
        self._tokens += 1
        token = self._tokens
        entry.queue_class = cls
        entry.queue_token = token
        entry.where = Where.QUEUED
        self.pending += 1
        heapq.heappush(cls.heap, (entry.order_time, entry.seq, token, entry))
        if not cls.parked and cls.heap[0][3] is entry:
            self._push_head(cls)
        if self.blocked:
            # A new arrival ahead of the blocked head is a new head that deserves a try.
            self.blocked = False
            head = self.head()
            self.blocked = head is not entry

    def discard(self, entry: Entry) -> None:
        """Forget a queued workload (lazily: heap slots are skipped when reached)."""
        if entry.where == Where.QUEUED and entry.queue_class is not None:
            entry.where = Where.NOWHERE
            entry.queue_class = None
            self.pending -= 1

    def head(self) -> Entry | None:
        """The workload to try next, or None (empty, all parked, or blocked)."""
        if self.blocked:
            return None
        fair = self.fair
        if fair is None:
            return self._top(self._heads)
        best: tuple[float, int, int, int] | None = None
        found: Entry | None = None
        for local_queue, heads in self._lq_heads.items():
            entry = self._top(heads)
            if entry is None:
                continue
            rank = (fair(local_queue), heads[0][0], heads[0][1], heads[0][2])
            if best is None or rank < best:
                best, found = rank, entry
        return found

    def _top(self, heads: list[tuple[int, int, int, int, int, QueueClass, Entry]]) -> Entry | None:
        """The live head of one heap of class heads, dropping stale slots on the way."""
        while heads:
            _, _, _, _, token, cls, entry = heads[0]
            if not cls.parked and _live(entry, cls, token):
                return entry
            heapq.heappop(heads)
            if not cls.parked and self._clean(cls) and cls.heap[0][3] is not entry:
                self._push_head(cls)
        return None

    def _heap_of(self, entry: Entry) -> list[tuple[int, int, int, int, int, QueueClass, Entry]]:
        if self.fair is None:
            return self._heads
        return self._lq_heads.setdefault(entry.local_queue, [])

    def _push_head(self, cls: QueueClass) -> None:
        order_time, seq, token, entry = cls.heap[0]
        self._pushes += 1
        heapq.heappush(
            self._heap_of(entry),
            (-entry.priority, order_time, seq, self._pushes, token, cls, entry),
        )

    def pop(self, entry: Entry) -> None:
        """Remove ``entry``, which must be the current head."""
        cls = entry.queue_class
        assert isinstance(cls, QueueClass)
        heapq.heappop(self._heap_of(entry))
        heapq.heappop(cls.heap)
        self.discard(entry)
        if self._clean(cls):
            self._push_head(cls)

    @staticmethod
    def _clean(cls: QueueClass) -> bool:
        """Drop stale slots from the top of a class heap; whether it has a live head."""
        heap = cls.heap
        while heap:
            top = heap[0]
            if _live(top[3], cls, top[2]):
                return True
            heapq.heappop(heap)
        return False

    # -- parking -----------------------------------------------------------------------------

    def park_head_class(self, entry: Entry, why: Explanation | None = None) -> None:
        """The head cannot be admitted now (``why``): park its class (BestEffortFIFO) or
        block the queue (StrictFIFO)."""
        if self.strategy == QueueingStrategy.STRICT_FIFO:
            self.blocked = True
            self.blocked_why = why
            return
        cls = entry.queue_class
        assert isinstance(cls, QueueClass)
        cls.parked = True
        cls.why = why
        self._parked.append(cls)

    @property
    def waiting(self) -> bool:
        """Whether anything is parked or blocked (so a wake could make progress)."""
        return self.blocked or bool(self._parked)

    def parked_classes(self) -> list[QueueClass]:
        return list(self._parked)

    def wake(self, only: list[QueueClass] | None = None) -> bool:
        """Unblock and unpark (all classes, or ``only`` those); whether a head may now exist."""
        woke = self.blocked
        self.blocked = False
        targets = self._parked if only is None else only
        for cls in targets:
            if not cls.parked:
                continue
            cls.parked = False
            cls.why = None
            if self._clean(cls):
                self._push_head(cls)
                woke = True
        if only is None:
            self._parked = []
        else:
            self._parked = [cls for cls in self._parked if cls.parked]
        return woke

    def wake_for(self, reason: PendingReason) -> bool:
        """Wake only what was parked (or blocked) for ``reason``; whether a head may now
        exist."""
        if self.blocked:
            if self.blocked_why is None or self.blocked_why.reason != reason:
                return False
            self.blocked = False
            return True
        classes = [cls for cls in self._parked if cls.why is not None and cls.why.reason == reason]
        return bool(classes) and self.wake(only=classes)

    def why_waiting(self, entry: Entry) -> Explanation | None:
        """Why a queued workload that was not tried waits: its class's explanation when an
        equivalent head did not fit, or the blocking head's (StrictFIFO)."""
        cls = entry.queue_class
        if isinstance(cls, QueueClass) and cls.parked and cls.why is not None:
            return cls.why
        if self.blocked:
            return self.blocked_why
        return None

    # -- inspection --------------------------------------------------------------------------

    def entries(self) -> Iterator[Entry]:
        """Every queued workload, in queue order (O(n log n); for status and tests)."""
        live = [
            (-e.priority, e.order_time, e.seq, e)
            for cls in self._classes.values()
            for _, _, token, e in cls.heap
            if _live(e, cls, token)
        ]
        fair = self.fair
        if fair is not None:
            usage = {e.local_queue: fair(e.local_queue) for *_, e in live}
            live.sort(key=lambda item: (usage[item[3].local_queue], *item[:3]))
        else:
            live.sort(key=lambda item: item[:3])
        return (item[3] for item in live)

    def ahead_of(
        self, priority: int, order_time: int, seq: int, local_queue: str
    ) -> Iterator[Entry]:
        """The queued workloads that ``entries()`` puts before a workload with this priority,
        creation order and LocalQueue, unsorted (O(n): one explain or what-if between
        cycles need not sort a deep queue)."""
        fair = self.fair
        usage: dict[str, float] = {}

        def used(lq: str) -> float:
            if fair is None:
                return 0.0
            found = usage.get(lq)
            if found is None:
                found = usage[lq] = fair(lq)
            return found

        mine = (used(local_queue), -priority, order_time, seq)
        for cls in self._classes.values():
            for _, _, token, e in cls.heap:
                if (
                    _live(e, cls, token)
                    and (
                        used(e.local_queue),
                        -e.priority,
                        e.order_time,
                        e.seq,
                    )
                    < mine
                ):
                    yield e

    def compact(self) -> None:
        """Drop empty classes (called rarely; classes are cheap to keep)."""
        for shape in [s for s, c in self._classes.items() if not c.heap and not c.parked]:
            del self._classes[shape]
        for local_queue in [k for k, heads in self._lq_heads.items() if not heads]:
            del self._lq_heads[local_queue]


class HeldGroup:
    """The held workloads that wait for one LocalQueue, and what their routes depended on."""

    __slots__ = ("entries", "stale", "waits_for")

    def __init__(self, waits_for: object) -> None:
        self.entries: dict[str, Entry] = {}
        # What routing read when it held them (the LocalQueue, its ClusterQueue, ...): while
        # it is unchanged, routing them again would hold them again for the same reason.
        self.waits_for = waits_for
        # Something held here under other conditions than ``waits_for``, or by a caller
        # that decided the reason itself: route the whole group again at the next chance.
        self.stale = False


class HeldWorkloads(dict[str, Entry]):
    """The held pending workloads by key (readers see a plain dict), also grouped by the
    LocalQueue key they wait for.

    Change it only through ``hold``, ``release`` and ``take_changed``. A workload held for a
    reason no queue can lift (it is inactive) is in no group: a queue change never touches
    it. ``take_changed`` costs O(groups + workloads it returns), never O(held workloads).
    """

    __slots__ = ("_groups", "_loose")

    def __init__(self, entries: Iterable[Entry] = ()) -> None:
        super().__init__()
        self._groups: dict[str, HeldGroup] = {}
        self._loose: dict[str, Entry] = {}
        for entry in entries:
            # Held before there was an index: nothing is known of why, so re-check them.
            self.hold(entry, entry.local_queue, None, recheck=True)

    def hold(
        self, entry: Entry, local_queue: str | None, waits_for: object, *, recheck: bool = False
    ) -> None:
        """Hold ``entry``; ``local_queue`` None means no queue change can release it."""
        self.release(entry.key)
        self[entry.key] = entry
        if local_queue is None:
            self._loose[entry.key] = entry
            return
        group = self._groups.get(local_queue)
        if group is None:
            group = self._groups[local_queue] = HeldGroup(waits_for)
        elif group.waits_for != waits_for:
            group.stale = True
        if recheck:
            group.stale = True
        group.entries[entry.key] = entry

    def release(self, key: str) -> Entry | None:
        """Forget a held workload (no-op if not held)."""
        entry = self.pop(key, None)
        if entry is None:
            return None
        if self._loose.pop(key, None) is not None:
            return entry
        group = self._groups.get(entry.local_queue)
        if group is not None and group.entries.pop(key, None) is not None and not group.entries:
            del self._groups[entry.local_queue]
        return entry

    def take_changed(self, waits_for: Callable[[str], object]) -> list[Entry]:
        """Release and return, in ``seq`` order, the workloads of every group whose
        ``waits_for(local_queue)`` differs from when they were held (or that is stale)."""
        changed = [
            key
            for key, group in self._groups.items()
            if group.stale or waits_for(key) != group.waits_for
        ]
        taken: list[Entry] = []
        for key in changed:
            group = self._groups.pop(key)
            for entry in group.entries.values():
                if self.get(entry.key) is entry:
                    del self[entry.key]
                    taken.append(entry)
        taken.sort(key=lambda e: e.seq)
        return taken

    def group_sizes(self) -> dict[str, int]:
        """Held workloads per LocalQueue key (for tests and debugging)."""
        return {key: len(group.entries) for key, group in self._groups.items()}
