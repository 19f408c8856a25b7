#!/usr/bin/env bash
# bazel run //tools/bench:nlp -- --peer_src=...   (see nlp.py)
exec /usr/bin/python3 "${RUNFILES_DIR:-$0.runfiles}/accel/tools/bench/nlp.py" "$@"
