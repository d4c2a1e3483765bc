"""TrainingJob specs generated from the API's own types, valid and mutated, for differential tests.

The generator walks the model dataclasses of :mod:`cohort.api.models` (their
type hints and field metadata: enums, bounds, patterns, free-form fields), so a
field added to the API is generated without a change here. The one exception is
a string field with a pattern: its valid values cannot be derived from a regex,
so :data:`PATTERN_EXAMPLES` lists some per field, and a patterned field missing
there fails the generator (the test then says which field to add).

Deterministic: everything comes from one ``random.Random(seed)``.
"""

from __future__ import annotations

import copy
import dataclasses
import random
import typing
from collections.abc import Callable, Iterator
from typing import Any, Literal, get_args, get_origin

from cohort.api import models
from cohort.api.models import TrainingJobSpec
from cohort.api.schema import Quantity, _default_of, _hints, _json_name, _unwrap_optional, is_model

# Valid values of each patterned string field (by JSON path), and strings that only look valid.
PATTERN_EXAMPLES: dict[str, list[str]] = {
    "spec.workload.model": [*models.BUILTIN_MODELS, "pkg.mod:make_model", "a:b", "my_pkg.sub.models:build_v2"],
    "spec.workload.dataset": [*models.BUILTIN_DATASETS, "pkg.mod:make_data", "x.y:z", "_p._q:_r"],
    "spec.managedBy": ["", models.MANAGED_BY_SELF, "kueue.x-k8s.io/multikueue", "example.com/ctl_1.v2"],
}
# Around a valid value: the kinds of string an unanchored pattern lets through.
AROUND = [lambda v: v + "-v2", lambda v: "x" + v, lambda v: " " + v, lambda v: v + " ", lambda v: v + "\n",
          lambda v: v + "; rm -rf /", lambda v: v.upper() if v != v.upper() else v + "X", lambda v: v + v[:1] + "!"]
ODD_ENTRY_POINTS = ["x.y:z; rm -rf /", "a:b:c", ":f", "pkg.:f", "1pkg:f", "pkg:1f", "pkg/mod:f", "pkg mod:f",
                    "pkg.mod:", "mlp-v2", "digits2", "Mlp", "pkg.mod:f()"]
QUANTITIES: list[int | str] = [0, 1, 2, 64, "1", "500m", "2Gi", "1.5", "1e3", ".5", "+1", "1000m", "0.5Mi", "3E2",
                               "100Ki", "1e-3", "-1", "0"]
BAD_QUANTITIES: list[Any] = ["lots", "1.5 Gi", " 1", "1Gi ", "1e", "Ki", "0x10", "1..5", "1Gb", "--1", "1 ", "", "∞"]
RESOURCE_NAMES = ["cpu", "memory", "ephemeral-storage", models.GPU_RESOURCE]
ODD_STRINGS = ["", "x", "with space", "ünïcödé", "a\nb", "-", "/checkpoints/sub", "s3://bucket/p"]
INT64_MAX = 2**63 - 1
RESERVED_VOLUMES: tuple[str, ...] = models.RESERVED_VOLUMES
MOUNTED = "user-0"  # a template volume the mutations of volumeMounts find in the spec
# Mount paths around the operator's (models.RESERVED_MOUNT_PATHS and the default checkpoint path).
MOUNT_PATHS = [*models.RESERVED_MOUNT_PATHS, "/checkpoints", "/checkpoints/", "/tmp/x", "/etc", "/dev/shm", "/ckpt"]


@dataclasses.dataclass
class Site:
    """A place in a spec a mutation can write: a field of a model object that is present in the spec."""

    parent: dict[str, Any]
    key: str
    tp: Any
    meta: typing.Mapping[str, Any]
    path: str
    required: bool


@dataclasses.dataclass
class Case:
    """One generated spec, what was done to it, and what it was made from."""

    spec: dict[str, Any]
    what: str
    mutated_from_valid: bool = False  # a valid spec with one mutation: the refusal has one cause


