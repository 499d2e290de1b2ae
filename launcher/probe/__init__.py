"""The probe (``npu-run --probe``): times the job's collective on its own devices under the
scheduler's rank order and the plan's, before the workers start, and decides which one they use.

:mod:`.stats` (pure) owns what the timings mean (nccl-tests' bandwidths, the interleaved
schedule, the decision, the verdict line and ``probe.json``); :mod:`.worker` (edge) is one probe
process, started per device as the workers are.
"""
