#!/usr/bin/env bash
# npu-job bootstrap, pod step 1: compute this pod's routing-affine node rank.
#
#   bash bootstrap.sh [options]        (the options of: python3 -m npu_job.bootstrap --help)
#
# Writes /tmp/RANK_AFTER_ACC and /tmp/MASTER_INDEX (or $NPU_JOB_OUTPUT_DIR) for the pod command.
# It never breaks the job: when it cannot plan it says why and exits 0 without rank files, so the
# job runs in scheduler order (--strict or NPU_JOB_STRICT=1: exit non-zero instead).
#
# Which npu-job runs, one rule in every pod: the job's bundle when there is one (npu-job.pyz
# beside this script, as npu-job render ships them, or $NPU_JOB_BUNDLE), since every pod of a job
# must run the same planner; else the npu_job package installed in the image (this script is also
# installed on PATH). $NPU_JOB_PYTHON picks the interpreter (default: python3 on PATH).
python=${NPU_JOB_PYTHON:-python3}
strict=
case " $* " in *" --strict "*) strict=1 ;; esac
strict_env=${NPU_JOB_STRICT:-}
strict_env=${strict_env//[[:space:]]/}
case "${strict_env,,}" in # lower case, no blanks: as npu_job.parsing.is_true reads it
    1 | true | yes | on) strict=1 ;;
esac
fail() { # the job keeps the scheduler order, unless --strict
    if [ -n "$strict" ]; then exit "$1"; fi
    exit 0
}
if ! command -v "${python}" >/dev/null 2>&1; then
    echo "npu-job: error: bootstrap.sh: ${python}: not found; keeping the scheduler order" >&2
    fail 3
fi
bundle=${NPU_JOB_BUNDLE:-$(dirname -- "${BASH_SOURCE[0]}")/npu-job.pyz}
if [ -n "${NPU_JOB_BUNDLE:-}" ] || [ -e "$bundle" ]; then
    if [ ! -f "$bundle" ] || [ ! -r "$bundle" ]; then
        echo "npu-job: error: bootstrap.sh: ${bundle}: no readable npu-job bundle; keeping the scheduler order" >&2
        fail 10
    fi
    NPU_JOB_PYTHON=$python sh "$bundle" bootstrap "$@"
    code=$?
    if [ "$code" = 10 ]; then fail 10; fi # the bundle said why: truncated or altered
    exit "$code"
fi
# No bundle: the installed package, in one interpreter start, with a clear message instead of a
# traceback when npu_job is not installed in this image.
exec "${python}" -c '
import gc, sys
gc.disable()  # as pod_main does, but before the imports: no collector passes over what they create
try:
    from npu_job.bootstrap.command import pod_main
except ImportError as error:
    print("npu-job: error: bootstrap.sh: %s: no npu-job bundle beside bootstrap.sh and the npu_job "
          "package is not importable (%s); keeping the scheduler order" % (sys.executable, error),
          file=sys.stderr)
    sys.exit(3 if sys.argv[1] else 0)
pod_main(sys.argv[2:])
' "$strict" "$@"
