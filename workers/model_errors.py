"""A Python model's exception in the words of Triton's python backend stub (pybind11's text of
the exception): its type and message, then "At:" and the model's frames, innermost first. The
client and the server log read the same text, so a model's author sees what failed and where."""
from __future__ import annotations

import os
import sysconfig
import traceback

import tritond
import tritond.workers

# The server's own code, wherever each package lies (an editable install maps them apart).
_SERVER_CODE = tuple(os.path.dirname(p.__file__) + os.sep for p in (tritond, tritond.workers)) + (
    sysconfig.get_paths()["stdlib"] + os.sep,)


class ModelError(Exception):
    """A model hook failed; the text is already in Triton's form (the cause keeps the original)."""


def describe(exc: BaseException) -> str:
    """`<Type>: <message>` and the frames from the model's own code inward (the server's frames
    that called into the model left out, as the stub's C++ frames are absent from Triton's)."""
    text = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    start = next((i for i, f in enumerate(frames) if not f.filename.startswith(_SERVER_CODE)), len(frames))
    frames = frames[start:]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text
