"""A simulated accelerator for checking the trainer's device rules on a machine without a GPU.

CI has no GPU, and on the CPU every tensor is on one device, so code that
forgets to move a batch, allocates a buffer on the host for a device
collective, or mixes the two runs fine here and fails (or hangs) on a GPU.
This module registers a second device type, ``sim``, through torch's Python
backend hooks for PrivateUse1 (``_setup_privateuseone_for_python_backend``,
torch/utils/backend_registration.py), and implements it as a wrapper
subclass over host memory:

- a ``sim`` tensor (:class:`Sim`) reports ``device == sim:0`` and holds a CPU
  tensor; every op on it runs on that CPU tensor and its outputs are ``sim``;
- an op that mixes a ``sim`` tensor with a host tensor of one or more
  dimensions raises CUDA's error ("Expected all tensors to be on the same
  device"), except where CUDA allows the mix: copies, ``.to()``, and CPU
  index tensors in advanced indexing; 0-dim host tensors are scalars, as on CUDA;
- factory calls with ``device="sim"`` (from Python or from torch's C++, e.g.
  DDP's buckets) reach the device's two allocators, ``empty`` and
  ``empty_strided``, registered as its kernels with ``torch.library``;
- collectives run over gloo on the host tensors, and each rank logs, per
  collective, whether it passed device or host tensors (``collectives``).
  On a GPU those go to different backends (NCCL, gloo), so ranks whose logs
  differ would hang there: the tests compare the logs across ranks.

torch also needs a device module (``torch.sim``) with streams and events,
which FSDP2 and the trainer's timing use; here they are synchronous no-ops,
and an event reads the host clock (``torch.accelerator.synchronize``, which
torch's model averager calls, is a no-op too). FSDP2 frees and re-allocates the storage
of unsharded parameters (``_fsdp_param.free_storage``/``alloc_storage``),
which a wrapper subclass does not have; :func:`install` points those two at
the wrapped host tensor. Nothing else of torch is changed. Rebinding a parameter's ``.data``
(torch's ``vector_to_parameters`` does) does not reach the wrapped tensor: the trainer writes
parameters in place (trainer/sync/flat.py), which works on both.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

NAME = "sim"
_installed = False
_libraries: list[Any] = []  # torch.library registrations live as long as their Library object
COLLECTIVES: list[tuple[str, str]] = []  # this process's collectives: (op, "device" | "host"), in call order
_METERS: list[DeviceMeter] = []  # those measuring now

# Ops where CUDA accepts host tensors beside device ones.
MIX_ALLOWED = {"aten.copy_.default", "aten._to_copy.default", "aten.index.Tensor", "aten.index_put_.default",
               "aten.index_put.default", "aten._index_put_impl_.default", "aten.lift_fresh.default"}
# Point-to-point ops: ranks legitimately issue different numbers of them (gossip), so they are not compared.
P2P = ("c10d.send", "c10d.recv_", "c10d.recv_any_source_")


class _Event:
    def __init__(self, enable_timing: bool = False, **_: Any):
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return (end.t - self.t) * 1e3


class _Stream:
    def __init__(self, priority: int = 0, device: Any = None, **_: Any):
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: _Event | None = None) -> _Event:
        event = event or _Event()
        event.record()
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _DeviceModule:
    """``torch.sim``: what torch and the trainer ask of a device module (one device, synchronous)."""

    Stream = _Stream
    Event = _Event
    _default = _Stream()

    def is_initialized(self) -> bool:
        return True

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        pass

    def _is_in_bad_fork(self) -> bool:
        return False

    def manual_seed(self, seed: int) -> None:
        pass

    def manual_seed_all(self, seed: int) -> None:
        pass

    def synchronize(self, device: Any = None) -> None:
        pass

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.zeros(8, dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        pass

    def current_stream(self, device: Any = None) -> _Stream:
        return self._default

    def default_stream(self, device: Any = None) -> _Stream:
        return self._default

    def stream(self, s: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def set_stream(self, s: Any) -> None:
        pass

    def get_amp_supported_dtype(self) -> list[torch.dtype]:  # autocast on "sim" (bf16 and fp16 as on CUDA)
        return [torch.float16, torch.bfloat16]


def _is_sim(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == NAME
    return isinstance(device, str) and device.split(":")[0] == NAME


class Sim(torch.Tensor):
    """A tensor on the simulated device: its data is ``elem``, a host tensor."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> Sim:
        r = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, elem.shape, strides=elem.stride(), dtype=elem.dtype, device=torch.device(NAME, 0),
            requires_grad=elem.requires_grad, storage_offset=elem.storage_offset())
        r.elem = elem
        for meter in _METERS:
            meter.created(elem)
        return r

    def __repr__(self) -> str:  # type: ignore[override]
        return f"Sim({self.elem!r})"

    def __deepcopy__(self, memo: dict[int, Any]) -> Sim:
        """A copy of the data and of the attributes (a parameter's ``_is_param``): torch's own deepcopy
        clones the storage, which a wrapper subclass does not have."""
        out = Sim(self.elem.detach().clone())
        if self.requires_grad:
            out.requires_grad_(True)
        memo[id(self)] = out
        for k, v in self.__dict__.items():
            if k != "elem":
                setattr(out, k, copy.deepcopy(v, memo))
        return out

    def tolist(self) -> Any:  # a device-to-host read, as on CUDA (not dispatched, so served here)
        return self.elem.tolist()

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return _run(func, args, kwargs or {})


