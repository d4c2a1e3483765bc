"""Reads each step's samples, optionally prefetching the next steps' in DataLoader worker processes.

The data order is the sampler's alone (``sampler.ElasticSampler``): this
module holds no position. With ``workload.dataLoaderWorkers`` = 0 a step's
batch is fetched in the training process when it is needed. With N > 0 a
``torch.utils.data.DataLoader`` with N workers fetches the batches of the
steps the sampler says come next in this world, ahead of time. If the step
asks for anything else (the world changed, an epoch ended, a checkpoint was
loaded), the prefetched batches are dropped and prefetching restarts from the
step asked for; what was prefetched is therefore a cache, never state. The
workers are started once, before the trainer's first world, and kept: torch's
persistent workers, reset at each new order.

The worker processes come from a fork server, not from forking the trainer: a
forked worker would inherit the trainer's sockets (the metrics listener, the
rendezvous store, gloo's connections) and keep them open after the trainer
dies, so peers would not see the connection drop and the port stays taken
(seen: a second run on the same port failed with EADDRINUSE while the first
run's loader worker lived on). So datasets must pickle, as under spawn.

Why not torchdata's ``StatefulDataLoader``: its state is per rank and per
worker, so it cannot be re-split when the number of data-parallel ranks
changes, which an elastic job does at every membership change. For map-style
data the whole position is the sampler's (epoch, global offset), which the
checkpoint already holds.
"""

from __future__ import annotations

import functools
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.util
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from .runtime.exit import run_multiprocessing_exit_cleanups
from .workloads.splits import Split

# The fork server imports these once; each worker it forks starts with them imported.
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(["torch", "cohort.trainer.loader", "cohort.trainer.workloads.tokens"])

# How long close() waits, in all, for the index queues' feeder threads to end once their queues are closed.
_FEEDER_JOIN_S = 2.0


# A loader worker has two ways out, each of which cleans up and then ends the process with ``os._exit``: its main
# thread's (multiprocessing's exit handlers once torch's worker loop returns or raises, then the fork server's
# ``os._exit``) and the watchdog's, once the trainer is gone. The first to start holds this lock for good: the
# other, started meanwhile (a worker whose trainer died fails to fetch its next indices from the trainer and
# exits at once), would end the process halfway through the first's cleanup, and its pymp-* directory was left.
_EXITING = threading.Lock()
_FIRST = 1 << 30  # an exit priority above any of multiprocessing's: taken before its exit handlers run


def _exit_with(trainer_pid: int, _worker_id: int) -> None:
    """A DataLoader worker's init: exit when the trainer is gone.

    torch's workers watch their parent process, which here is the fork server; it
    outlives the trainer, and so did the workers (every local run left one worker,
    its fork server and a resource tracker per rank behind). This thread watches the
    trainer instead; once the workers exit, the fork server and the tracker follow. A worker started before the
    trainer had a multiprocessing temp dir makes its own (its resource sharer's socket, once it sent a batch),
    which ``os._exit`` would leave; a later one uses the trainer's and leaves it to the trainer.
    """
    def watch() -> None:
        _wait_exited(trainer_pid)
        _EXITING.acquire()
        run_multiprocessing_exit_cleanups()
        os._exit(0)

    multiprocessing.util.Finalize(None, _EXITING.acquire, exitpriority=_FIRST)
    threading.Thread(target=watch, name="cohort-loader-watchdog", daemon=True).start()


def _wait_exited(pid: int) -> None:
    """Return once process ``pid`` has exited, a zombie included.

    A pidfd turns readable then, at once. ``kill(pid, 0)``, polled, finds a zombie alive: a trainer whose
    parent reads its output to the end before reaping it (``subprocess.run`` with ``capture_output``) waited
    on the worker, which held that output open, for good. Without pidfds (Linux before 5.3, or a seccomp
    profile that refuses the call) ``/proc/<pid>/stat`` is polled once a second.
    """
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        while _running(pid):
            time.sleep(1.0)
        return
    select.select([fd], [], [])


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # the state follows the command's name
    except (FileNotFoundError, ProcessLookupError):
        return False


