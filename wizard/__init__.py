"""npu-wizard: render and run DistributedDataParallel projects for Ascend NPUs."""

__version__ = "0.1.0"
