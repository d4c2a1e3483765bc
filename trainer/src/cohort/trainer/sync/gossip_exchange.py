"""Pairwise, non-blocking exchanges of compressed replicas between gossip peers.

Each link (this rank <-> one peer) keeps CHOCO-Gossip's public copies
(Koloskova et al. 2019): ``mine``, this rank's parameters as the peer knows
them, and ``theirs``, the peer's as this rank knows them. A message carries
C(x - mine), a compressed difference, and both ends add the same decoded
value to the same copy, so the two ends' copies stay identical. The first
message on a link carries x itself in fp32 (the copies start exact, and a
world's first round costs one dense exchange).

Messages pair up: the k-th message each way is exchange k. A rank may send
message k+1 only after receiving the peer's k-th (a credit), so at most two
unread messages wait on a link and nothing queues without bound. When both
k-th messages are accounted for at one end, exchange k is *complete* there, and
its copies are exactly the ones the other end sees when it completes the same
exchange: the consensus steps the two ends take are equal and opposite, and the
sum of all replicas is preserved even though ranks run at different speeds.

Messages travel through host memory over gloo, on a GPU too: the compressed
difference is computed on the device, copied into a host message (header and
payload), and a received message is copied back to the device, where it is
decoded. Gloo, not NCCL, because the exchange is asynchronous and unmatched
by design (a rank posts a receive from a peer and sends to it in whatever
order the protocol's credits allow, and polls for completion): NCCL's
point-to-point operations are stream-ordered, so a receive posted before the
matching send on the same pair blocks that send behind it unless both are
grouped, which a polled protocol cannot promise (NCCL's user guide, p2p). The
copies cost two transfers of a compressed payload per message, small beside
the network hop.

Nothing here blocks on a slow peer: receives are posted ahead and polled.
Gloo's point-to-point Work reports completion only from inside ``wait()`` (and
has no future), so a daemon thread waits on each one (``Pending``);
``drain`` settles every link at a point all ranks reach (evaluation), so the
process group can be torn down with nothing in flight.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..compression.base import Compressor, derive_seed
from ..compression.packing import pack_floats, unpack_floats
from .base import CommStats, allgather_bytes

HEADER_BYTES = 16  # the sender's step (int64) and its typical compute seconds per step (float64)


class Pending:
    """A send or receive whose completion can be polled without blocking."""

    def __init__(self, work: Any, notify: threading.Event | None = None):
        self.work, self.notify = work, notify
        self.error: BaseException | None = None
        self._done = threading.Event()
        threading.Thread(target=self._run, daemon=True, name="cohort-gossip-wait").start()

    def _run(self) -> None:
        try:
            self.work.wait()  # releases the GIL while gloo waits
        except BaseException as e:  # re-raised in the training thread by wait()
            self.error = e
        finally:
            self._done.set()
            if self.notify is not None:
                self.notify.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise self.error


@dataclass(eq=False)  # identity, not field equality: links hold tensors
class Link:
    peer: int
    sent: int = 0
    received: int = 0
    completed: int = 0
    mine: torch.Tensor | None = None
    theirs: torch.Tensor | None = None
    peer_step: int = -1           # step of the peer's latest message
    peer_compute_s: float = 0.0   # the peer's typical compute time per step, as it last reported
    waited_for: int = -1          # the message we last gave up waiting for
    recv_buf: torch.Tensor | None = None
    recv: Pending | None = None

    @property
    def awaiting(self) -> bool:
        """We sent message k and have not yet heard the peer's k-th."""
        return self.received < self.sent


