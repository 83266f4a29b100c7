"""The suites qa_run.py knows, in the order it runs them."""
from __future__ import annotations

from suites_http import l0_http, l0_input_validation, l0_shared_memory
from suites_models import l0_batch_input, l0_batcher, l0_infer, l0_lifecycle
from suites_python_backend import l0_backend_python
from suites_sequence import l0_http_generate, l0_sequence_batcher, l0_sequence_batcher_implicit

SUITES = {
    "L0_http": l0_http,
    "L0_input_validation": l0_input_validation,
    "L0_shared_memory": l0_shared_memory,
    "L0_infer": l0_infer,
    "L0_batcher": l0_batcher,
    "L0_batch_input": l0_batch_input,
    "L0_lifecycle": l0_lifecycle,
    "L0_http_generate": l0_http_generate,
    "L0_sequence_batcher": l0_sequence_batcher,
    "L0_sequence_batcher_implicit": l0_sequence_batcher_implicit,
    "L0_backend_python": l0_backend_python,
}
