#!/bin/sh
# Test worker for --no-python: touches <dir>/<RANK> and says so (the parity tests read both).
set -eu
echo "creating $1/$RANK"
touch "$1/$RANK"
