"""L0_openai: Triton's own OpenAI frontend tests (`python/openai/tests` of the server checkout,
copied at run time and run unmodified with pytest, as qa/L0_openai/test.sh runs them) against
tritond's OpenAI frontend.

Stand-ins (standins/openai/): `openai_frontend/main.py`, which the tests start as a subprocess
on port 9000, becomes one that execs `tritond start` with the same flags; `tritonserver` is
import-only (the tests and Triton's frontend modules import it), so a test over Triton's
in-process server fails with its message and is recorded skipped. The conftest's fixtures come
from the environment: backend `vllm` (the interface the mock models follow), model `mock_llm`
in a repository of its own (as the vLLM repository holds one model) and a tokenizer directory
built here (tests/chat_tokenizer.py; a Hugging Face id would need a download).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from suites_http import _fresh

STANDINS = Path(__file__).resolve().parent / "standins" / "openai"
TESTS_DIR = Path(__file__).resolve().parent.parent
IN_PROCESS = "Triton's in-process tritonserver API is not available against tritond"
TIMEOUT_S = 3600

NEEDS_LLM = "needs a vLLM or TensorRT-LLM model: "
# (why, text the failure must contain): such a failure is recorded as skipped with its reason.
REASONS = [
    ("builds Triton's in-process server (tritonserver.Server) and a FastAPI TestClient over it; "
     "tritond serves from another process", IN_PROCESS),
    (NEEDS_LLM + "it sends settings (temperature, seed, stop, max_tokens) the mock model has no input for "
     "(mock_llm takes text_input and stream only), and tritond refuses those (400)", "it has no input '"),
    (NEEDS_LLM + "logprobs come from vLLM's logprobs output, which the mock model lacks",
     "does not return logprobs"),
    (NEEDS_LLM + "the mock model answers with its prompt, so no answer leaves the prompt out",
     "assert 'What is machine learning?' not in 'What is machine learning?'"),
    (NEEDS_LLM + "tool_choice 'required' or a named tool needs the engine's guided decoding; tritond refuses "
     "it (400)", "needs guided decoding"),
    (NEEDS_LLM + "it sends tool-call and tool messages for Llama 3.1's chat template, and the tokenizer built "
     "here has a plain one", "the chat template cannot render these messages"),
]
# Failing cases recorded skipped by name: (why, case prefix, text the failure must contain).
KNOWN_CASES = [
    (NEEDS_LLM + "after a load it asks for completions with max_tokens, which the mock model has no input "
     "for (the test's own comment: 'Test Inference with real LLM backend')", "TestModelManagementInference.", ""),
    ("expects Triton core's messages for startup model names that leave the repository ('../../etc' is polled "
     "as the model directory /etc); tritond looks only inside the repository, so it refuses each such name as "
     "not found in any model repository and does not start",
     "TestModelControlCLIOptions.test_explicit_mode_load_invalid_model_name_error",
     "exiting: a model failed to load at startup"),
]
# Cases that test Triton's frontend's own Python code in process (no server): recorded skipped.
OWN_CODE = ("test_restricted_feature_summary_omits_header_values",
            "test_startup_log_does_not_leak_restriction_header_values", "TestContentLengthValidation.")
OWN_CODE_WHY = "a unit test of Triton's frontend's own Python code (its middleware and classes); it reaches no server"
# Modules not run, with why (each case collected is recorded skipped).
NOT_RUN = {
    "test_lora.py": "LoRA adapters of a vLLM or TensorRT-LLM model (a GPU engine and Hugging Face downloads)",
}


def l0_openai(qa) -> None:
    src = qa.qa.parent / "python" / "openai"
    if not (src / "tests").is_dir():
        qa.record("pytest", "python/openai", "skip", "the checkout has no python/openai (run_qa.sh copies it)")
        return
    d = _fresh(qa.qa / "L0_openai")
    work = d / "openai"
    shutil.copytree(src, work)
    shutil.copy(STANDINS / "main.py", work / "openai_frontend" / "main.py")
    env = _environment(d, work)
    xml = qa.results / f"{qa.suite}.junit.xml"
    xml.unlink(missing_ok=True)
    # One event loop for every async test: the tests share a class-scoped AsyncOpenAI client,
    # whose connections belong to the loop that opened them (pytest-asyncio >= 0.24 makes one per test).
    cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           "--timeout=600", "-o", "asyncio_default_test_loop_scope=session", f"--junitxml={xml}", "tests/",
           *[f"--ignore=tests/{m}" for m in NOT_RUN]]
    print(f"  === {qa.suite}: pytest tests/ (TEST_MODEL={env['TEST_MODEL']}, TEST_BACKEND={env['TEST_BACKEND']})",
          flush=True)
    with open(qa.results / f"{qa.suite}.client.log", "w") as out:
        try:
            subprocess.run(cmd, cwd=work, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            qa.record("pytest", "tests/", "error", f"pytest did not finish within {TIMEOUT_S}s")
    if not xml.exists():
        qa.record("pytest", "tests/", "error", "no junit report (pytest crashed)")
        return
    for module, case, status, detail in _cases(xml):
        qa.record(module, case, *_classify(case, status, detail))
    _record_not_run(qa, work, env)


def _environment(d: Path, work: Path) -> dict[str, str]:
    """The conftest's choices, the stand-ins first on the path, `python3` the venv's."""
    sys.path.insert(0, str(TESTS_DIR))
    from chat_tokenizer import write_tokenizer
    tokenizer = write_tokenizer(d / "tokenizer")
    repo = d / "mock_models"
    shutil.copytree(work / "tests" / "test_models" / "mock_llm", repo / "mock_llm")
    bindir = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=f"{bindir}:{os.environ.get('PATH', '')}",
                PYTHONPATH=os.pathsep.join([str(STANDINS), str(work)]),
                TRITOND=str(Path(sys.executable).with_name("tritond")),
                TEST_BACKEND="vllm", TEST_MODEL="mock_llm", TEST_MODEL_REPOSITORY=str(repo),
                TEST_TOKENIZER=str(tokenizer), PYTHONDONTWRITEBYTECODE="1")


def _cases(xml: Path) -> list[tuple[str, str, str, str]]:
    """(module, Class.test[param], status, detail) per case; a case reported twice (a teardown
    error after its call) keeps its worse status."""
    rank = {"pass": 0, "skip": 1, "fail": 2}
    found: dict[tuple[str, str], tuple[str, str]] = {}
    for tc in ET.parse(xml).getroot().iter("testcase"):
        parts = tc.get("classname", "").split(".")
        module = next((p + ".py" for p in parts if p.startswith("test_")), parts[-1] or "pytest")
        cls = parts[-1] if parts and not parts[-1].startswith("test_") else ""
        case = f"{cls}.{tc.get('name')}" if cls else tc.get("name", "")
        status, detail = "pass", ""
        for tag, st in (("failure", "fail"), ("error", "fail"), ("skipped", "skip")):
            el = tc.find(tag)
            if el is not None:
                status, detail = st, f"{el.get('message', '')}\n{el.text or ''}".strip()
                break
        key = (module, case)
        if key not in found or rank[status] > rank[found[key][0]]:
            found[key] = (status, detail)
    return [(m, c, s, d) for (m, c), (s, d) in found.items()]


def _classify(case: str, status: str, detail: str) -> tuple[str, str]:
    """A case's status and detail as recorded: a failure for a known reason outside tritond,
    and a test of Triton's own code, become skips with the reason."""
    if case.startswith(OWN_CODE):
        return "skip", OWN_CODE_WHY
    if status == "fail":
        for why, sign in REASONS:
            if sign in detail:
                return "skip", why
        for why, prefix, sign in KNOWN_CASES:
            if case.startswith(prefix) and sign in detail:
                return "skip", why
    if status == "skip":
        return "skip", detail.splitlines()[0] if detail else "skipped by the test"
    return status, detail


def _record_not_run(qa, work: Path, env: dict[str, str]) -> None:
    """Each case of a module not run, by pytest's own collection, recorded skipped."""
    for module, why in NOT_RUN.items():
        out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                              f"tests/{module}"], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        ids = [ln.split("::", 1)[1].replace("::", ".") for ln in out.stdout.splitlines() if "::" in ln]
        for case in ids or [module]:
            qa.record(module, case, "skip", why)
