"""Checkpoints with torch.distributed.checkpoint (DCP): async, atomic, pruned.

Layout (docs/contracts.md §6): ``<root>/step-<8 digits>/`` holds the DCP files,
and a ``COMMITTED`` file is written last; a directory without it is
incomplete and never resumed from. The newest ``keep`` committed ones are kept.

Replicated strategies (data, gossip, localsgd) save from rank 0 alone
(``no_dist``), so a save never depends on a process group that a membership
change may tear down mid-write. Sharded strategies save collectively on a
dedicated group. ``root`` may be a local path (a PVC mount) or an fsspec URL.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any, cast

import fsspec
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from .log import get_logger
from .staging import BackgroundStager, default_stager, default_stager_reusable, first_dtensor, propagate_in_this_thread

log = get_logger(__name__)
# DCP warns at a process's first save or load with ``no_dist`` that it is "assuming the intent is to save (load) in a
# single process", even when asked to in so many words: the replicated strategies' do so on purpose (above).
warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled, )?unavailable or uninitialized, "
                        r"assuming the intent is to (save|load) in a single process", category=UserWarning)
MARKER = "COMMITTED"
STEP_DIR = re.compile(r"^step-(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint location is unusable; the message names the path."""


@dataclass(frozen=True)
class CheckpointRef:
    step: int
    location: str
    time: str = ""
    bytes: int = 0  # of the step's directory, every rank's files

    def to_json(self) -> dict[str, Any]:
        """As /progress and the termination summary name it (``lastCheckpoint``, docs/contracts.md §4, §5)."""
        return asdict(self)


def _join(root: str, name: str) -> str:
    return root.rstrip("/") + "/" + name


