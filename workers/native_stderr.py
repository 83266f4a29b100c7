"""What a framework's native code writes to the process's stderr while it starts (TensorFlow's
absl and oneDNN lines bypass every Python log setting), kept out of the server log: the lines
are captured at the file descriptor and logged as verbose lines, so `--log-verbose` shows them
and a normal start stays clean."""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator

log = logging.getLogger(__name__)


@contextlib.contextmanager
def captured(source: str) -> Iterator[None]:
    """Capture fd 2 for the block; each line then becomes a verbose line naming `source`."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            for line in sink.read().decode(errors="replace").splitlines():
                if line.strip():
                    log.debug("%s: %s", source, line)