class DeviceMeter:
    """The most bytes the simulated device held at once while it was active: the storages of its live tensors
    (views counted once; a storage FSDP freed by resizing it counts 0), summed each time a tensor is made."""

    def __init__(self) -> None:
        self.live: set[int] = set()  # weak references to storages (a StorageImpl's address: unique while held)
        self.peak = 0

    def created(self, elem: torch.Tensor) -> None:
        ref = elem.untyped_storage()._weak_ref()
        if ref in self.live:
            torch.UntypedStorage._free_weak_ref(ref)  # each call takes one more: give this one back
        else:
            self.live.add(ref)
        total = 0
        for ref in list(self.live):
            if torch.UntypedStorage._expired(ref):
                torch.UntypedStorage._free_weak_ref(ref)
                self.live.discard(ref)
            else:
                total += torch.UntypedStorage._new_with_weak_ptr(ref).nbytes()
        self.peak = max(self.peak, total)

    def __enter__(self) -> DeviceMeter:
        _METERS.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _METERS.remove(self)
        for ref in self.live:
            torch.UntypedStorage._free_weak_ref(ref)
        self.live.clear()


def _log_collective(name: str, on_device: bool) -> None:
    if name.startswith(("c10d.", "_c10d_functional.")) and not name.startswith(P2P) and "wait_tensor" not in name:
        COLLECTIVES.append((name.split(".")[1], "device" if on_device else "host"))


def _run(func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    flat, _ = tree_flatten((args, kwargs))
    on_device = [t for t in flat if isinstance(t, Sim)]
    name = str(func)
    if on_device:
        _log_collective(name, True)
    if on_device and name not in MIX_ALLOWED:
        hosts = [t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, Sim) and t.dim() > 0]
        if hosts:
            raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                               f"{NAME}:0 and cpu! ({name}: host tensors of shapes "
                               f"{[tuple(t.shape) for t in hosts]})")
    wrap_outputs = bool(on_device)
    if "device" in kwargs and kwargs["device"] is not None:
        wrap_outputs = _is_sim(kwargs["device"])
    originals: dict[int, Sim] = {}

    def unwrap(x: Any) -> Any:
        if isinstance(x, Sim):
            originals[id(x.elem)] = x
            return x.elem
        return torch.device("cpu") if _is_sim(x) else x

    out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))

    def wrap(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and not isinstance(t, Sim):
            if id(t) in originals:  # an in-place op returns its input: keep the caller's object
                return originals[id(t)]
            return Sim(t) if wrap_outputs else t
        return t
    return tree_map(wrap, out)


class SimulatedDevice(TorchDispatchMode):
    """Active around code that runs "on the device": logs the collectives on host tensors (those on
    device tensors are logged by :class:`Sim`'s dispatch, which also sees collectives issued from inside
    other subclasses' dispatch, DTensor's, where this mode is not active)."""

    def __init__(self) -> None:
        super().__init__()
        COLLECTIVES.clear()
        self.collectives = COLLECTIVES

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        if not any(isinstance(t, Sim) for t in flat):
            _log_collective(str(func), False)
        return func(*args, **kwargs)


def _empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> Sim:
    return Sim(torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format))


def _host(t: torch.Tensor) -> torch.Tensor:
    return t.elem if isinstance(t, Sim) else t


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """A copy between the host and the device made below Python dispatch (``torch.tensor(..., device=)``)."""
    _host(dst).copy_(_host(src))
    return dst


def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> Sim:
    return Sim(torch.empty_strided(size, stride, dtype=dtype, layout=layout))


def install() -> None:
    """Register the ``sim`` device with torch (once per process)."""
    global _installed
    if _installed:
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

    _setup_privateuseone_for_python_backend(NAME, backend_module=_DeviceModule())
    # The device's allocators: every factory (zeros, full, .to("sim"), DDP's buckets) starts from these two.
    aten = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a backend's kernels, not a new op
    aten.impl("empty.memory_format", _empty, "PrivateUse1")
    aten.impl("empty_strided", _empty_strided, "PrivateUse1")
    aten.impl("_copy_from", _copy_from, "PrivateUse1")
    # Autocast on "sim" passes ops through uncast: the casts themselves are checked on the CPU, whose
    # bf16 autocast is real (test_training's precision tests); here only devices are.
    autocast = torch.library.Library("_", "IMPL")  # noqa: TOR901
    autocast.fallback(torch.library.fallthrough_kernel, dispatch_key="AutocastPrivateUse1")
    _libraries.extend([aten, autocast])
    torch.accelerator.synchronize = lambda device=None: None  # the Python device guard cannot synchronize
    free, alloc = _fsdp_param.free_storage, _fsdp_param.alloc_storage
    _fsdp_param.free_storage = lambda t: free(t.elem if isinstance(t, Sim) else t)
    _fsdp_param.alloc_storage = lambda t: alloc(t.elem if isinstance(t, Sim) else t)
    _installed = True


@contextlib.contextmanager
def simulated_device() -> Iterator[SimulatedDevice]:
    install()
    with SimulatedDevice() as mode:
        yield mode


def on_device(t: torch.Tensor) -> bool:
    """True for a tensor on the simulated device (a DTensor whose local shard is)."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return isinstance(local, Sim)
