#!/usr/bin/env python3
"""Whether a step's inputs changed since it last ran, so a script can skip the step.

    up_to_date.py STAMP PATH...          exit 0 when STAMP holds the digest of PATHs, else 1
    up_to_date.py --write STAMP PATH...  record their digest in STAMP (after the step succeeded)

The digest covers each path's name and, for a file, its bytes; a directory is walked (names
and files, __pycache__ left out); a missing path counts as missing. Standard library only:
it runs before any virtual environment exists.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path


def digest(paths: list[str]) -> str:
    h = hashlib.sha256()
    for top in paths:
        h.update(f"path {top}\n".encode())
        if os.path.isfile(top):
            h.update(Path(top).read_bytes())
            continue
        if not os.path.isdir(top):
            h.update(b"missing\n")
            continue
        for root, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                path = os.path.join(root, name)
                h.update(f"file {os.path.relpath(path, top)}\n".encode())
                h.update(Path(path).read_bytes())
    return h.hexdigest()


def main(argv: list[str]) -> int:
    write = argv[:1] == ["--write"]
    args = argv[1:] if write else argv
    if len(args) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    stamp, paths = Path(args[0]), args[1:]
    if write:
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest(paths) + "\n")
        return 0
    try:
        return 0 if stamp.read_text().strip() == digest(paths) else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
