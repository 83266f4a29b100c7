"""A forked worker's start pays for nothing it does not use: numpy.random, which numpy loads
lazily and which costs a worker more than the rest of its start, is imported neither to reseed
a template's generators nor to read a config without warmup samples; a template that holds
numpy's generator has it reseeded in each worker."""
from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize("kind", ["python", "onnxruntime"])
def test_a_templates_preload_and_reseed_leave_numpy_random_unimported(kind):
    assert run(f"""
import sys
from tritond.workers import template
template.preload({kind!r})
template._reseed()
print('numpy.random' in sys.modules)
""") == "False"


def test_a_config_without_warmup_samples_does_not_import_numpy_random():
    assert run("""
import sys
from tritond.repository.warmup import warmup_samples
print(warmup_samples({"name": "m", "max_batch_size": 4}, "/nonexistent"), 'numpy.random' in sys.modules)
""") == "[] False"


def test_numpy_random_held_by_the_template_is_reseeded():
    assert run("""
import numpy as np
from tritond.workers import template
np.random.seed(7)
expected = np.random.random()
np.random.seed(7)
template._reseed()
print(np.random.random() != expected)
""") == "True"
