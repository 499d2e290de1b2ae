#!/usr/bin/env bash
# npu-job bootstrap, pod step 1: compute this pod's routing-affine node rank.
#
#   bash bootstrap.sh [options]        (the options of: python3 -m npu_job.bootstrap --help)
#
# Writes /tmp/RANK_AFTER_ACC and /tmp/MASTER_INDEX (or $NPU_JOB_OUTPUT_DIR) for the pod command.
# It never breaks the job: when it cannot plan it says why and exits 0 without rank files, so the
# job runs in scheduler order (--strict or NPU_JOB_STRICT=1: exit non-zero instead). It does not
# depend on where it lives: it is installed on PATH and also shipped to pods in a ConfigMap.
# $NPU_JOB_PYTHON picks the interpreter (default: python3 on PATH).
python=${NPU_JOB_PYTHON:-python3}
if ! command -v "${python}" >/dev/null 2>&1; then
    echo "npu-job: error: bootstrap.sh: ${python}: not found; keeping the scheduler order" >&2
    case " $* ${NPU_JOB_STRICT:-} " in *" --strict "*|*" 1 "*|*" true "*|*" yes "*|*" on "*) exit 3 ;; esac
    exit 0
fi
# One interpreter start (the pod-side time budget is tight): this is `python3 -m npu_job.bootstrap
# "$@"` (npu_job/bootstrap/command.py, then run.py), plus a clear message instead of a traceback
# when npu_job is not installed in this image.
exec "${python}" -c '
import gc, os, sys
# The run disables the cyclic GC (npu_job/bootstrap/run.py: its objects are acyclic and the
# process is short); doing it before the imports too spares the passes of the collector over the
# classes and functions they create (~6 M instructions). The process ends with os._exit below.
gc.disable()
try:
    from npu_job.bootstrap import run as bootstrap_run
    from npu_job.bootstrap.command import main
except ImportError as error:
    print("npu-job: error: bootstrap.sh: %s: the npu_job package is not importable (%s); "
          "keeping the scheduler order" % (sys.executable, error), file=sys.stderr)
    strict = "--strict" in sys.argv[1:] or os.environ.get("NPU_JOB_STRICT", "").lower() in ("1", "true", "yes", "on")
    sys.exit(3 if strict else 0)
bootstrap_run.KEEP_UNTIL_EXIT = []  # freed by os._exit below, not object by object
code = main(sys.argv[1:])
# The outputs are on disk (closed and renamed) and nothing else runs after this: skip the
# interpreter teardown, which frees the ~10^6 objects of a big rank table one by one and runs a
# last full GC pass over them (~10 ms at 4096 nodes). Flush what that teardown would have flushed.
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    sys.exit(code)  # e.g. a closed stdout: let the normal exit report it
os._exit(code)
' "$@"
