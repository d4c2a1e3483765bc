"""How a worker process ends (docs/contracts.md §5): its termination message, a safe exit once torch.distributed
has run, and the exit of a process stuck in a call that nothing can interrupt."""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from ..log import get_logger
from ..paths import map_path

log = get_logger(__name__)

# A worker that ends on its own because it is stuck exits with this code: a failure (contracts.md §5), replaced
# as any other, not a bad config (2).
STUCK_EXIT_CODE = 1


def write_termination_message(summary: dict[str, Any]) -> None:
    """The JSON the operator reads from a finished worker (docs/contracts.md §5)."""
    path = map_path(os.environ.get("COHORT_TERMINATION_LOG", "/dev/termination-log"))
    try:
        with open(path, "w") as f:
            f.write(json.dumps(summary))
    except OSError:
        pass  # not in a pod (or not writable): the summary is in the logs too


def exit_process(rc: int = 0) -> NoReturn:
    """End a process that used torch.distributed: flush logs and streams, then ``os._exit``.

    A normal exit (interpreter finalisation) is unsafe once a process group
    has run, because of two native threads:

    - the rendezvous TCPStore's server thread can block finalisation for seconds;
    - a gloo worker thread drops its reference to a finished collective only
      after the caller's ``wait()`` has returned. When that is the last
      reference and the interpreter is already finalising, releasing the
      tensors' Python objects needs the GIL, Python ends the thread with
      ``pthread_exit``, and the forced unwind through a ``noexcept`` destructor
      calls ``std::terminate``: the process dies with SIGABRT ("terminate called
      without an active exception") after its work is done. A core dump shows
      the thread in ``ProcessGroupGloo::runLoop`` ->
      ``~AsyncAllgatherWork`` -> ``gil_scoped_acquire`` -> ``PyThread_exit_thread``
      while the main thread is in ``Py_FinalizeEx`` (torch 2.13, Python 3.11).

    ``os._exit`` skips the exit handlers, so what they would clean up is cleaned up here:
    :func:`run_multiprocessing_exit_cleanups`. The cyclic collector is stopped first: a collection started in
    another thread runs multiprocessing's finalizers there, each taken from its registry before it does its
    work, and ``os._exit`` could end it halfway (a semaphore unlinked, or taken and not unlinked, that the
    resource tracker then reports as leaked).
    """
    gc.disable()
    run_multiprocessing_exit_cleanups()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def run_multiprocessing_exit_cleanups() -> None:
    """Run the exit handlers of multiprocessing that ``os._exit`` skips and that matter after it: the removal of
    this process's ``pymp-*`` directory, if this process made it, and the unlinking of the semaphores it made.

    multiprocessing makes it (under ``$TMPDIR``) for the Unix sockets it listens on (the data loader's fork
    server's; the resource sharer's, in a process that sent a tensor to another, such as a loader worker) and
    removes it in an exit handler, which ``os._exit`` skips: every local run with loader workers left one per
    trainer and one per loader worker behind. That handler is run here. A process that multiprocessing started
    inherits its parent's directory but not the handler, and leaves it alone: removing it there took the
    directory, fork server socket included, from under a parent still running (pytest's, once a spawned test
    rank exited through :func:`exit_process`). The fork server holds its socket open, not its path, and it
    exits when the trainer does.
    """
    util = sys.modules.get("multiprocessing.util")
    synchronize = sys.modules.get("multiprocessing.synchronize")
    # multiprocessing's private names: where a Python renames one, that cleanup is skipped (and the loader's
    # tests that look for leftovers fail).
    registry = getattr(util, "_finalizer_registry", None) or {}
    # The semaphores this process made (a loader's queues) are unlinked and unregistered from the resource
    # tracker, as at a normal exit; those still referenced at os._exit were reported as leaked by the tracker.
    cleanups = {getattr(util, "_remove_temp_dir", None),
                getattr(getattr(synchronize, "SemLock", None), "_cleanup", None)} - {None}
    for finalizer in sorted(list(registry.values()), key=lambda f: -(getattr(f, "_key", (0,))[0] or 0)):
        if getattr(finalizer, "_callback", None) in cleanups:
            with contextlib.suppress(OSError):
                finalizer()  # does its work and leaves the registry


# How often the watcher of :func:`exit_if_stuck` looks whether the block was superseded.
_LOOK_S = 0.1


@contextlib.contextmanager
def exit_if_stuck(seconds: float, what: str, superseded: Callable[[], bool] | None = None,
                  superseded_grace_s: float = 0.0) -> Iterator[None]:
    """Run the block; if it is still running after ``seconds``, or ``superseded_grace_s`` after ``superseded()``
    first answered true, end the process (:data:`STUCK_EXIT_CODE`, the reason as its termination message and an
    error log line) from a watcher thread.

    For a call that neither a timeout nor another thread can interrupt, where the process can do nothing
    better than leave and be replaced: NCCL's communicator init (``init_process_group`` with ``device_id``)
    waits for every member to reach NCCL's bootstrap, with no bound, and the communicator being formed is not
    yet registered anywhere an abort could reach it. ``superseded`` says that what the block does is no longer
    wanted (a newer world was published): a block that would have finished soon is given the grace to, and one
    that is stuck leaves then rather than at its full bound.
    """
    done = threading.Event()

    def watch() -> None:
        start = time.monotonic()
        seen: float | None = None  # when superseded() first answered true
        while not done.wait(_LOOK_S):
            now = time.monotonic()
            if seen is None and superseded is not None and superseded():
                seen = now
            if now - start >= seconds:
                reason = f"{what} did not finish within {seconds:.0f}s"
            elif seen is not None and now - seen >= superseded_grace_s:
                reason = f"{what} was still running {superseded_grace_s:.0f}s after a newer world was published"
            else:
                continue
            reason += ": this worker leaves, to be replaced"
            log.error("stuck: exiting", extra={"error": reason, "seconds": round(now - start, 3)})
            write_termination_message({"error": reason})
            exit_process(STUCK_EXIT_CODE)

    threading.Thread(target=watch, name="cohort-exit-if-stuck", daemon=True).start()
    try:
        yield
    finally:
        done.set()