class SpecGen:
    def __init__(self, seed: int, valid: Callable[[dict[str, Any]], bool]):
        self.rng = random.Random(seed)
        self.valid = valid  # the Python judge, used only to pick valid bases for mutations

    # --- valid-looking values ---------------------------------------------------
    def spec(self, presence: float = 0.6) -> dict[str, Any]:
        return self.model(TrainingJobSpec, "spec", presence)

    def model(self, cls: type, path: str, presence: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            name = _json_name(f.name)
            required = _default_of(f) is dataclasses.MISSING
            if required or self.rng.random() < presence:
                out[name] = self.value(hints[f.name], f.metadata, f"{path}.{name}", presence * 0.8)
        return out

    def value(self, tp: Any, meta: typing.Mapping[str, Any], path: str, presence: float) -> Any:
        rng = self.rng
        tp, nullable = _unwrap_optional(tp)
        if nullable and rng.random() < 0.2:
            return None
        origin = get_origin(tp)
        if is_model(tp):
            return self.model(tp, path, presence)
        if origin is Literal:
            return rng.choice(get_args(tp))
        if tp is bool:
            return rng.random() < 0.5
        if tp is int:
            lo = int(meta.get("minimum") if meta.get("minimum") is not None else 0) + bool(meta.get("exclusive_minimum"))
            hi = int(meta["maximum"]) if meta.get("maximum") is not None else lo + rng.choice([1, 3, 8, 100])
            return rng.choice([lo, hi, rng.randint(lo, hi)])
        if tp is float:
            lo = float(meta.get("minimum") if meta.get("minimum") is not None else 0.0)
            hi = float(meta["maximum"]) if meta.get("maximum") is not None else lo + rng.choice([1.0, 10.0])
            x = rng.choice([lo, hi, round(rng.uniform(lo, hi), 4), int(hi)])
            if meta.get("exclusive_minimum") and x <= lo:
                x = lo + 0.001
            return x
        if tp is str:
            if meta.get("pattern"):
                if path not in PATTERN_EXAMPLES:
                    raise KeyError(f"{path} has a pattern: add valid examples of it to PATTERN_EXAMPLES")
                return rng.choice(PATTERN_EXAMPLES[path])
            return rng.choice(ODD_STRINGS)
        if tp is Quantity:
            return rng.choice(QUANTITIES)
        if origin is dict or tp is dict:
            args = get_args(tp)
            if meta.get("free_form") or not args or args[1] is Any:
                return self.free_object()
            if args[1] is Quantity:
                keys = rng.sample(RESOURCE_NAMES, rng.randint(0, 3))
                return {k: (rng.choice([0, 1, "1", "0"]) if k == models.GPU_RESOURCE else rng.choice(QUANTITIES))
                        for k in keys}
            return {f"k{i}": self.value(args[1], {}, f"{path}.k{i}", presence) for i in range(rng.randint(0, 2))}
        if origin is list:
            (item,) = get_args(tp)
            n = rng.choice([0, 0, 1, 2])
            if item is Any or meta.get("free_form"):
                return [self.free_item(path, i) for i in range(n)]
            return [self.value(item, {}, f"{path}[{i}]", presence) for i in range(n)]
        raise TypeError(f"{path}: no generator for {tp!r}")

    def free_object(self) -> dict[str, Any]:
        return self.rng.choice([{}, {"a": 1}, {"hidden": 128, "nested": {"b": [1, None, "x"]}}, {"k": None}])

    def free_item(self, path: str, i: int) -> dict[str, Any]:
        """An item of a free-form list (core/v1 objects): named, as volumes, mounts and env are."""
        name = f"user-{i}"
        if path.endswith(".volumes"):
            return {"name": name, "emptyDir": {}}
        if path.endswith(".volumeMounts"):
            return {"name": name, "mountPath": f"/data/{i}"}
        if path.endswith(".env"):
            return {"name": f"USER_{i}", "value": "x"}
        return {"name": name, "key": "k", "operator": "Exists"}

    # --- where a spec can be changed -------------------------------------------------
    def sites(self) -> list[tuple[tuple[str | int, ...], Any, typing.Mapping[str, Any]]]:
        """Every field of the spec's types, as (keys from the spec, type, field metadata); a list of models
        contributes its first item's fields."""
        out: list[tuple[tuple[str | int, ...], Any, typing.Mapping[str, Any]]] = []

        def walk(cls: type, keys: tuple[str | int, ...]) -> None:
            hints = _hints(cls)
            for f in dataclasses.fields(cls):
                here = (*keys, _json_name(f.name))
                out.append((here, hints[f.name], f.metadata))
                inner, _ = _unwrap_optional(hints[f.name])
                if is_model(inner):
                    walk(inner, here)
                elif get_origin(inner) is list and is_model(get_args(inner)[0]):
                    walk(get_args(inner)[0], (*here, 0))
        walk(TrainingJobSpec, ())
        return out

    def site(self, spec: dict[str, Any], keys: tuple[str | int, ...], tp: Any,
             meta: typing.Mapping[str, Any]) -> Site:
        """The site at ``keys`` in ``spec``, its parents created where absent (with their required fields only)."""
        node: Any = spec
        cls: type = TrainingJobSpec
        for key in keys[:-1]:
            if isinstance(key, int):  # node is a list of cls
                while len(node) <= key:
                    node.append(self.model(cls, "", 0.0))
                node = node[key]
                continue
            py = {_json_name(f.name): f.name for f in dataclasses.fields(cls)}[key]
            f_tp = _unwrap_optional(_hints(cls)[py])[0]
            if get_origin(f_tp) is list:
                if not isinstance(node.get(key), list):
                    node[key] = []
                node, cls = node[key], get_args(f_tp)[0]
            else:
                if not isinstance(node.get(key), dict):
                    node[key] = self.model(f_tp, "", 0.0)
                node, cls = node[key], f_tp
        path = "spec" + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys)
        return Site(node, str(keys[-1]), tp, meta, path, False)

    # --- mutations ----------------------------------------------------------------
    def mutations(self, site: Site) -> list[tuple[str, Any]]:
        """(what, new value) for one site; a value of ``_DELETE`` removes the field."""
        rng = self.rng
        tp, nullable = _unwrap_optional(site.tp)
        meta, origin = site.meta, get_origin(tp)
        out: list[tuple[str, Any]] = [("null", None), ("absent", _DELETE)]
        if is_model(tp):
            out += [("unknown field", {"bogusField": 1}), ("a string for an object", "x"), ("a list", [{}]),
                    ("an empty object", {})]
            return out
        if origin is Literal:
            valid = rng.choice(get_args(tp))
            out += [(f"around {valid!r}", fn(valid)) for fn in AROUND]
            out += [("empty enum", ""), ("unknown enum", "none-of-these"), ("a number for an enum", 1),
                    ("capitalised", valid.capitalize())]
            return out
        if tp is bool:
            return out + [("a string for a bool", "true"), ("a number for a bool", 1)]
        if tp is int:
            lo, hi = meta.get("minimum"), meta.get("maximum")
            out += [("a fraction", 1.5), ("a whole float", 2.0), ("a huge whole float", 1e20), ("a string", "3"),
                    ("a bool", True),
                    ("past int64", INT64_MAX + 1), ("int64 max", INT64_MAX), ("below int64", -INT64_MAX - 2),
                    ("zero", 0), ("negative", -1)]
            if lo is not None:
                out += [("below the minimum", int(lo) - 1), ("the minimum", int(lo))]
            if hi is not None:
                out += [("above the maximum", int(hi) + 1), ("the maximum", int(hi))]
            return out
        if tp is float:
            lo, hi = meta.get("minimum"), meta.get("maximum")
            out += [("a string", "0.5"), ("a bool", False), ("an int", 1), ("huge", 1e308), ("negative", -0.5)]
            if lo is not None:
                out += [("the minimum", lo), ("just below the minimum", lo - 1e-9)]
            if hi is not None:
                out += [("the maximum", hi), ("just above the maximum", hi + 1e-9)]
            return out
        if tp is str:
            out += [("a number for a string", 7), ("a list for a string", ["x"]), ("an object for a string", {})]
            if meta.get("pattern"):
                valid = rng.choice([v for v in PATTERN_EXAMPLES[site.path] if v])
                out += [(f"around {valid!r}", fn(valid)) for fn in AROUND]
                out += [(f"odd {s!r}", s) for s in rng.sample(ODD_ENTRY_POINTS, 4)]
                out += [(f"valid {v!r}", v) for v in PATTERN_EXAMPLES[site.path]]
            else:
                out += [(f"string {s!r}", s) for s in ODD_STRINGS]
            return out
        if tp is Quantity:
            return out + [(f"quantity {q!r}", q) for q in BAD_QUANTITIES + QUANTITIES] + [
                ("a float quantity", 1.5), ("a whole float quantity", 2.0), ("a bool quantity", True)]
        if origin is dict or tp is dict:
            args = get_args(tp)
            out += [("a string for a map", "x"), ("a list for a map", []), ("an empty map", {})]
            if meta.get("free_form") or not args or args[1] is Any:
                return out + [("free-form content", {"any": {"nested": None}, "n": [1, "x"]})]
            if args[1] is Quantity:
                key = rng.choice(RESOURCE_NAMES)
                gpu = models.GPU_RESOURCE
                return out + [(f"{key}: {q!r}", {key: q}) for q in
                              rng.sample(BAD_QUANTITIES + QUANTITIES + [1.5, 2.0, True, None], 6)] + [
                    (f"{gpu}: {q!r}", {gpu: q}) for q in [-1, "-1", 2, "2", "500m", "1.0", "1000m", 1.0, "1e0", "-0", "0.0", "0.9999999999",
                                                            "1e-10", "0.001k", "10e-1", "1000000000n"]]
            return out + [("a null value", {"k": None}), ("a number value", {"k": 1}), ("a string value", {"k": "v"}),
                          ("a null and a string", {"a": None, "b": "v"})]
        if origin is list:
            (item,) = get_args(tp)
            out += [("a string for a list", "x"), ("an object for a list", {}), ("an empty list", []),
                    ("a null item", [None]), ("a string item", ["x"]), ("a list item", [[]])]
            if meta.get("max_items") is not None:
                n = meta["max_items"]
                out += [("as many items as allowed", [{"name": f"v{i}", "emptyDir": {}} for i in range(n)]),
                        ("one item too many", [{"name": f"v{i}", "emptyDir": {}} for i in range(n + 1)])]
            if item is Any or meta.get("free_form"):
                out += [("an unnamed item", [{"emptyDir": {}}]), ("an item named by a number", [{"name": 3}]),
                        ("a long name", [{"name": "n" * 64}]), ("a named item", [{"name": "mine", "x": 1}]),
                        ("two named items", [{"name": "a"}, {"name": "b"}])]
                out += [(f"an item named {n!r}", [{"name": n, "emptyDir": {}}]) for n in RESERVED_VOLUMES]
                out += [(f"an item named {n!r}", [{"name": n, "value": "x"}]) for n in models.CONTRACT_ENV]
                out += [("a name past the env limit", [{"name": "N" * (models.ENV_NAME_MAX + 1)}]),
                        ("a name at the env limit", [{"name": "N" * models.ENV_NAME_MAX}])]
                # (a mount of the template's volume MOUNTED, which mutated() adds, and of one that is not there)
                out += [(f"an item at {p!r}", [{"name": MOUNTED, "mountPath": p}]) for p in MOUNT_PATHS]
                out += [("a path past the limit", [{"name": MOUNTED, "mountPath": "/" * (models.MOUNT_PATH_MAX + 1)}]),
                        ("a numeric path", [{"name": MOUNTED, "mountPath": 1}]),
                        ("a null path", [{"name": MOUNTED, "mountPath": None}]),
                        ("two items at one path", [{"name": MOUNTED, "mountPath": "/d"}, {"name": MOUNTED, "mountPath": "/d"}]),
                        ("two items at two paths", [{"name": MOUNTED, "mountPath": "/d"}, {"name": MOUNTED, "mountPath": "/e"}]),
                        ("an item of a volume not in the template", [{"name": "elsewhere", "mountPath": "/d"}]),
                        ("two items by one name", [{"name": MOUNTED, "emptyDir": {}}, {"name": MOUNTED, "emptyDir": {}}])]
            elif is_model(item):
                out += [("an item with an unknown field", [{"bogusField": 1}]), ("an empty item", [{}])]
            return out
        raise TypeError(f"{site.path}: no mutations for {tp!r}")

    def mutated(self, visits: int, sweep: Callable[[Site], bool]) -> Iterator[Case]:
        """Every site of :meth:`sites`, each mutated ``visits`` times (distinct kinds) in a valid spec; the
        sites ``sweep`` picks get every kind of mutation."""
        for keys, tp, meta in self.sites():
            probe = self.site(copy.deepcopy(self.valid_spec()), keys, tp, meta)
            kinds = self.mutations(probe)
            order = list(range(len(kinds)))
            self.rng.shuffle(order)
            for k in order if sweep(probe) else order[:visits]:
                out = self.valid_spec()
                here = self.site(out, keys, tp, meta)
                if keys[-1] == "volumeMounts":  # a volume for the mounts to name, as a valid template has
                    volumes = out["podTemplate"]["spec"].setdefault("volumes", [])
                    if not any(v.get("name") == MOUNTED for v in volumes):
                        volumes.append({"name": MOUNTED, "emptyDir": {}})
                valid_before = self.valid(out)  # with the parents it needed
                what, value = kinds[k]
                if value is _DELETE:
                    here.parent.pop(here.key, None)
                else:
                    here.parent[here.key] = copy.deepcopy(value)
                yield Case(out, f"{here.path}: {what}", mutated_from_valid=valid_before)

    def combo(self, spec: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """Change several cross-field inputs at once (the rules between sections)."""
        rng = self.rng
        out = copy.deepcopy(spec)
        choices: list[tuple[tuple[str, ...], list[Any]]] = [
            (("parallelism", "strategy"), list(get_args(models.Strategy))),
            (("parallelism", "tensor"), [1, 2, 3]),
            (("parallelism", "pipeline"), [1, 2]),
            (("sync", "algorithm"), list(get_args(models.SyncAlgorithm))),
            (("compression", "method"), list(models.ALL_COMPRESSION)),
            (("compression", "collective"), list(get_args(models.CompressionCollective))),
            (("workload", "precision"), list(get_args(models.Precision))),
            (("workload", "globalBatchSize"), [0, 4, 8, 64]),
            (("workload", "epochs"), [0, 1]),
            (("workload", "maxSteps"), [0, 10]),
            (("workload", "optimizer", "name"), list(get_args(models.OptimizerName))),
            (("workload", "optimizer", "momentum"), [0.0, 0.9]),
            (("replicas", "min"), [1, 2, 4]),
            (("replicas", "target"), [1, 2, 4, 6]),
            (("replicas", "max"), [2, 4, 8]),
            (("resources", "limits"), [{}, {models.GPU_RESOURCE: 1}, {models.GPU_RESOURCE: "2"}, {"cpu": "1"}]),
        ]
        picked = rng.sample(choices, rng.randint(2, 5))
        for keys, values in picked:
            node = out
            for k in keys[:-1]:
                if not isinstance(node.get(k), dict):
                    node[k] = {}
                node = node[k]
            node[keys[-1]] = rng.choice(values)
        return out, "combination of " + ", ".join(".".join(k) for k, _ in picked)

    # --- a mix --------------------------------------------------------------------
    def cases(self, n_random: int, visits: int, n_combos: int,
              sweep: Callable[[Site], bool] = lambda site: False) -> Iterator[Case]:
        for i in range(n_random):
            yield Case(self.spec(), f"random #{i}")
        yield from self.mutated(visits, sweep)
        for _ in range(n_combos):
            spec, what = self.combo(self.valid_spec())
            yield Case(spec, what)

    def valid_spec(self) -> dict[str, Any]:
        for _ in range(200):
            spec = self.spec()
            if self.valid(spec):
                return spec
        raise AssertionError("the generator made no valid spec in 200 tries")


class _Delete:
    def __repr__(self) -> str:
        return "<delete>"


_DELETE: Any = _Delete()
