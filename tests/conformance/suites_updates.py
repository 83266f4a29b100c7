"""L0_model_update: a loaded model's instances added, removed and changed by loading it again
with another config (instance_update_test.py over the model_init_del Python model, which logs
each instance's creation and deletion), once per rate limiter mode, as its test.sh runs it."""
from __future__ import annotations

import shutil

from suites_http import _copytree, _fresh

MODES = {
    "off": "--rate-limit=off",
    "execution_count": "--rate-limit=execution_count",
    "execution_count_with_explicit_resource": "--rate-limit=execution_count --rate-limit-resource=R1:10",
}


def l0_model_update(qa) -> None:
    d = qa.qa / "L0_model_update"
    for mode, rate_limit in MODES.items():
        models = _fresh(d / "models")
        _copytree(qa.qa / "python_models" / "model_init_del", models / "model_init_del")
        (models / "model_init_del" / "1").mkdir()
        shutil.move(models / "model_init_del" / "model.py", models / "model_init_del" / "1" / "model.py")
        env = {"RATE_LIMIT_MODE": mode, "MODEL_LOG_DIR": str(d), "PYTHONDONTWRITEBYTECODE": "True"}
        log = f"rate_limit_{mode}.server.log"
        # the test reads the server log where test.sh writes it
        named = d / f"instance_update_test.{log}"
        named.unlink(missing_ok=True)
        named.symlink_to(qa.results / f"{qa.suite}.{log}")
        server = qa.start(d, f"--model-repository=models --model-control-mode=explicit {rate_limit} --log-verbose=2",
                          log, env=env)
        qa.unittest(d, "instance_update_test.py", variant=mode, env=env, server=server)
        if server is not None:
            server.stop()
        text = (qa.results / f"{qa.suite}.{log}").read_text(errors="replace")
        qa.check(f"no 'Should not print this' [{mode}]", "Should not print this" not in text,
                 "the server log has 'Should not print this'")
