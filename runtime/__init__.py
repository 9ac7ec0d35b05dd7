"""npu-wizard's runtime: device, process group, AMP, events and checkpoints for DDP jobs."""
