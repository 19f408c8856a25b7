#!/usr/bin/env bash
# bazel run -c opt //tools/bench:lm -- --peer_src=...   (see lm.py)
exec /usr/bin/python3 "${RUNFILES_DIR:-$0.runfiles}/accel/tools/bench/lm.py" "$@"
