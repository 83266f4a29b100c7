"""The numpy 1.x aliases the qa tests and models use (Triton's qa container pins numpy<2),
restored for numpy 2: on PYTHONPATH for a suite's clients and server, never part of tritond."""
import numpy as _np

for _name, _value in (("NINF", -_np.inf), ("PINF", _np.inf), ("NaN", _np.nan), ("NZERO", -0.0), ("PZERO", 0.0)):
    if _name not in _np.__dict__:
        setattr(_np, _name, _value)
