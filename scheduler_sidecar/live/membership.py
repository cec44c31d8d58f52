"""Which workers the sidecar has: one registry of its Tritons and their slots, and the single owner of that state.

A *member* is one Triton the sidecar dispatches to; its *slots* are the model instances the engine schedules as
workers (several per Triton for a BLS model's instances). Every member and every slot gets an id that is never
reused, so a worker that joins after another left can never take the id of one still serving (a rolling update
adds the new pod, then drains the old one). Discovery, the admin API and the health checks change membership only
here; the live driver then hands the engine the whole set of slots that should be serving
(:meth:`Membership.serving`), and the engine reconciles against it, as Ray Serve's ``update_replicas`` hands its
router the full replica set rather than a stream of deltas that can be applied out of order.

A member that leaves keeps its slots until each has finished the batch it runs (the engine drains them); only then
are they forgotten. Its URL is free at once: a new Triton at the same address is a new member with new slots.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

from scheduler_sidecar.live.workers import Worker


@dataclass(frozen=True)
class Slot:
    """One model instance of a member, scheduled by the engine as one worker."""

    id: int
    member: int  # the member (Triton) it belongs to
    index: int  # which of the member's instances
    owner: int | None  # the planner that plans it (its place in the deployment's list); None: the unplanned models
    resident: frozenset[str] | None  # the Triton models it serves when it joins (None: every model)


@dataclass
class Member:
    """One Triton: its connection, device kind, health and slots."""

    id: int
    worker: Worker
    device: str | None  # device kind (None: the one the first model's policy plans for)
    loaded: frozenset[str] | None = None  # the Triton models it had ready when it joined (None: not asked)
    healthy: bool = True
    leaving: bool = False  # removed: its slots finish their batches, then go
    slots: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.worker.url


class Membership:
    """The members and their slots (see the module docstring)."""

    def __init__(self) -> None:
        self._member_ids = itertools.count()
        self._slot_ids = itertools.count()
        self.members: dict[int, Member] = {}
        self.slots: dict[int, Slot] = {}
        # connections that left, weakly: one never joins again (a new connection to the same URL is a new member)
        self._departed: weakref.WeakValueDictionary[int, Worker] = weakref.WeakValueDictionary()

    # ------------------------------------------------------------------ changes
    def join(self, worker: Worker, *, device: str | None = None, loaded: frozenset[str] | None = None) -> Member:
        """A Triton joins; ValueError if one at its URL is already serving, or this connection has left."""
        if self.find(worker.url) is not None:
            raise ValueError(f"worker {worker.url} is already in the pool")
        if self._departed.get(id(worker)) is worker:
            raise ValueError(f"worker {worker.url} has left the pool; a new connection to it may join")
        member = Member(next(self._member_ids), worker, device, loaded)
        self.members[member.id] = member
        return member

    def add_slots(self, member: Member, count: int, *, owner: int | None = None,
                  resident: frozenset[str] | None = None) -> list[int]:
        """``count`` new slots of ``member`` for ``owner``'s models; their ids."""
        if member.leaving or member.id not in self.members:
            raise ValueError(f"worker {member.url} has left the pool")
        ids = []
        for _ in range(count):
            slot = Slot(next(self._slot_ids), member.id, len(member.slots), owner, resident)
            self.slots[slot.id] = slot
            member.slots.append(slot.id)
            ids.append(slot.id)
        return ids

    def leave(self, worker: Worker) -> Member:
        """``worker`` leaves (again, if it has already): none of its slots serves any more, each once its batch has
        ended."""
        member = next((m for m in self.members.values() if m.worker is worker), None)
        if member is None:
            raise ValueError(f"worker {worker.url} is not in the pool")
        member.leaving = True
        return member

    def forget(self, slot_ids: set[int]) -> None:
        """Slots of leaving members that have drained are gone; so is a member with none left."""
        for sid in slot_ids:
            slot = self.slots.pop(sid, None)
            if slot is None:
                continue
            member = self.members[slot.member]
            member.slots.remove(sid)
        for member in [m for m in self.members.values() if m.leaving and not m.slots]:
            self._departed[id(member.worker)] = member.worker
            del self.members[member.id]

    def set_health(self, worker: Worker, healthy: bool) -> None:
        """The health of ``worker`` (this connection: an older one at its URL is another member); a leaving one's
        is no longer tracked."""
        member = next((m for m in self.members.values() if m.worker is worker and not m.leaving), None)
        if member is not None:
            member.healthy = healthy

    # ------------------------------------------------------------------ reads
    def find(self, url: str) -> Member | None:
        """The serving (not leaving) member at ``url``."""
        return next((m for m in self.members.values() if m.url == url and not m.leaving), None)

    def serving(self) -> Iterator[tuple[Slot, Member]]:
        """Every slot that should be serving, with its member: what the engine reconciles against."""
        for member in self.members.values():
            if not member.leaving:
                for sid in member.slots:
                    yield self.slots[sid], member

    def owned(self, owner: int) -> frozenset[int]:
        """The serving slots a planner plans."""
        return frozenset(slot.id for slot, _ in self.serving() if slot.owner == owner)

    def worker(self, slot_id: int) -> Worker:
        return self.members[self.slots[slot_id].member].worker

    def label(self, slot_id: int) -> str:
        slot = self.slots[slot_id]
        return f"{self.members[slot.member].url}#{slot.index}"

    @property
    def workers(self) -> list[Worker]:
        """The serving members' connections, in the order they joined."""
        return [m.worker for m in self.members.values() if not m.leaving]
