#!/usr/bin/env bash
# placeholder, replaced by the bootstrap work
exec python3 -m npu_job.bootstrap "$@"