class PeerExchange:
    def __init__(self, rank: int, peers: list[int], numel: int, codec: Compressor, stats: CommStats,
                 seed: int, group: dist.ProcessGroup | None = None, device: torch.device | None = None):
        self.rank, self.numel, self.codec, self.stats, self.seed, self.group = rank, numel, codec, stats, seed, group
        self.device = device or torch.device("cpu")  # where the parameters and the public copies live
        self._pinned = self.device.type == "cuda"
        self.links = {p: Link(p) for p in peers}
        self._sends: list[tuple[Pending, torch.Tensor]] = []
        self._arrival = threading.Event()  # set whenever any receive completes

    def message_nbytes(self, index: int) -> int:
        """Bytes of a link's ``index``-th message (0-based): the first is dense fp32."""
        body = 4 * self.numel if index == 0 else self.codec.payload_nbytes(self.numel)
        return HEADER_BYTES + body

    # --- sending ---------------------------------------------------------------
    def may_send(self, link: Link) -> bool:
        return link.sent <= link.received

    def send(self, link: Link, x: torch.Tensor, step: int, compute_s: float) -> bool:
        """Send C(x - mine) to the peer; True if this completed an exchange."""
        if link.sent == 0:
            payload, link.mine = pack_floats(x), x.clone()
        else:
            assert link.mine is not None
            payload, q = self.codec.roundtrip(x - link.mine, derive_seed(self.seed, self.rank, link.peer, link.sent))
            link.mine += q
        header = torch.cat([torch.tensor([step], dtype=torch.int64).view(torch.uint8),
                            torch.tensor([compute_s], dtype=torch.float64).view(torch.uint8)])
        msg = torch.cat([header, payload.cpu()])  # the message is staged in host memory (gloo)
        self._sends.append((Pending(dist.isend(msg, dst=link.peer, group=self.group)), msg))
        link.sent += 1
        self.stats.record(msg.numel(), payload.numel(), 4 * self.numel)
        self._reap_sends()
        return self._complete(link)

    def _reap_sends(self) -> None:
        for pending, _ in self._sends:
            if pending.done():
                pending.wait()  # re-raises a failed send
        self._sends = [(p, m) for p, m in self._sends if not p.done()]

    # --- receiving -------------------------------------------------------------
    def post(self, link: Link) -> None:
        """Have a receive waiting for the peer's next message."""
        if link.recv is None:
            link.recv_buf = torch.empty(self.message_nbytes(link.received), dtype=torch.uint8, pin_memory=self._pinned)
            link.recv = Pending(dist.irecv(link.recv_buf, src=link.peer, group=self.group), self._arrival)

    def arrived(self, link: Link) -> bool:
        return link.recv is not None and link.recv.done()

    def receive(self, link: Link) -> bool:
        """Take the posted message (waiting if needed) into ``theirs``; True if an exchange completed."""
        assert link.recv is not None and link.recv_buf is not None
        link.recv.wait()  # raises if the peer is gone
        msg, link.recv, link.recv_buf = link.recv_buf, None, None
        link.peer_step = int(msg[:8].view(torch.int64)[0])
        link.peer_compute_s = float(msg[8:16].view(torch.float64)[0])
        payload = msg[HEADER_BYTES:].to(self.device, non_blocking=True)
        if link.received == 0:
            link.theirs = unpack_floats(payload).clone()
        else:
            assert link.theirs is not None
            seed = derive_seed(self.seed, link.peer, self.rank, link.received)
            link.theirs += self.codec.decode(payload, self.numel, seed)
        link.received += 1
        return self._complete(link)

    def _complete(self, link: Link) -> bool:
        if min(link.sent, link.received) > link.completed:
            link.completed += 1
            return True
        return False

    def wait_any(self, links: list[Link], deadline: float) -> None:
        """Sleep until one of ``links`` has a message or ``deadline`` passes."""
        while True:
            self._arrival.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0 or any(self.arrived(lk) for lk in links):
                return
            self._arrival.wait(remaining)

    # --- settling --------------------------------------------------------------
    def drain(self, world: int) -> list[Link]:
        """Collective: deliver every message in flight and cancel surplus receives.

        Ranks agree on (sent, received, receive posted) per link. A receive
        that no real message will satisfy gets a dummy of the expected size
        (discarded); every real message is received and accounted. Returns the
        links whose exchanges completed while draining.
        """
        mine = torch.zeros(world, 3, dtype=torch.int64)
        for p, lk in self.links.items():
            mine[p] = torch.tensor([lk.sent, lk.received, int(lk.recv is not None)])
        table = torch.empty(world * world * 3, dtype=torch.int64)
        dist.all_gather_into_tensor(table, mine.reshape(-1), group=self.group)
        self.stats.record(allgather_bytes(mine.numel() * mine.element_size(), world), 0, 0)  # wire only
        view = table.view(world, world, 3)  # view[j, i]: rank j's counts for its link to rank i
        for p, lk in self.links.items():
            peer_received, peer_posted = int(view[p, self.rank, 1]), int(view[p, self.rank, 2])
            if peer_posted and lk.sent == peer_received:
                dummy = torch.zeros(self.message_nbytes(peer_received), dtype=torch.uint8)
                self._sends.append((Pending(dist.isend(dummy, dst=p, group=self.group)), dummy))
                self.stats.record(dummy.numel(), 0, 0)
        completed = []
        for p, lk in self.links.items():
            real = int(view[p, self.rank, 0]) - lk.received
            for _ in range(real):
                self.post(lk)
                if self.receive(lk):
                    completed.append(lk)
            if lk.recv is not None:  # satisfied by the dummy sent to us
                lk.recv.wait()
                lk.recv = lk.recv_buf = None
        for pending, _ in self._sends:
            pending.wait()
        self._sends = []
        return completed
