"""TrainingJob spec and status models (``cohort.dev/v1alpha1``).

Every default, enum string and bound of the API lives here, once. Field docs
become the CRD descriptions and ``docs/api.md``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal, Optional

from .schema import Quantity, Rule, field, quantity_value

GROUP = "cohort.dev"
VERSION = "v1alpha1"
KIND = "TrainingJob"
PLURAL = "trainingjobs"

# A job's name prefixes its Service (a DNS-1035 label) and its pods
# (``<job>-worker-<n>``, which must stay a valid hostname, <= 63 characters).
JOB_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
JOB_NAME_MAX = 40

# spec.managedBy: who reconciles a job (as batch Job, JobSet and Kubeflow's TrainJob have it).
MANAGED_BY_SELF = "cohort.dev/operator"
MANAGED_BY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[-A-Za-z0-9_.]{1,63})?$"

# The operator's own volumes in every worker pod (operator pods.py builds them). A podTemplate volume or
# volumeMount by one of these names would clash with them, so admission refuses it (issue 32).
CONFIG_VOLUME = "cohort-config"
SCRATCH_VOLUME = "scratch"
CHECKPOINT_VOLUME = "cohort-checkpoints"
SHM_VOLUME = "cohort-shm"
RESERVED_VOLUMES: tuple[str, ...] = (CONFIG_VOLUME, SCRATCH_VOLUME, CHECKPOINT_VOLUME, SHM_VOLUME)
# The most volumes (and volumeMounts) a podTemplate adds: a bound the rules above need to stay within the
# API server's CEL cost budget, far above what a worker mounts.
MAX_TEMPLATE_ITEMS = 128
# Where the operator mounts its config and scratch volumes in every worker (and the checkpoint volume at
# spec.checkpoint.path): a template mount at one of these paths would make the pod invalid, so admission
# refuses it. The longest mount path and env name a template gives, and the most env entries (CEL bounds).
CONFIG_DIR = "/etc/cohort"
SCRATCH_DIR = "/tmp"
RESERVED_MOUNT_PATHS: tuple[str, ...] = (CONFIG_DIR, SCRATCH_DIR)
MOUNT_PATH_MAX = 1024
ENV_NAME_MAX = 256
MAX_TEMPLATE_ENV = 256
# The worker contract's environment (docs/contracts.md §2), set by the operator in every worker. A template
# setting one would point a worker elsewhere (another job's world, another config), so admission refuses it.
CONTRACT_ENV: tuple[str, ...] = ("COHORT_CONFIG", "COHORT_JOB_NAME", "COHORT_NAMESPACE", "COHORT_POD_NAME",
                                 "COHORT_POD_IP", "COHORT_METRICS_PORT", "COHORT_WORLD", "COHORT_REPORTS")


def _cel_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in items) + "]"


def _text(items: tuple[str, ...]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1]


def _unique(items: list[str]) -> bool:
    return len(set(items)) == len(items)

BUILTIN_MODELS = ("mlp", "convnet", "transformer")
BUILTIN_DATASETS = ("digits", "synthetic-classification", "synthetic-lm", "tokens", "python-source")
# A user entry point: an importable module path and a function name.
ENTRY_POINT = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*"

Strategy = Literal["data", "fsdp", "tensor", "pipeline", "hybrid", "auto"]
SyncAlgorithm = Literal["allreduce", "gossip", "localsgd"]
Topology = Literal["ring", "exponential", "random"]
CompressionMethod = Literal[
    "none", "fp16", "bf16", "fp8", "powersgd", "topk", "randomk", "qsgd", "terngrad", "signsgd",
    "dgc", "threshold", "natural", "onebit", "signum"]
CompressionCollective = Literal["allgather", "sparse", "cyclic", "global"]
OptimizerName = Literal["sgd", "adamw"]
OuterOptimizerName = Literal["none", "sgd", "nesterov"]
StragglerPolicy = Literal["replace", "ignore"]
SuccessPolicy = Literal["rank0", "all"]
PipelineSchedule = Literal["gpipe", "1f1b"]
Precision = Literal["fp32", "bf16", "fp16"]
ActivationCheckpointing = Literal["none", "full", "selective", "auto"]
# The built-in models without blocks (a ``layers`` ModuleList or ModuleDict): nothing to checkpoint block by block.
BLOCKLESS_MODELS: tuple[str, ...] = ("mlp", "convnet")
# The GPU resource of NVIDIA's device plugin. One trainer process drives one device, so a worker asks for 0 or 1.
GPU_RESOURCE = "nvidia.com/gpu"
Phase = Literal["Pending", "Running", "Recovering", "Suspended", "Succeeded", "Failed"]
PHASES: tuple[str, ...] = Phase.__args__  # type: ignore[attr-defined]

# Which compressors each sync algorithm can use. Gossip exchanges parameters
# (CHOCO-style compressed differences), local SGD averages parameters densely,
# so PowerSGD's low-rank gradient factorisation only fits allreduce.
# Declared once: the CEL rule and its message below, its Python twin (which the trainer's
# config parser runs too) and docs/api.md derive from it.
SUPPORTED_COMPRESSION: dict[str, tuple[str, ...]] = {
    "allreduce": CompressionMethod.__args__,  # type: ignore[attr-defined]
    "gossip": ("none", "fp16", "bf16", "fp8", "topk", "randomk", "qsgd", "terngrad", "signsgd"),
    "localsgd": ("none", "fp16", "bf16", "fp8"),
}
ALL_COMPRESSION: tuple[str, ...] = CompressionMethod.__args__  # type: ignore[attr-defined]
# Methods that keep a momentum of their own (compression.momentum) and apply it before
# compressing (DGC's momentum correction, Signum): the optimizer must then be SGD with
# momentum 0 (adamw's first moment would be a second momentum).
OWN_MOMENTUM: tuple[str, ...] = ("dgc", "signum")
_OWN_MOMENTUM_CEL = "self.compression.method in [" + ", ".join(f"'{m}'" for m in OWN_MOMENTUM) + "]"
_OWN_MOMENTUM_NEEDS = ("spec.compression.method " + " and ".join(OWN_MOMENTUM)
                       + " apply their own momentum (spec.compression.momentum): they need ")


def _supported_compression_cel() -> str:
    def one(sync: str, methods: tuple[str, ...]) -> str:
        if set(methods) == set(ALL_COMPRESSION):
            return f"self.sync.algorithm == '{sync}'"
        listed = ", ".join(f"'{m}'" for m in methods)
        return f"(self.sync.algorithm == '{sync}' && self.compression.method in [{listed}])"
    return " || ".join(one(sync, methods) for sync, methods in SUPPORTED_COMPRESSION.items())


def _supported_compression_text() -> str:
    return "; ".join(f"{sync}: {'any' if set(methods) == set(ALL_COMPRESSION) else ', '.join(methods)}"
                     for sync, methods in SUPPORTED_COMPRESSION.items())


def _name_pattern(builtins: tuple[str, ...]) -> str:
    return "(" + "|".join(b.replace("-", r"\-") for b in builtins) + "|" + ENTRY_POINT + ")"


@dataclass
class Optimizer:
    """The optimizer and its hyper-parameters."""

    name: OptimizerName = field("sgd", doc="Optimizer: sgd (with momentum) or adamw.")
    lr: float = field(0.1, minimum=0, exclusive_minimum=True,
                      doc="Base learning rate for the reference world size (see lrScaling).")
    momentum: float = field(0.9, minimum=0, maximum=1, doc="SGD momentum (ignored by adamw).")
    weight_decay: float = field(0.0, minimum=0, doc="Decoupled weight decay.")
    warmup_steps: int = field(0, minimum=0, doc="Linear learning-rate warmup, in steps.")
    schedule: Literal["constant", "linear", "cosine"] = field(
        "constant", doc="Decay of lr after warmup, down to minLrRatio x lr at the end of the run: over the steps "
                        "after warmup when maxSteps is set, else over the fraction of the epochs done (the world "
                        "size may change, so the number of steps is not known in advance).")
    min_lr_ratio: float = field(0.0, minimum=0, maximum=1, doc="lr at the end of a linear or cosine decay, "
                                                               "as a fraction of lr.")
    grad_clip_norm: float = field(0.0, minimum=0, doc="Clip the gradient's global L2 norm to this (0: off). The "
                                                      "norm is over the whole model: every FSDP, tensor and "
                                                      "pipeline shard counts once.")
    implementation: Literal["auto", "foreach", "fused", "loop"] = field(
        "auto", doc="torch's optimizer kernel: auto (torch's choice: foreach, one multi-tensor kernel per group of "
                    "parameters, where the device supports it), foreach, fused (one fused kernel per step; CPU and "
                    "CUDA) or loop (one parameter at a time). Every choice computes the same update.")
    lr_scaling: Literal["none", "linear", "sqrt"] = field(
        "linear", doc="How lr scales with the data-parallel world size relative to replicas.target.")


@dataclass(kw_only=True)
class Workload:
    """What to train: model, data, schedule."""

    __rules__ = (
        Rule(cel="self.epochs > 0 || self.maxSteps > 0",
             message="one of spec.workload.epochs or spec.workload.maxSteps must be > 0",
             check=lambda w: w.epochs > 0 or w.max_steps > 0, field_path=".epochs"),
        # A transition rule (oldSelf): only the API server sees both versions, so the Python twin passes.
        # Workers of one world must share the seed (the data order, the compressors' and gossip's shared
        # draws); a changed seed would reach only the pods started after the change.
        Rule(cel="self.activationCheckpointing in ['none', 'auto'] || !(self.model in ["
                 + ", ".join(f"'{m}'" for m in BLOCKLESS_MODELS) + "])",
             message="spec.workload.activationCheckpointing recomputes the model's blocks (model.layers) in "
                     f"backward; {' and '.join(BLOCKLESS_MODELS)} have none (use transformer, or none)",
             check=lambda w: w.activation_checkpointing in ("none", "auto") or w.model not in BLOCKLESS_MODELS,
             field_path=".activationCheckpointing"),
        Rule(cel="self.seed == oldSelf.seed",
             message="spec.workload.seed is immutable: the workers of a running job share it (create a new "
                     "job for another seed; docs/workloads.md)",
             check=lambda w: True, field_path=".seed"),
    )

    model: str = field(pattern=_name_pattern(BUILTIN_MODELS),
                       pattern_message="must be one of mlp, convnet, transformer or 'pkg.module:function'",
                       doc="Built-in model (mlp, convnet, transformer) or a user entry point 'pkg.module:function'.")
    model_args: dict[str, Any] = field({}, free_form=True, doc="Free-form arguments for the model.")
    dataset: str = field(pattern=_name_pattern(BUILTIN_DATASETS),
                         pattern_message="must be one of digits, synthetic-classification, synthetic-lm, tokens, "
                                         "python-source or 'pkg.module:function'",
                         doc="Built-in dataset (digits, synthetic-classification, synthetic-lm; tokens: token "
                             "shards at datasetArgs.path, a directory or fsspec URL; python-source: the Python "
                             "standard library's source, BPE-tokenised once and cached) or 'pkg.module:function' "
                             "returning a Data (docs/workloads.md).")
    dataset_args: dict[str, Any] = field({}, free_form=True, doc="Free-form arguments for the dataset.")
    epochs: int = field(10, minimum=0, doc="Passes over the training set (0 when maxSteps sets the length).")
    max_steps: int = field(0, minimum=0, doc="Stop after this many optimizer steps (0: use epochs).")
    batch_size: int = field(64, minimum=1, doc="Samples per data-parallel rank per step; with globalBatchSize, "
                                               "the largest micro-batch a rank runs at once.")
    global_batch_size: int = field(
        0, minimum=0,
        doc="Samples per optimizer step over all ranks, whatever the world size (0: batchSize x data-parallel "
            "ranks). When the world shrinks, each rank accumulates gradients over more micro-batches, so the "
            "optimisation does not depend on how many pods are alive; communication runs once per step. "
            "Strategy data only; lrScaling then counts globalBatchSize / batchSize ranks.")
    data_loader_workers: int = field(
        0, minimum=0, maximum=64,
        doc="DataLoader worker processes per rank that fetch the next steps' samples ahead of time (0: fetch in "
            "the training process). The data order stays the trainer's, so resume stays exact.")
    optimizer: Optimizer = field(Optimizer, doc="Optimizer settings.")
    seed: int = field(0, minimum=0, doc="Seed for parameters, data order and every random choice. Immutable; a "
                                        "job that resumes a checkpoint taken with another seed finishes the epoch "
                                        "in progress in its order and orders later epochs with this one "
                                        "(docs/workloads.md).")
    precision: Precision = field(
        "fp32", doc="Arithmetic of forward and backward: fp32; bf16 (autocast to bfloat16 on the worker's device, "
                    "GPU or CPU; under FSDP2 its MixedPrecisionPolicy: bf16 parameters in compute, fp32 gradient "
                    "reduction); fp16 (autocast to float16 with a dynamic gradient scaler; strategy data only). "
                    "Parameters and optimizer state stay fp32 in every case.")
    compile: bool = field(False, doc="torch.compile the model before training: each transformer block on its own "
                                     "(as torchtitan does), other models whole. The first steps pay for "
                                     "compilation; a world change recompiles nothing.")
    activation_checkpointing: ActivationCheckpointing = field(
        "none", doc="Trade compute for activation memory, block by block (as torchtitan's activation_checkpoint): "
                    "none; full (each block keeps only its input and recomputes its forward in backward: about a "
                    "third more block compute); selective (each block keeps the outputs of its matmuls, attention "
                    "and collectives and recomputes the cheap operations between them: norms, activations, "
                    "additions); auto (the first of none, selective and full under which the planner's memory model "
                    "fits the device: COHORT_DEVICE_MEMORY, 90 % of a GPU's memory or resources.limits.memory, with "
                    "what the model's blocks keep measured at start-up on the worker's device in this precision; "
                    "with strategy auto, chosen with each plan; none for a model without blocks). "
                    "The gradients are those of none. full and selective need a model with blocks (model.layers).")
    deterministic: bool = field(True, doc="Use deterministic algorithms (required for bitwise resume).")
    eval_every_epochs: int = field(1, minimum=0, doc="Evaluate on the test split every N epochs (0: only at the end).")
    eval_every_steps: int = field(0, minimum=0, doc="Also evaluate every N optimizer steps (0: off); for runs "
                                                    "measured in steps (maxSteps), where epochs are long.")


@dataclass
class Replicas:
    """Elastic worker counts. ``target`` is the scale subresource."""

    __rules__ = (
        # Implied by the two below, but said on its own: min 3, max 2 is a mistake in max or min, not in target.
        Rule(cel="self.min <= self.max", message="spec.replicas.max must be >= spec.replicas.min",
             check=lambda r: r.min <= r.max, field_path=".max"),
        Rule(cel="self.min <= self.target", message="spec.replicas.target must be >= spec.replicas.min",
             check=lambda r: r.min <= r.target, field_path=".target"),
        Rule(cel="self.target <= self.max", message="spec.replicas.target must be <= spec.replicas.max",
             check=lambda r: r.target <= r.max, field_path=".target"),
    )

    min: int = field(2, minimum=1, doc="Fewest workers the job trains with.")
    max: int = field(8, minimum=1, doc="Most workers the job may scale to.")
    target: int = field(4, minimum=1, doc="Workers wanted now (kubectl scale / HPA set this).")
    spares: int = field(0, minimum=0, doc="Standby workers, promoted at once when a worker fails.")
    startup_grace_seconds: int = field(
        120, minimum=0,
        doc="Gang start: the first world (and the first after a full restart) waits for replicas.target Ready "
            "workers, or this long and then starts with at least replicas.min. 0 starts as soon as min are Ready.")


@dataclass
class Parallelism:
    """How the model is split across workers."""

    __rules__ = (
        Rule(cel="self.strategy in ['tensor', 'hybrid', 'auto'] || self.tensor == 1",
             message="spec.parallelism.tensor > 1 needs strategy tensor, hybrid or auto",
             check=lambda p: p.strategy in ("tensor", "hybrid", "auto") or p.tensor == 1, field_path=".tensor"),
        Rule(cel="self.strategy in ['pipeline', 'hybrid', 'auto'] || self.pipeline == 1",
             message="spec.parallelism.pipeline > 1 needs strategy pipeline, hybrid or auto",
             check=lambda p: p.strategy in ("pipeline", "hybrid", "auto") or p.pipeline == 1,
             field_path=".pipeline"),
    )

    strategy: Strategy = field("data", doc="data (DDP), fsdp (FSDP2), tensor, pipeline, hybrid (dp x tp x pp) or auto (planner).")
    tensor: int = field(1, minimum=1, doc="Tensor-parallel degree.")
    pipeline: int = field(1, minimum=1, doc="Pipeline-parallel degree (stages).")
    microbatches: int = field(4, minimum=1, doc="Pipeline microbatches per step.")
    schedule: PipelineSchedule = field("1f1b", doc="Pipeline schedule: gpipe or 1f1b.")


@dataclass
class OuterOptimizer:
    """Local SGD's outer step: what the replicas do with their average at each round."""

    name: OuterOptimizerName = field(
        "none", doc="none: every replica takes the average (local SGD). sgd or nesterov: the average's distance "
                    "from the previous round's parameters is an outer gradient, and an SGD step with momentum "
                    "(heavy ball, as SlowMo; or Nesterov, as DiLoCo) on the previous round's parameters gives the "
                    "new ones. Needs spec.sync.algorithm localsgd.")
    lr: float = field(0.7, minimum=0, exclusive_minimum=True,
                      doc="Outer learning rate (sgd, nesterov); 1 with momentum 0 is the plain average.")
    momentum: float = field(0.9, minimum=0, maximum=0.999,
                            doc="Outer momentum (sgd, nesterov). It and the previous round's parameters go on "
                                "through world changes (a newcomer receives them) and checkpoint restarts.")


