#!/usr/bin/env bash
# torchft for bench/recovery.py's third system (a benchmark's dependency, not
# Cohort's): the pinned wheel, which carries torchft's Rust lighthouse, and the
# OpenTelemetry packages it imports, installed with pip --target into the cache
# outside the repo. torch itself comes from the project's venv (--no-deps), so
# torchft runs on the same torch as Cohort (its other dependencies go to deps/).
# Prints the directory; put it and its deps/ on PYTHONPATH.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

DEST=${COHORT_TORCHFT:-$COHORT_CACHE/torchft-$TORCHFT_VERSION}
if [[ ! -f "$DEST/.complete" ]]; then
  VENV=$("$HACK_DIR/venv.sh")
  log "installing torchft $TORCHFT_VERSION into $DEST"
  rm -rf "$DEST"
  "$VENV/bin/pip" install -q --target "$DEST" --no-deps "torchft==$TORCHFT_VERSION" >&2 \
    && "$VENV/bin/pip" install -q --target "$DEST/deps" $TORCHFT_DEPS >&2 \
    || die "pip install of torchft $TORCHFT_VERSION failed (see above)"
  "$VENV/bin/python" - "$DEST" <<'PY' || die "torchft installed but does not import"
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/deps"]
from torchft._torchft import LighthouseServer  # the Rust lighthouse ships in the wheel
import torchft  # noqa: F401
PY
  touch "$DEST/.complete"
fi
echo "$DEST"