class _ByIndices(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A DataLoader dataset whose "index" is a whole step's index tensor (batch_size=None)."""

    def __init__(self, split: Split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitem__(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split.fetch(indices)


class _Upcoming:
    """The DataLoader's sampler. Each pass (one per reset of the loader's iterator) yields the indices of the
    ``upcoming()`` given last and notes each, in order, in ``pending``."""

    def __init__(self, pending: deque[torch.Tensor]):
        self.pending = pending
        self.source: Callable[[], Iterator[torch.Tensor]] = lambda: iter(())

    def __iter__(self) -> Iterator[torch.Tensor]:
        for idx in self.source():
            self.pending.append(idx)
            yield idx


class BatchLoader:
    def __init__(self, split: Split, workers: int = 0, prefetch: int = 2, pin_memory: bool = False):
        """``pin_memory``: the workers' batches arrive in page-locked memory (a GPU worker), so the copy to
        the device can be asynchronous (runtime/device.to_device)."""
        self.split, self.workers, self.prefetch, self.pin_memory = split, workers, prefetch, pin_memory
        self._pending: deque[torch.Tensor] = deque()  # the indices the iterator will yield, in order
        self._upcoming = _Upcoming(self._pending)
        self._loader: DataLoader | None = None
        self._it: Iterator[Any] | None = None
        self.restarts = 0
        if workers:
            multiprocessing.forkserver.ensure_running()  # in the background: it imports torch (about 1.2 s here)

    def start(self) -> None:
        """Start the worker processes now, so the first ``get`` does not wait for them (a new trainer's first
        step waited 1.2-1.4 s here for the fork server's start and the workers')."""
        if self.workers and self._loader is None:
            self._restart(lambda: iter(()))

    def get(self, indices: torch.Tensor,
            upcoming: Callable[[], Iterator[torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of ``indices``; ``upcoming()`` yields this step's indices and then the next steps'."""
        if self.workers == 0:
            return self.split.fetch(indices)
        if self._it is None or not self._pending or not torch.equal(self._pending[0], indices):
            self.restarts += 1
            self._restart(upcoming)
        assert self._it is not None
        try:
            x, y = next(self._it)
        except BaseException:
            self.close()  # a worker died or the fetch failed: the next get() starts new workers
            raise
        got = self._pending.popleft()
        if not torch.equal(got, indices):  # upcoming() did not start at the step asked for
            raise RuntimeError("the loader's upcoming indices do not start at the requested step")
        return x, y

    def _restart(self, upcoming: Callable[[], Iterator[torch.Tensor]]) -> None:
        """Prefetch from ``upcoming()`` on. The worker processes are started once and kept (persistent workers):
        a new pass resets torch's iterator, which drops what the workers fetched for the old order, instead of
        ending them and starting new ones at every world change and epoch."""
        self._pending.clear()
        self._upcoming.source = upcoming
        if self._loader is None:
            self._loader = DataLoader(_ByIndices(self.split), batch_size=None, sampler=self._upcoming,
                                      num_workers=self.workers, prefetch_factor=self.prefetch,
                                      pin_memory=self.pin_memory, persistent_workers=True,
                                      multiprocessing_context=_CONTEXT,
                                      worker_init_fn=functools.partial(_exit_with, os.getpid()))
        self._it = iter(self._loader)

    def close(self) -> None:
        """End the worker processes now (about 15 ms for 2 here), not when the iterator is collected (a trainer
        stopped by SIGTERM exited with its workers still running), and return once the queues' semaphores are
        released.

        The semaphores are unlinked, and unregistered from multiprocessing's resource tracker, when their last
        reference goes. For an index queue that is its feeder thread's, which ends after the queue is closed:
        a trainer that went on to exit (``os._exit``) ended that thread in the middle of the release, and
        resource_tracker's warning of a leaked semaphore ended the log (about 1 run in 30). So the feeders are
        joined here, for at most :data:`_FEEDER_JOIN_S`: one blocked on a full pipe is left to exit's cleanup.
        """
        it, self._it, self._loader = self._it, None, None
        shutdown = getattr(it, "_shutdown_workers", None)  # what torch's own __del__ calls; idempotent
        if shutdown is not None:
            shutdown()  # closes the index queues
        deadline = time.monotonic() + _FEEDER_JOIN_S
        for q in getattr(it, "_index_queues", ()):
            feeder = getattr(q, "_thread", None)  # None: nothing was ever put on it
            if feeder is not None:
                feeder.join(max(0.0, deadline - time.monotonic()))
        self._pending.clear()
