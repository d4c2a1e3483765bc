"""What to train: built-in models and datasets, user entry points, the Workload type.

Import the modules themselves (``workloads.workload``, ``workloads.models``):
this package imports nothing, so ``workloads.defaults`` needs no torch.
"""

# The user entry-point contract: what a "pkg.module:function" in workload.dataset or workload.model is called
# with and must return (Data, DataInfo, the model factory's signature). docs/workloads.md, "The entry-point
# contract", documents every version. 2: Data(train, eval, info, task) with splits (Datasets or tensor
# pairs). 1 (before 2026-11-27): Data(train_x, train_y, eval_x, eval_y, info, task) with four tensors, still
# accepted with a DeprecationWarning until CONTRACT_1_REMOVED_IN.
ENTRY_POINT_CONTRACT = 2
CONTRACT_1_REMOVED_IN = "0.2.0"
