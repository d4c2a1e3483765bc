"""Forming and tearing down the process group of one world version, in-process.

Rank 0 of a world hosts a TCPStore on its own IP (bound through a socket we
create, so several workers sharing a host's network, as `cohort run --local`'s
do, never collide). Each version rendezvouses under ``PrefixStore("v<N>")``. Joining is
interruptible and bounded: while waiting for peers (the arrival barrier, then gloo's
connections), a newer published world abandons the attempt instead of blocking until
the timeout, and a rank 0 whose store stops answering is named absent.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from ..log import get_logger
from .device import backend_for
from .exit import exit_if_stuck
from .world import World

log = get_logger(__name__)

# Beyond the rendezvous timeout, how long a store call may stay unanswered before its store counts as silent:
# gloo's waits end by themselves at the timeout while the store answers.
_ANSWER_S = 2.0


class Superseded(Exception):
    """A newer world was published while this one was forming or running."""


class Absent(TimeoutError):
    """Members of a world that never arrived at its rendezvous while this member waited out its timeout, or
    its rank 0 whose store never answered: hung processes, if their pods are still there (the authority
    checks; docs/contracts.md §3, Reports)."""

    def __init__(self, message: str, pods: list[str]):
        super().__init__(f"{message}; absent: {', '.join(pods) or '?'}")
        self.pods = pods


class _InThread(threading.Thread):
    """A call into rank 0's store, in a daemon thread: torch's store client reads each answer without a bound,
    whatever its ``timeout`` (measured: a connection's first ping, ``add``, ``get``, ``check`` and
    ``compare_set`` all still blocked after 12 s against a SIGSTOPped server with a 2 s timeout). Waiting
    for the thread instead keeps the caller bounded and interruptible; the call releases the GIL, and one
    blocked on a stopped server ends when that process dies and the kernel closes its sockets."""

    def __init__(self, fn: Callable[[], Any]):
        super().__init__(name="cohort-store-call", daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as e:  # handed to the waiting caller
            self.error = e
        finally:
            self.done.set()


class _Bounded(dist.Store):
    """A store whose every call is bounded and interruptible, for the calls torch makes itself: gloo's
    connections while ``init_process_group`` forms the group, and each later ``new_group`` (a device mesh's).

    Each call runs in an :class:`_InThread`; one still unanswered after ``limit_s`` fails with ``silent()``
    (rank 0 hosts the store: its process is stopped), and a newer world fails it with :class:`Superseded`.
    A call that the store answers keeps its own outcome, a timeout of gloo's among them. What a call raises
    reaches torch's caller unchanged (measured, torch 2.13: ``init_process_group`` raised the Absent and the
    Superseded themselves).
    """

    def __init__(self, inner: dist.Store, limit_s: float, is_newer: Callable[[], bool],
                 silent: Callable[[], Absent]):
        super().__init__()
        self.inner, self.limit_s, self.is_newer, self.silent = inner, limit_s, is_newer, silent

    def _call(self, fn: Callable[[], Any]) -> Any:
        call = _InThread(fn)
        deadline = time.monotonic() + self.limit_s
        while not call.done.wait(0.05):
            if self.is_newer():
                raise Superseded()
            if time.monotonic() > deadline:
                raise self.silent()
        if call.error is not None:
            raise call.error
        return call.result

    # The methods torch's Python store trampoline calls (torch/csrc/distributed/c10d/init.cpp, PythonStore).
    def set(self, key: str, value: Any) -> None:
        self._call(lambda: self.inner.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call(lambda: self.inner.get(key))

    def add(self, key: str, value: int) -> int:
        return self._call(lambda: self.inner.add(key, value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call(lambda: self.inner.compare_set(key, expected, desired))

    def check(self, keys: list[str]) -> bool:
        return self._call(lambda: self.inner.check(keys))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._call(lambda: self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout))

    def deleteKey(self, key: str) -> bool:  # the trampoline calls it by its C++ name, as getNumKeys
        return self._call(lambda: self.inner.delete_key(key))

    def getNumKeys(self) -> int:
        return self._call(lambda: self.inner.num_keys())

    def clone(self) -> _Bounded:
        return _Bounded(self.inner.clone(), self.limit_s, self.is_newer, self.silent)  # type: ignore[attr-defined]


def gloo_options_bound_to(ip: str) -> object:
    """Gloo options whose device listens on ``ip`` (private torch API, wrapped here only).

    Checked by trainer/tests/test_process_group.py on every torch upgrade.
    """
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # private, and untyped
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=ip)]
    return opts


class Rendezvous:
    def __init__(self, my_ip: str, port: int, timeout_s: float = 60.0, bind_ip: bool = True,
                 device: torch.device | None = None):
        self.my_ip, self.port, self.timeout_s, self.bind_ip = my_ip, port, timeout_s, bind_ip
        self.device = device or torch.device("cpu")
        self._listen: socket.socket | None = None
        self._server: dist.TCPStore | None = None
        self._group_store: dist.Store | None = None

    def _host_store(self) -> dist.TCPStore:
        if self._server is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.my_ip, self.port))
            sock.listen(256)
            self._listen = sock
            self._server = dist.TCPStore(self.my_ip, self.port, is_master=True, master_listen_fd=sock.fileno(),
                                         wait_for_workers=False,
                                         timeout=datetime.timedelta(seconds=self.timeout_s))
            log.info("hosting rendezvous store", extra={"addr": f"{self.my_ip}:{self.port}"})
        return self._server

    def _connect(self, world: World, is_newer: Callable[[], bool]) -> dist.Store:
        """A client of rank 0's store, or :class:`Absent` naming rank 0 once the timeout passes.

        Each attempt runs in its own thread (:class:`_InThread`): torch's client waits for the answer to
        its first ping without a bound, and a stopped rank 0 (a frozen host) answers nothing while its kernel
        still accepts the connection. Waiting here instead stays interruptible by a newer world."""
        deadline = time.monotonic() + self.timeout_s

        def attempt() -> _InThread:
            return _InThread(lambda: dist.TCPStore(world.master_addr, world.master_port, is_master=False,
                                                   timeout=datetime.timedelta(seconds=2)))
        call = attempt()
        while True:
            if call.done.wait(0.05):
                if call.error is None:
                    return call.result
                if not isinstance(call.error, RuntimeError):  # torch's DistError is a RuntimeError
                    raise call.error
                time.sleep(0.05)  # refused (nothing listening yet), reset or timed out: try again
                call = attempt()
            if is_newer():
                raise Superseded() from call.error
            if time.monotonic() > deadline:
                raise self._silent_rank_0(world) from call.error

    def _silent_rank_0(self, world: World) -> Absent:
        """Rank 0 hosts the store: its process is stopped or hung, if its pod is there."""
        return Absent(f"world {world.version}: rank 0's rendezvous store {world.master_addr}:{world.master_port} "
                      f"did not answer within {self.timeout_s:.0f}s", [m.pod for m in world.members if m.rank == 0])

    def join(self, world: World, rank: int, is_newer: Callable[[], bool],
             forming: Callable[[], None] | None = None) -> None:
        """Form the default process group for ``world`` as ``rank``; ``forming`` is called once every member has
        arrived, as the group itself starts forming (the trainer says so in ``/progress``)."""
        base = self._host_store() if rank == 0 else self._connect(world, is_newer)
        store = dist.PrefixStore(f"v{world.version}", base)
        self._barrier(store, world, rank, is_newer)
        kwargs: dict[str, Any] = {}
        pg_store: dist.Store = dist.PrefixStore("pg", store)
        if self.device.type == "cuda":
            kwargs["device_id"] = self.device  # binds the group to this GPU (NCCL's communicator forms eagerly)
        else:
            # Gloo connects through the store: bounded, a rank 0 that stops now is named absent and a newer
            # world interrupts the connections. Not NCCL's: its communicators connect through NCCL's own
            # bootstrap, and its watchdog threads would call into a Python store (not tried without a GPU).
            pg_store = _Bounded(pg_store, self.timeout_s + _ANSWER_S, is_newer, lambda: self._silent_rank_0(world))
            if self.bind_ip:
                kwargs["pg_options"] = gloo_options_bound_to(self.my_ip)
        self._group_store = pg_store  # torch holds the group's store; a Python store's object must live as long
        backend = backend_for(self.device)
        if forming is not None:
            forming()
        with exit_if_stuck(self.form_bound_s, f"forming world {world.version}'s process group ({backend})",
                           superseded=is_newer, superseded_grace_s=self.timeout_s):
            dist.init_process_group(backend, store=pg_store, rank=rank, world_size=world.size,
                                    timeout=datetime.timedelta(seconds=self.timeout_s), **kwargs)

    @property
    def form_bound_s(self) -> float:
        """How long ``init_process_group`` may take after the arrival barrier, everyone having arrived, before
        this process gives up and exits (:func:`exit_if_stuck`): the group's timeout for the address exchange
        and as much again for the connections (gloo's pairs; NCCL's bootstrap and transports), plus a store
        answer. Gloo's own waits end within it (``_Bounded``); NCCL's communicator init, formed eagerly for
        ``device_id``, has no bound of its own: a member that dies between the barrier and NCCL's bootstrap
        leaves the others in it for good, and torch's non-blocking mode, which would bound it, is not used
        (docs/gpu.md#when-a-gpu-worker-is-lost says why). Once a newer world is published (its authority saw
        the death), the process leaves sooner: when the group has still not formed one timeout later (a live
        group forms well within it, and its peers stop waiting for it in the newer world's rendezvous then)."""
        return 2 * self.timeout_s + _ANSWER_S

    def _barrier(self, store: dist.Store, world: World, rank: int, is_newer: Callable[[], bool]) -> None:
        """Interruptible arrival barrier, so init_process_group never waits on a missing peer.

        Every member either goes on to init_process_group or abandons the attempt, and all
        agree which: the first to decide writes the outcome with compare_set (a member that
        sees everyone arrived writes "go"; one that sees a newer world or runs out of time
        writes "abandoned"), and the rest read it. Without this, a member could leave for a
        newer world just after the last one arrived, and the others would block in
        init_process_group until its timeout. A member that times out names the members that never
        arrived (:class:`Absent`).

        The store's calls run in a thread (:class:`_InThread`): when one of them gets no answer for the
        rendezvous timeout (rank 0 stopped while the members were arriving), this member names rank 0
        absent and leaves the thread behind, told to write nothing more.
        """
        beat = [time.monotonic()]  # when the thread's last store call returned
        left = threading.Event()   # set when this member has left the thread behind
        call = _InThread(lambda: self._arrive(store, world, rank, is_newer, beat, left))
        while not call.done.wait(0.05):
            if time.monotonic() - beat[0] > self.timeout_s:
                left.set()
                raise self._silent_rank_0(world)
        if call.error is not None:
            raise call.error

    def _arrive(self, store: dist.Store, world: World, rank: int, is_newer: Callable[[], bool],
                beat: list[float], left: threading.Event) -> None:
        """The barrier's protocol (:meth:`_barrier`), noting in ``beat`` each answer of the store."""
        store.set(f"arrived/{rank}", "1")
        store.add("arrived", 1)
        deadline = time.monotonic() + self.timeout_s
        while not left.is_set():
            beat[0] = time.monotonic()
            arrived = int(store.add("arrived", 0))
            beat[0] = time.monotonic()
            if left.is_set():
                return
            if arrived >= world.size:
                outcome = store.compare_set("outcome", "", "go")
            elif is_newer():
                outcome = store.compare_set("outcome", "", "abandoned:newer")
            elif time.monotonic() > deadline:
                outcome = store.compare_set("outcome", "", "abandoned:timeout")
            elif store.check(["outcome"]):
                outcome = store.get("outcome")
            else:
                time.sleep(0.01)
                continue
            if outcome == b"go":
                return
            if outcome == b"abandoned:newer":
                raise Superseded()
            absent = [m.pod for m in world.members if not store.check([f"arrived/{m.rank}"])]
            raise Absent(f"world {world.version}: only {arrived}/{world.size} members arrived within "
                         f"{self.timeout_s:.0f}s", absent)

    @staticmethod
    def leave() -> None:
        """Tear the current group down; safe to call when a peer has died.

        A group with NCCL communicators is aborted (``ncclCommAbort`` through torch's
        ``_abort_process_group``), not destroyed: destroying a communicator whose peer died can
        block, and the next world's group must form meanwhile. Gloo's groups are destroyed.
        """
        if not dist.is_initialized():
            return
        try:
            if uses_nccl():
                dist.distributed_c10d._abort_process_group()
            else:
                dist.destroy_process_group()
        except Exception as e:  # a broken group may refuse a clean shutdown
            log.warning("leaving the process group failed", extra={"error": str(e)})


def set_collective_timeout(seconds: float) -> None:
    """How long the next collectives of every process group may wait before they fail.

    ``_set_pg_timeout`` (private torch API, wrapped here only) sets the default timeout of a group's
    gloo and NCCL backends; an operation takes it when it is queued, so one already waiting keeps the old.
    Every group is set, the sub-groups of a device mesh too. Checked by trainer/tests/test_collective_timeout.py.
    """
    c10d = dist.distributed_c10d
    timeout = datetime.timedelta(seconds=seconds)
    for group in list(c10d._world.pg_map):
        c10d._set_pg_timeout(timeout, group)


def abort_nccl_communicators() -> None:
    """Abort the NCCL backend of every group (callable from another thread, as NCCL's watchdog does):
    their collectives in flight fail; the groups themselves are left for :meth:`Rendezvous.leave`."""
    for group in list(dist.distributed_c10d._world.pg_map):
        backend = _nccl_backend(group)
        if backend is not None:
            backend.abort()


def uses_nccl() -> bool:
    """The default group has NCCL communicators (a GPU worker's cpu:gloo,cuda:nccl)."""
    if not dist.is_nccl_available() or not dist.is_initialized():
        return False
    return _nccl_backend(dist.distributed_c10d._get_default_group()) is not None


def _nccl_backend(group: dist.ProcessGroup) -> Any:
    """The group's NCCL backend (its backend for CUDA tensors, when that is NCCL), else None."""
    try:
        backend = group._get_backend(torch.device("cuda"))
    except RuntimeError:  # no backend for CUDA tensors in this group
        return None
    return backend if isinstance(backend, dist.ProcessGroupNCCL) else None


def pod_ip() -> str:
    return os.environ.get("COHORT_POD_IP") or "127.0.0.1"
