"""npu-run: torchrun-compatible launcher with a tiered, coalescing store (imports torch)."""