class Checkpointer:
    def __init__(self, root: str, keep: int, async_save: bool, metrics: Any = None, display_root: str | None = None):
        self.root, self.keep, self.async_save, self.metrics = root, keep, async_save, metrics
        # Where users see it (the pod's mount path), when ``root`` is a host-side mapping of it.
        self.display_root = display_root or root
        self.fs, self.fs_root = fsspec.core.url_to_fs(root)
        self.is_url = "://" in root
        self._done = threading.Event()  # set when the save in flight is committed (or failed)
        self._done.set()
        self._stagers: dict[str, Any] = {}
        self._staging: Future | None = None  # staging of the last async save, until before_update()
        self._stall = 0.0
        self.last: CheckpointRef | None = None
        self.committed = 0

    # --- discovery ------------------------------------------------------------
    def check_writable(self) -> None:
        probe = _join(self.fs_root, f".write-probe-{time.time_ns()}")
        try:
            self.fs.makedirs(self.fs_root, exist_ok=True)
            with self.fs.open(probe, "w") as f:
                f.write("ok")
            self.fs.rm(probe)
        except Exception as e:  # permission, read-only, missing bucket...
            raise CheckpointError(f"spec.checkpoint.path: cannot write to {self.root} ({e})") from e

    def committed_steps(self) -> list[int]:
        try:
            entries = self.fs.ls(self.fs_root, detail=False)
        except FileNotFoundError:
            return []
        steps = []
        for entry in entries:
            m = STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if m and self.fs.exists(_join(entry, MARKER)):
                steps.append(int(m.group(1)))
        return sorted(steps)

    def latest(self) -> CheckpointRef | None:
        steps = self.committed_steps()
        if not steps:
            return None
        path = _join(self.display_root, f"step-{steps[-1]:08d}")
        meta = json.loads(self.fs.cat(_join(self._fs_path(steps[-1]), MARKER)))
        return CheckpointRef(steps[-1], path, meta.get("time", ""), int(meta.get("bytes", 0)))

    def path(self, step: int) -> str:
        return _join(self.root, f"step-{step:08d}")

    def _fs_path(self, step: int) -> str:
        return _join(self.fs_root, f"step-{step:08d}")

    def _writer(self, step: int):
        if self.is_url:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

            return FsspecWriter(self.path(step))
        return dcp.FileSystemWriter(self.path(step))

    def _reader(self, step: int):
        if self.is_url:
            from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

            return FsspecReader(self.path(step))
        return dcp.FileSystemReader(self.path(step))

    # --- save -----------------------------------------------------------------
    def _async_stager(self, state: dict[str, Any]) -> Any:
        """Stage (copy) the state in the background: training blocks only if it needs to update
        the parameters before the copy is done (see :meth:`before_update` and staging.py)."""
        dtensor = first_dtensor(state)
        kind = "local" if dtensor is None else "sharded"
        if kind == "sharded" and kind in self._stagers and not default_stager_reusable():
            self._stagers.pop(kind).close()  # its one save is done (save() waited for it): torch 2.11 stages once
        if dtensor is not None:
            propagate_in_this_thread(dtensor)
        if kind not in self._stagers:
            self._stagers[kind] = BackgroundStager() if kind == "local" else default_stager(torch.cuda.is_available())
        return self._stagers[kind]

    def save(self, step: int, state: dict[str, Any], meta: dict[str, Any], *, coordinator: bool = True,
             group: dist.ProcessGroup | None = None, sharded: bool = False) -> float:
        """Start saving ``state`` at ``step``; returns the seconds training was blocked so far.

        With async saves the state is staged in the background: call :meth:`before_update`
        before the next optimizer step (it waits for staging if it is still running).
        """
        t0 = time.perf_counter()
        self.wait()  # one save in flight at a time: a slow disk stalls training instead of piling up copies
        kwargs: dict[str, Any] = ({"process_group": group} if sharded else {"no_dist": True})
        writer = self._writer(step)
        if self.async_save:
            response = dcp.async_save(state, storage_writer=writer, async_stager=self._async_stager(state), **kwargs)
            self._staging = getattr(response, "staging_completion", None)
            # A Future, or an AsyncSaveResponse whose upload_completion is one (with an async_stager).
            fut = cast(Future, getattr(response, "upload_completion", response))
        else:
            dcp.save(state, storage_writer=writer, **kwargs)
            fut = Future()
            fut.set_result(None)
        self._stall = time.perf_counter() - t0
        self._done.clear()
        started = time.perf_counter()
        fut.add_done_callback(lambda f: self._on_written(f, step, meta, coordinator, started))
        if self._staging is None:
            self._observe_stall()
        return self._stall

    def before_update(self) -> float:
        """Wait until the last save's staging copy is done (call before changing the state)."""
        if self._staging is None:
            return 0.0
        t0 = time.perf_counter()
        try:
            self._staging.result()
        except Exception as e:  # reported again by the upload future
            log.error("checkpoint staging failed", extra={"error": _named(e)})
        self._staging = None
        blocked = time.perf_counter() - t0
        self._stall += blocked
        self._observe_stall()
        return blocked

    def _observe_stall(self) -> None:
        if self.metrics is not None:
            self.metrics.checkpoint_seconds.labels("stall").observe(self._stall)

    def _on_written(self, fut: Future, step: int, meta: dict[str, Any], coordinator: bool, started: float) -> None:
        try:
            if fut.exception() is not None:
                log.error("checkpoint write failed", extra={"step": step, "error": _named(fut.exception())})
            elif coordinator:
                self._commit(step, meta, started)
        except Exception as e:  # never let a callback thread die silently
            log.error("checkpoint commit failed", extra={"step": step, "error": _named(e)})
        finally:
            self._done.set()

    def _commit(self, step: int, meta: dict[str, Any], started: float) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        size = int(self.fs.du(self._fs_path(step)))  # every rank's files: DCP's save ended with all of them
        marker = _join(self._fs_path(step), MARKER)
        tmp = marker + ".tmp"
        with self.fs.open(tmp, "w") as f:
            f.write(json.dumps({"step": step, "time": stamp, "bytes": size, **meta}))
        self.fs.mv(tmp, marker)  # the commit point: rename is atomic on local filesystems
        self.last = CheckpointRef(step, _join(self.display_root, f"step-{step:08d}"), stamp, size)
        self.committed += 1
        if self.metrics is not None:
            self.metrics.checkpoint_seconds.labels("write").observe(time.perf_counter() - started)
            self.metrics.checkpoints.inc()
        log.info("checkpoint committed", extra={"step": step, "location": self.path(step)})
        self.prune()

    def wait(self) -> None:
        """Block until the save in flight (if any) is committed or has failed."""
        self.before_update()
        self._done.wait()

    def prune(self) -> None:
        steps = self.committed_steps()
        newest = steps[-1] if steps else -1
        for step in steps[:-self.keep]:
            self.fs.rm(self._fs_path(step), recursive=True)
        # Incomplete directories older than the newest commit are leftovers of interrupted writes.
        try:
            entries = self.fs.ls(self.fs_root, detail=False)
        except FileNotFoundError:
            return
        for entry in entries:
            m = STEP_DIR.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if m and int(m.group(1)) < newest and not self.fs.exists(_join(entry, MARKER)):
                self.fs.rm(entry, recursive=True)

    # --- load -----------------------------------------------------------------
    def load(self, step: int, state: dict[str, Any], *, group: dist.ProcessGroup | None = None,
             sharded: bool = False, optional: tuple[str, ...] = ()) -> None:
        """Load checkpoint ``step`` into ``state`` in place (resharding to this world if needed). The entries
        of ``state`` named in ``optional`` are loaded where the checkpoint has them and left as they are where
        it does not; every other entry must be there."""
        kwargs: dict[str, Any] = {"process_group": group} if sharded else {"no_dist": True}
        dcp.load({k: v for k, v in state.items() if k not in optional}, storage_reader=self._reader(step), **kwargs)
        extra = {k: v for k, v in state.items() if k in optional}
        if extra:
            dcp.load(extra, storage_reader=self._reader(step), planner=DefaultLoadPlanner(allow_partial_load=True),
                     **kwargs)


def _named(e: BaseException | None) -> str:
    """An error as the log says it: its type too (torch 2.11's stager failed with "<class 'type'>" alone, a
    KeyError's text)."""
    return f"{type(e).__name__}: {e}"