@dataclass
class Sync:
    """How replicas agree on parameters."""

    __rules__ = (
        Rule(cel="self.fragments == 1 || self.algorithm == 'localsgd'",
             message="spec.sync.fragments > 1 needs spec.sync.algorithm localsgd (fragments split local SGD's "
                     "averaging rounds)",
             check=lambda s: s.fragments == 1 or s.algorithm == "localsgd", field_path=".fragments"),
        Rule(cel="self.fragments <= self.period",
             message="spec.sync.fragments must be at most spec.sync.period (each fragment's round takes a step of "
                     "its own within the period)",
             check=lambda s: s.fragments <= s.period, field_path=".fragments"),
        Rule(cel="self.overlapSteps == 0 || self.algorithm == 'localsgd'",
             message="spec.sync.overlapSteps > 0 needs spec.sync.algorithm localsgd (it delays local SGD's "
                     "averaging rounds)",
             check=lambda s: s.overlap_steps == 0 or s.algorithm == "localsgd", field_path=".overlapSteps"),
        Rule(cel="self.overlapSteps < self.period / self.fragments",
             message="spec.sync.overlapSteps must be less than spec.sync.period / spec.sync.fragments (rounded "
                     "down): a round is applied before the next one is sent, one round in flight at a time",
             check=lambda s: s.overlap_steps < s.period // s.fragments, field_path=".overlapSteps"),
        Rule(cel="self.mixing == 0.0 || self.algorithm == 'localsgd'",
             message="spec.sync.mixing > 0 needs spec.sync.algorithm localsgd (it mixes local SGD's rounds "
                     "into the local parameters)",
             check=lambda s: s.mixing == 0 or s.algorithm == "localsgd", field_path=".mixing"),
    )

    algorithm: SyncAlgorithm = field("allreduce", doc="allreduce (DDP), gossip (decentralised) or localsgd (periodic averaging).")
    topology: Topology = field("ring", doc="Gossip topology: ring, exponential (peers at 2^k) or random (seeded pairs).")
    period: int = field(1, minimum=1, doc="Steps between gossip or local-SGD averaging rounds. When training "
                                         "ends the replicas become one model at once (gossip: their average; "
                                         "localsgd: the next round, outer step included), the one the final "
                                         "evaluation measures and the final checkpoint holds. Between rounds, "
                                         "evaluations and periodic checkpoints are of the replicas' average.")
    warmup_steps: int = field(10, minimum=0,
                              doc="localsgd: steps of fully synchronous SGD (the gradients allreduced every step) "
                                  "before the local steps and averaging rounds begin (post-local SGD's switch "
                                  "point, torch's start_localSGD_iter); 0 starts local at once.")
    outer_optimizer: OuterOptimizer = field(OuterOptimizer, doc="localsgd: the outer step applied to each average "
                                                                "(none: the plain average; nesterov: DiLoCo).")
    fragments: int = field(1, minimum=1,
                           doc="localsgd: the parameters' share each round averages (Streaming DiLoCo's fragments): "
                               "the flat parameter vector in F equal slices, slice f averaged at the steps f x "
                               "period / F into each period, so each slice is still averaged once per period and a "
                               "round sends 1/F of the model. A world's first round averages all of them. At most "
                               "spec.sync.period.")
    overlap_steps: int = field(0, minimum=0,
                               doc="localsgd: inner steps a round's allreduce runs behind training before the "
                                   "parameters take its result (Streaming DiLoCo's overlap, tau): the round's slice "
                                   "is sent at its step and applied this many steps later, so its communication "
                                   "hides behind as many steps of compute. 0 waits for it at once. Less than "
                                   "spec.sync.period / spec.sync.fragments (one round in flight at a time). A round "
                                   "still in flight at a world change is dropped; at the end of training it is "
                                   "applied.")
    mixing: float = field(0.0, minimum=0, maximum=1,
                          doc="localsgd: the share of the rank's own parameters a round's slice keeps when the "
                              "round is applied (Streaming DiLoCo's alpha): slice = (1 - mixing) x the round's "
                              "result + mixing x the local slice. 0 takes the round's result, the replicas' slice "
                              "then identical, and drops the local progress of the overlapSteps in between.")


@dataclass
class Compression:
    """Gradient (or gossip payload) compression."""

    method: CompressionMethod = field("none", doc="Compressor applied to what is communicated.")
    ratio: float = field(0.01, minimum=0, exclusive_minimum=True, maximum=1,
                         doc="Fraction of entries kept by topk, randomk and dgc; for threshold, the payload's "
                             "capacity: at most ceil(ratio x n) entries of a bucket of n travel.")
    collective: CompressionCollective = field(
        "allgather", doc="topk under allreduce: allgather each rank's payload (bytes per rank grow with P); "
        "sparse: a sparse reduce-scatter then an allgather of the summed ranges (SparCML), whose bytes stay "
        "flat in P as far as the ranks' top-k overlap, and never exceed a dense allreduce's; or cyclic: one "
        "rank's top-k indices, the rank cycling from step to step, used by every rank (ScaleCom's CLT-k), a "
        "broadcast of k indices and an allreduce of k values, flat in P whatever the overlap, but each rank "
        "sends the leader's largest entries, not its own (a worse loss on the GPT, docs/benchmarks.md); or "
        "global: the sparse reduce-scatter, then each rank keeps the k/P largest entries of its share of the "
        "sum and they are allgathered (global top-k, as Ok-Topk), flat in P whatever the overlap; what a "
        "rank picked that the sum did not keep waits in its residual (a worse loss on the GPT than allgather "
        "or cyclic, docs/benchmarks.md).")
    per_tensor: bool = field(False, doc="topk and dgc: keep ratio of every gradient tensor's entries rather than of the "
                             "whole DDP bucket (or gossip vector), so a small layer that shares a bucket with a "
                             "large one keeps its share.")
    levels: int = field(256, minimum=2, doc="Quantisation levels for qsgd.")
    chunk_size: int = field(512, minimum=1, doc="Elements that share one scale in qsgd, terngrad, onebit and fp8 (QSGD's "
                            "bucket size d): the error is bounded per chunk, whatever else shares the DDP bucket. "
                            "Each chunk's fp32 scale travels (4 bytes; onebit: two, 8 bytes).")
    threshold: float = field(0.001, minimum=0, exclusive_minimum=True,
                             doc="threshold: send the entries with |x| >= threshold (after error feedback), the "
                                 "largest first, up to the capacity that ratio sets.")
    momentum: float = field(0.9, minimum=0, maximum=0.999,
                            doc="dgc: the momentum of its momentum correction; signum: the local momentum beta "
                                "whose sign each rank sends. Both keep the momentum themselves, so they need "
                                "spec.workload.optimizer sgd with momentum 0.")
    rank: int = field(2, minimum=1, doc="PowerSGD approximation rank.")
    error_feedback: bool = field(True, doc="Carry the compression residual into the next step (biased compressors).")


@dataclass
class Checkpoint:
    """Periodic checkpoints with torch.distributed.checkpoint."""

    every_steps: int = field(500, minimum=0, doc="Checkpoint every N steps (0: off unless everySeconds).")
    every_seconds: int = field(0, minimum=0, doc="Checkpoint at least this often, in seconds (0: off).")
    keep: int = field(3, minimum=1, doc="Complete checkpoints kept; older ones are deleted.")
    async_: bool = field(True, doc="Write in the background; training blocks only to stage the state.")
    volume: dict[str, Any] = field({}, free_form=True,
                                   doc="A core/v1 volume source (e.g. persistentVolumeClaim) mounted at path. Empty: emptyDir.")
    path: str = field("/checkpoints", doc="Directory (the volume's mount path) or fsspec URL for checkpoints.")


@dataclass
class FaultTolerance:
    """Restarts of failed workers."""

    max_restarts: int = field(10, minimum=0, doc="Worker replacements after failures before the job fails.")
    backoff_seconds: int = field(10, minimum=0, doc="Initial delay before a failed worker is replaced; doubles each time.")
    max_backoff_seconds: int = field(300, minimum=0, doc="Cap on the exponential backoff.")
    below_min_timeout_seconds: int = field(300, minimum=1, doc="Fail the job after this long with fewer than replicas.min Ready workers.")
    collective_timeout_seconds: float = field(
        0, minimum=0,
        doc="How long a collective of a training step may wait for its peers before the step fails and the "
            "worker reports the failure (a peer that died without closing its connections, or a hung one). "
            "0: automatic, 10 s plus 3x the median step time. A step that takes over half of it logs a warning "
            "naming this field. The first steps of a world and the steps around "
            "an evaluation or a checkpoint save use processGroupTimeoutSeconds instead.")
    process_group_timeout_seconds: int = field(
        60, minimum=1,
        doc="torch.distributed's process group timeout. How long a worker forming a world waits for its peers "
            "and for rank 0's rendezvous store: past it, it reports the members that never arrived, and the "
            "operator replaces those that are hung; a worker whose group has still not formed after twice this "
            "plus 2 s, or this long after a newer world was published (NCCL's communicator init has no bound "
            "of its own), exits, to be replaced. Also how long "
            "a collective may wait outside calm steps: "
            "the first steps of a world (compilation, warm-up), an evaluation, rank 0 saving a checkpoint. "
            "Raise it when those take longer (a worker logs a warning naming this field when a step takes over "
            "half of it); a hung worker is found later.")


@dataclass
class Stragglers:
    """Detection and replacement of slow workers."""

    policy: StragglerPolicy = field("replace", doc="replace: swap a slow worker for a new pod; ignore: only report.")
    threshold: float = field(1.5, minimum=1, exclusive_minimum=True,
                             doc="A worker whose step compute time exceeds threshold x median is a straggler.")
    window_seconds: int = field(60, minimum=1, doc="Window over which compute times are compared.")


@dataclass
class Scheduling:
    """Placement of worker pods."""

    gang: bool = field(False, doc="Schedule all workers all-or-nothing (native gang API, or a PodGroup).")
    scheduler_name: str = field("", doc="Scheduler for worker pods (empty: the default scheduler).")
    priority_class_name: str = field("", doc="PriorityClass of worker pods.")
    node_selector: dict[str, str] = field({}, doc="Node labels the workers must match.")
    tolerations: list[Any] = field([], free_form=True, doc="core/v1 tolerations of worker pods.")
    affinity: dict[str, Any] = field({}, free_form=True, doc="core/v1 affinity of worker pods.")


@dataclass
class RunPolicy:
    """Job-level lifecycle policy."""

    suspend: bool = field(False, doc="Delete the workers and keep the status; false again recreates them.")
    active_deadline_seconds: Optional[int] = field(None, minimum=1, doc="Fail the job (DeadlineExceeded) after this long running.")
    ttl_seconds_after_finished: Optional[int] = field(None, minimum=0, doc="Delete the job this long after it finished.")
    success_policy: SuccessPolicy = field("rank0", doc="rank0: the job succeeds when rank 0 exits 0; all: when every worker does.")


@dataclass
class ResourceClaim:
    """core/v1 ResourceClaim: a dynamic resource claim of the pod, by name, that the worker uses."""

    name: str = field(doc="The name of one entry of the pod's resourceClaims (spec.podTemplate).")
    request: str = field("", doc="One request of that claim; empty: all of them.")


def _one_gpu_at_most(quantities: dict[str, Any]) -> bool:
    q = quantities.get(GPU_RESOURCE)
    return q is None or quantity_value(q) in (0, 1)


def _section_has_one_gpu_at_most(resources: Any, section: str) -> bool:
    return _one_gpu_at_most(getattr(resources, section))


def _one_gpu_cel(section: str) -> str:
    value = f"quantity(string(self.{section}['{GPU_RESOURCE}']))"
    # By value, as the pod API reads an extended resource: 1, 1000m and 1e0 are one GPU. (CEL's isInteger()
    # is false for 1000m and 1.0, whose parsed scale is negative; the pod API accepts them.)
    return (f"!('{GPU_RESOURCE}' in self.{section}) || {value}.compareTo(quantity('0')) == 0 || "
            f"{value}.compareTo(quantity('1')) == 0")


def _one_gpu_message(section: str) -> str:
    return (f"spec.resources.{section}['{GPU_RESOURCE}'] must be 0 or 1: a worker pod runs one trainer process "
            "on one GPU (for more GPUs, raise spec.replicas; several GPUs per pod are not supported yet)")


@dataclass
class Resources:
    """core/v1 ResourceRequirements of each worker: quantities are checked at admission."""

    __rules__ = tuple(
        Rule(cel=_one_gpu_cel(section), message=_one_gpu_message(section),
             check=functools.partial(_section_has_one_gpu_at_most, section=section),
             field_path=f".{section}")
        for section in ("limits", "requests"))

    limits: dict[str, Quantity] = field(
        {}, doc="Most of each resource a worker may use (cpu, memory, nvidia.com/gpu, ...).")
    requests: dict[str, Quantity] = field({}, doc="What a worker is scheduled by; omitted: its limits.")
    claims: list[ResourceClaim] = field([], doc="Dynamic resource claims the worker uses.")
    shm_size: Optional[Quantity] = field(
        None, doc="Size of the memory-backed /dev/shm of a GPU worker (DataLoader workers and NCCL use it; it "
                  "counts against the pod's memory). Unset: the operator's default (Helm value gpu.shmSize). "
                  "Workers without a GPU keep the container runtime's /dev/shm.")


@dataclass
class TemplateMetadata:
    """Labels and annotations added to every worker pod (the job's own labels win)."""

    labels: dict[str, str] = field({}, doc="Labels of every worker pod.")
    annotations: dict[str, str] = field({}, doc="Annotations of every worker pod.")


@dataclass
class TemplateSecurity:
    """The pod securityContext fields a worker may set; the rest of the restricted profile is fixed."""

    run_as_user: Optional[int] = field(None, minimum=1, doc="UID of the trainer (never root).")
    run_as_group: Optional[int] = field(None, minimum=0, doc="GID of the trainer (default: runAsUser).")
    fs_group: Optional[int] = field(None, minimum=0, doc="Group that owns mounted volumes (default: runAsUser).")


@dataclass
class TemplateContainer:
    """What the trainer container takes from the template, added to the contract's env and mounts."""

    __rules__ = (
        Rule(cel=f"self.volumeMounts.all(m, !(m.name in {_cel_list(RESERVED_VOLUMES)}))",
             message=f"{_text(RESERVED_VOLUMES)} are the "
                     "operator's own volumes, which a template may not mount (mount a volume of your own)",
             check=lambda c: not any(m.get("name") in RESERVED_VOLUMES for m in c.volume_mounts),
             field_path=".volumeMounts"),
        Rule(cel=f"self.volumeMounts.all(m, !has(m.mountPath) || !(m.mountPath in {_cel_list(RESERVED_MOUNT_PATHS)}))",
             message=f"{_text(RESERVED_MOUNT_PATHS)} are where "
                     "the operator mounts the job config and the scratch directory (the root file system is "
                     "read-only): mount yours elsewhere",
             check=lambda c: not any(m.get("mountPath") in RESERVED_MOUNT_PATHS for m in c.volume_mounts),
             field_path=".volumeMounts"),
        Rule(cel=f"self.env.all(e, !(e.name in {_cel_list(CONTRACT_ENV)}))",
             message=f"{_text(CONTRACT_ENV)} are the worker contract's "
                     "(docs/contracts.md), which the operator sets in every worker: a template may not set them",
             check=lambda c: not any(e.get("name") in CONTRACT_ENV for e in c.env),
             field_path=".env"),
        Rule(cel="self.volumeMounts.all(m, !has(m.mountPath) || "
                 "self.volumeMounts.exists_one(n, has(n.mountPath) && n.mountPath == m.mountPath))",
             message="two volumeMounts at one mountPath (a pod may mount one volume at a path)",
             check=lambda c: _unique([m["mountPath"] for m in c.volume_mounts if m.get("mountPath") is not None]),
             field_path=".volumeMounts"),
    )

    name: Literal["trainer"] = field("trainer", doc="The container is always named trainer.")
    env: list[Any] = field([], free_form=True, named=True, strings={"name": ENV_NAME_MAX}, max_items=MAX_TEMPLATE_ENV,
                           doc="core/v1 EnvVars added to the contract's, which a template may not set "
                               f"({_text(CONTRACT_ENV)}).")
    volume_mounts: list[Any] = field([], free_form=True, named=True, strings={"mountPath": MOUNT_PATH_MAX},
                                     max_items=MAX_TEMPLATE_ITEMS,
                                     doc="core/v1 VolumeMounts added to the contract's; none may mount one of "
                                         f"the operator's volumes ({_text(RESERVED_VOLUMES)}) or mount at its "
                                         f"paths ({_text(RESERVED_MOUNT_PATHS)}, spec.checkpoint.path).")
    image_pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = field(
        None, doc="core/v1 imagePullPolicy of the trainer image.")


@dataclass
class TemplateSpec:
    """The pod spec fields a worker may take from the template."""

    __rules__ = (
        Rule(cel=f"self.volumes.all(v, !(v.name in {_cel_list(RESERVED_VOLUMES)}))",
             message=f"{_text(RESERVED_VOLUMES)} are the names of the operator's "
                     "own volumes in every worker pod: name yours otherwise",
             check=lambda t: not any(v.get("name") in RESERVED_VOLUMES for v in t.volumes), field_path=".volumes"),
        Rule(cel="self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))",
             message="two volumes by one name (a pod's volume names are unique)",
             check=lambda t: _unique([v["name"] for v in t.volumes]), field_path=".volumes"),
        Rule(cel="self.containers.all(c, c.volumeMounts.all(m, self.volumes.exists(v, v.name == m.name)))",
             message="a volumeMount of spec.podTemplate.spec.containers[0] names no volume of "
                     "spec.podTemplate.spec.volumes (each mount names one; the operator's own are not mountable)",
             check=lambda t: all(m["name"] in {v["name"] for v in t.volumes}
                                 for c in t.containers for m in c.volume_mounts),
             field_path=".containers"),
    )

    service_account_name: str = field("", doc="ServiceAccount of the workers (default: one the operator creates).")
    image_pull_secrets: list[Any] = field([], free_form=True, doc="core/v1 LocalObjectReferences for the image.")
    volumes: list[Any] = field([], free_form=True, named=True, max_items=MAX_TEMPLATE_ITEMS,
                               doc="core/v1 Volumes added to the pod (mount them with volumeMounts); the operator's "
                                   f"own volumes' names ({_text(RESERVED_VOLUMES)}) are taken.")
    security_context: TemplateSecurity = field(TemplateSecurity, doc="UID, GID and fsGroup of the trainer.")
    containers: list[TemplateContainer] = field(
        [], max_items=1, doc="At most one, the trainer container's additions: a worker runs one container.")


@dataclass
class PodTemplate:
    """A PodTemplateSpec fragment merged into every worker. Only these fields are honoured, so any other
    is refused at admission rather than silently dropped."""

    metadata: TemplateMetadata = field(TemplateMetadata, doc="Labels and annotations.")
    spec: TemplateSpec = field(TemplateSpec, doc="ServiceAccount, pull secrets, volumes, security context, env.")


@dataclass(kw_only=True)
class TrainingJobSpec:
    """TrainingJobSpec is the desired state of an elastic training job."""

    __rules__ = (
        Rule(cel="!(self.parallelism.strategy in ['tensor', 'pipeline', 'hybrid']) || "
                 "(self.replicas.min % (self.parallelism.tensor * self.parallelism.pipeline) == 0 && "
                 "self.replicas.max % (self.parallelism.tensor * self.parallelism.pipeline) == 0)",
             message="spec.replicas.min and spec.replicas.max must be multiples of "
                     "spec.parallelism.tensor x spec.parallelism.pipeline",
             check=lambda s: s.parallelism.strategy not in ("tensor", "pipeline", "hybrid") or (
                 s.replicas.min % (s.parallelism.tensor * s.parallelism.pipeline) == 0
                 and s.replicas.max % (s.parallelism.tensor * s.parallelism.pipeline) == 0),
             field_path=".replicas"),
        Rule(cel=_supported_compression_cel(),
             message="spec.compression.method is not supported with this spec.sync.algorithm "
                     f"({_supported_compression_text()})",
             check=lambda s: s.compression.method in SUPPORTED_COMPRESSION[s.sync.algorithm],
             field_path=".compression.method"),
        Rule(cel="self.compression.method == 'none' || self.parallelism.strategy in ['data', 'auto']",
             message="spec.compression.method other than none needs spec.parallelism.strategy data or auto "
                     "(compression hooks act on whole-replica gradients)",
             check=lambda s: s.compression.method == "none" or s.parallelism.strategy in ("data", "auto"),
             field_path=".compression.method"),
        Rule(cel=f"!({_OWN_MOMENTUM_CEL}) || self.workload.optimizer.name == 'sgd'",
             message=_OWN_MOMENTUM_NEEDS + "spec.workload.optimizer.name sgd, since adamw keeps a momentum of its own",
             check=lambda s: s.compression.method not in OWN_MOMENTUM or s.workload.optimizer.name == "sgd",
             field_path=".workload.optimizer.name"),
        Rule(cel=f"!({_OWN_MOMENTUM_CEL}) || self.workload.optimizer.name != 'sgd' "
                 "|| self.workload.optimizer.momentum == 0.0",
             message=_OWN_MOMENTUM_NEEDS + "spec.workload.optimizer.momentum 0",
             check=lambda s: (s.compression.method not in OWN_MOMENTUM or s.workload.optimizer.name != "sgd"
                              or s.workload.optimizer.momentum == 0),
             field_path=".workload.optimizer.momentum"),
        Rule(cel="self.compression.collective == 'allgather' || "
                 "(self.compression.method == 'topk' && self.sync.algorithm == 'allreduce')",
             message="spec.compression.collective sparse, cyclic or global needs spec.compression.method topk and "
                     "spec.sync.algorithm allreduce",
             check=lambda s: s.compression.collective == "allgather" or (
                 s.compression.method == "topk" and s.sync.algorithm == "allreduce"),
             field_path=".compression.collective"),
        Rule(cel="self.workload.precision != 'fp16' || self.parallelism.strategy == 'data'",
             message="spec.workload.precision fp16 needs spec.parallelism.strategy data (its gradient scaler "
                     "unscales whole-replica gradients; sharded strategies take bf16)",
             check=lambda s: s.workload.precision != "fp16" or s.parallelism.strategy == "data",
             field_path=".workload.precision"),
        Rule(cel="self.workload.globalBatchSize == 0 || self.parallelism.strategy == 'data'",
             message="spec.workload.globalBatchSize needs spec.parallelism.strategy data",
             check=lambda s: s.workload.global_batch_size == 0 or s.parallelism.strategy == "data",
             field_path=".workload.globalBatchSize"),
        Rule(cel="self.workload.globalBatchSize == 0 || self.workload.globalBatchSize >= self.replicas.max",
             message="spec.workload.globalBatchSize must be at least spec.replicas.max (a sample per rank)",
             check=lambda s: s.workload.global_batch_size == 0 or s.workload.global_batch_size >= s.replicas.max,
             field_path=".workload.globalBatchSize"),
        Rule(cel="self.checkpoint.path.contains('://') || self.podTemplate.spec.containers.all(c, "
                 "c.volumeMounts.all(m, !has(m.mountPath) || m.mountPath != self.checkpoint.path))",
             message="a volumeMount at spec.checkpoint.path, where the operator mounts the checkpoint volume: give "
                     "your volume as spec.checkpoint.volume instead",
             check=lambda s: "://" in s.checkpoint.path or not any(
                 m.get("mountPath") == s.checkpoint.path for c in s.pod_template.spec.containers for m in c.volume_mounts),
             field_path=".podTemplate.spec.containers"),
        Rule(cel="self.sync.outerOptimizer.name == 'none' || self.sync.algorithm == 'localsgd'",
             message="spec.sync.outerOptimizer.name sgd or nesterov needs spec.sync.algorithm localsgd (the outer "
                     "step acts on local SGD's averages)",
             check=lambda s: s.sync.outer_optimizer.name == "none" or s.sync.algorithm == "localsgd",
             field_path=".sync.outerOptimizer.name"),
        Rule(cel="self.sync.algorithm == 'allreduce' || self.parallelism.strategy == 'data'",
             message="spec.sync.algorithm gossip/localsgd needs spec.parallelism.strategy data",
             check=lambda s: s.sync.algorithm == "allreduce" or s.parallelism.strategy == "data",
             field_path=".sync.algorithm"),
        # A transition rule (oldSelf): only the API server sees both versions, so the Python twin passes.
        Rule(cel="self.managedBy == oldSelf.managedBy",
             message="spec.managedBy is immutable",
             check=lambda s: True,
             field_path=".managedBy"),
    )

    image: str = field("", doc="Trainer image. Empty: the operator's default image.")
    managed_by: str = field("", pattern=MANAGED_BY_PATTERN,
                            pattern_message="spec.managedBy must be empty or a domain-prefixed path "
                                            "such as kueue.x-k8s.io/multikueue",
                            doc="The controller that reconciles this job. Empty or cohort.dev/operator: this "
                                "operator; any other value (for example kueue.x-k8s.io/multikueue) leaves the "
                                "job to that controller, and this operator never touches it. Immutable.")
    workload: Workload = field(doc="What to train: a job must name its model and dataset.")
    replicas: Replicas = field(Replicas, doc="Elastic worker counts.")
    resources: Resources = field(Resources, doc="core/v1 ResourceRequirements of each worker.")
    parallelism: Parallelism = field(Parallelism, doc="Parallelism strategy.")
    sync: Sync = field(Sync, doc="Synchronisation algorithm.")
    compression: Compression = field(Compression, doc="Communication compression.")
    checkpoint: Checkpoint = field(Checkpoint, doc="Checkpointing.")
    fault_tolerance: FaultTolerance = field(FaultTolerance, doc="Failure handling.")
    stragglers: Stragglers = field(Stragglers, doc="Straggler handling.")
    scheduling: Scheduling = field(Scheduling, doc="Pod placement.")
    run_policy: RunPolicy = field(RunPolicy, doc="Lifecycle policy.")
    pod_template: PodTemplate = field(
        PodTemplate,
        doc="core/v1 PodTemplateSpec fragment merged into every worker: metadata labels/annotations, "
            "env, volumes, volumeMounts, imagePullSecrets, serviceAccountName, imagePullPolicy and "
            "runAsUser/runAsGroup/fsGroup; any other field is refused.")


# --- status ------------------------------------------------------------------

@dataclass
class Condition:
    """A Kubernetes-style condition."""

    type: str = field(doc="Condition type, e.g. Ready, Running, Succeeded, Failed.")
    status: Literal["True", "False", "Unknown"] = field(doc="True, False or Unknown.")
    reason: str = field("", doc="One-word CamelCase reason.")
    message: str = field("", doc="Human-readable detail.")
    last_transition_time: str = field("", doc="When status last changed (RFC 3339).")
    observed_generation: int = field(0, doc="The spec generation this condition was computed from.")


@dataclass
class ReplicaStatus:
    """Worker counts as observed."""

    desired: int = field(0, doc="Workers the operator wants in the world.")
    active: int = field(0, doc="Workers in the current world (the scale subresource's status).")
    ready: int = field(0, doc="Worker pods Ready.")
    spares: int = field(0, doc="Standby pods Ready.")
    admitted: Optional[int] = field(None, doc="Workers Kueue admitted (jobs in a Kueue queue only): the job runs "
                                              "min(replicas.target, admitted).")
    summary: str = field("", doc="ready/desired, for kubectl get.")


@dataclass
class WorldStatus:
    """The membership the operator published."""

    version: int = field(0, doc="Increases on every membership change.")
    size: int = field(0, doc="Ranks in the current world.")
    members: list[str] = field([], doc="Member pods in rank order (the full world is in the <job>-world ConfigMap).")
    reason: str = field("", doc="Why the current version was published.")


@dataclass
class Progress:
    """Training progress reported by rank 0."""

    step: int = field(0, doc="Optimizer steps completed.")
    epoch: int = field(0, doc="Current epoch.")
    loss: Optional[float] = field(None, doc="Latest training loss (4 significant digits).")
    samples_per_second: Optional[float] = field(None, doc="Global training throughput.")
    tokens_per_second: Optional[float] = field(None, doc="Global throughput in tokens (language models: samples x "
                                                         "sequence length; other models: samples; 4 significant "
                                                         "digits).")
    mfu: Optional[float] = field(None, doc="Model FLOPs utilisation, 0-1: training FLOP/s over the devices' dense "
                                           "peak; set only when the workers know their device's peak (docs/gpu.md).")
    percent: Optional[float] = field(None, doc="Share of the job's optimizer steps done, 0-100 (100 once it succeeded).")
    eta_seconds: Optional[int] = field(None, doc="Estimated seconds to the last step at the current throughput "
                                                 "and world size.")
    accuracy: Optional[float] = field(None, doc="Latest evaluation accuracy (classification).")
    eval_loss: Optional[float] = field(None, doc="Latest evaluation loss (4 significant digits).")
    perplexity: Optional[float] = field(None, doc="Latest evaluation perplexity (language models; 4 significant "
                                                  "digits).")
    plan: str = field("", doc="The parallelism plan in use (strategy auto says which it chose).")
    updated_at: str = field("", doc="When progress was last read (RFC 3339).")


@dataclass
class CheckpointStatus:
    """The newest committed checkpoint."""

    step: int = field(0, doc="Step of the checkpoint.")
    location: str = field("", doc="Where it is stored.")
    time: str = field("", doc="When it was committed (RFC 3339).")


@dataclass
class DurableCheckpoint(CheckpointStatus):
    """The newest committed checkpoint and what a restart now would cost: for a scheduler choosing whom to preempt."""

    bytes: int = field(0, doc="Size of the checkpoint, every rank's files.")
    restart_cost_seconds: Optional[int] = field(None, doc="The work since this checkpoint (since step 0 when "
                                                           "there is none), in seconds at the current throughput: "
                                                           "what a preemption now would throw away.")


@dataclass
class GoodputSeconds:
    """Seconds of a job's wall time by what they were spent on (docs/monitoring.md, "Goodput")."""

    queued: float = field(0.0, doc="Waiting for admission or quota, or suspended.")
    starting: float = field(0.0, doc="Pods scheduled and started, the trainer's set-up, the first step.")
    training: float = field(0.0, doc="Steps that advanced the model, at the healthy pace.")
    checkpoint: float = field(0.0, doc="The step loop blocked by a save.")
    recovery: float = field(0.0, doc="Detecting a lost worker, re-forming, transferring state, restarting.")
    lost_work: float = field(0.0, doc="Steps computed again after falling back to a checkpoint.")
    straggler: float = field(0.0, doc="Step time beyond the healthy pace while the steps were slowed.")
    evaluation: float = field(0.0, doc="Evaluations.")
    finishing: float = field(0.0, doc="After the last step until the job's final phase.")


@dataclass
class LedgerReading:
    """The trainer's ledger as last read from rank 0 (docs/contracts.md §4): where the next reading's
    differences start."""

    pod: str = field("", doc="The rank-0 pod read.")
    started_at: float = field(0.0, doc="When its trainer process started (Unix seconds).")
    at: float = field(0.0, doc="When the reading was taken (Unix seconds).")
    step: int = field(0, doc="The step it had reached.")
    first_step: Optional[int] = field(None, doc="The step its first step reached (its training counts from there); "
                                                "absent before that step, and from trainers older than the field.")
    steps_run: Optional[int] = field(None, doc="The steps it had run whose time is training's (all but each world's "
                                               "first): those that did not take the job past its high-water step "
                                               "are lost work. Absent from older trainers.")
    seconds: GoodputSeconds = field(GoodputSeconds, doc="Its totals by category.")


@dataclass
class Goodput:
    """Where the job's wall time went, every second in exactly one category."""

    percent: Optional[float] = field(None, doc="Training seconds over wall seconds, 0-100: the job's goodput.")
    wall_seconds: float = field(0.0, doc="Seconds accounted for, from the job's creation.")
    seconds: GoodputSeconds = field(GoodputSeconds, doc="The breakdown.")
    accounted_until: str = field("", doc="The end of the accounted time (RFC 3339, microseconds).")
    high_water_step: int = field(0, doc="The highest step reported: steps up to it computed again are lost work.")
    last_reading: LedgerReading = field(LedgerReading, doc="The trainer's ledger as last read.")


@dataclass
class Replacements:
    """Workers replaced, by reason."""

    failure: int = field(0, doc="Replaced after failing.")
    straggler: int = field(0, doc="Replaced for being slow.")


@dataclass
class TrainingJobStatus:
    """TrainingJobStatus is the observed state of a TrainingJob."""

    phase: Phase = field("Pending", doc="Pending, Running, Recovering, Suspended, Succeeded or Failed.")
    conditions: list[Condition] = field([], doc="Conditions: Ready, Running, Suspended, Succeeded, Failed, "
                                                "GangScheduling, and Admitted for jobs in a Kueue queue.")
    observed_generation: int = field(0, doc="The spec generation last reconciled.")
    replicas: ReplicaStatus = field(ReplicaStatus, doc="Worker counts.")
    selector: str = field("", doc="Label selector of the workers (for the scale subresource / HPA).")
    world: WorldStatus = field(WorldStatus, doc="Published membership.")
    progress: Progress = field(Progress, doc="Training progress.")
    last_checkpoint: CheckpointStatus = field(CheckpointStatus, doc="Newest committed checkpoint.")
    last_durable_checkpoint: DurableCheckpoint = field(DurableCheckpoint, doc="Newest committed checkpoint, its "
                                                       "size and the cost of a restart now (docs/kueue.md).")
    goodput: Goodput = field(Goodput, doc="Where the job's time went, and the share that trained (docs/monitoring.md).")
    restarts: int = field(0, doc="Workers replaced after failures.")
    replacements: Replacements = field(Replacements, doc="Replacements by reason.")
    start_time: str = field("", doc="When the operator started the job (reset on resume); "
                                    "activeDeadlineSeconds counts from here (RFC 3339).")
    completion_time: str = field("", doc="When the job finished (RFC 3339).")
    pod_index: int = field(0, doc="Ordinal of the next worker pod. Persisted before a pod is created, "
                                  "so a restarted operator never reuses a name.")
    retiring: list[str] = field([], doc="Worker pods already counted as failed or replaced, until they are gone "
                                        "(so a restarted operator never counts one twice).")
    backoff_until: str = field("", doc="No failed worker is replaced before this time (RFC 3339).")
    below_min_since: str = field("", doc="Since when fewer than replicas.min workers are Ready (RFC 3339).")
