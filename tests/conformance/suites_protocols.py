"""The protocol suites (TLS for HTTP and gRPC, compression, JSON, query, large payloads, HTTP
fuzzing): each mirrors its qa/L0_*/test.sh for what a client of tritond can observe.

Several of them drive the client repository's example programs (test.sh's `../clients/*.py`,
which Triton's Dockerfile.QA copies from the client build): they are copied at run time from
`QA_CLIENT_REPO`, a triton-inference-server/client work tree or its bare git directory; without
it those cases are skipped. Their C++ twins (`../clients/simple_*_client`) are never run here.
"""
from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from suites_http import _copytree, _fresh, _note

CPP_CLIENT = "a C++ program of the client repository, not built here"
NEEDS_CLIENTS = "needs QA_CLIENT_REPO (the client repository's example programs)"


def _skip(qa, case: str, why: str, module: str = "test.sh") -> None:
    qa.record(module, case, "skip", why)


def _clients(qa) -> Path | None:
    """qa/clients/ with the client repository's python examples, as Dockerfile.QA puts them."""
    src = os.environ.get("QA_CLIENT_REPO", "")
    if not src:
        return None
    dest = _fresh(qa.qa / "clients")
    examples = Path(src) / "src" / "python" / "examples"
    if examples.is_dir():
        for f in examples.glob("*.py"):
            shutil.copy(f, dest)
    else:
        archive = subprocess.run(["git", f"--git-dir={src}", "archive", "HEAD", "src/python/examples"],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "--strip-components=3", "-C", str(dest)], input=archive, check=True)
    return dest


def _run(qa, cwd: Path, argv: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run a python program as test.sh does; its output goes to the suite's client log."""
    try:
        r = subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, **(env or {})))
        code, out = r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        code, out = -1, f"timed out after {timeout:g}s: {e.stdout or ''}{e.stderr or ''}"
    with open(qa.results / f"{qa.suite}.client.log", "a") as log:
        log.write(f"\n=== {' '.join(argv)} (exit {code})\n{out}")
    return code, out


def _expect(qa, cwd: Path, case: str, argv: list[str], succeed: bool, server) -> None:
    """A test.sh step that runs a client and checks only whether it succeeded."""
    if server is None:
        qa.record("test.sh", case, "error", f"server did not start: {qa.last_start_error}")
        return
    code, out = _run(qa, cwd, argv)
    qa.check(case, (code == 0) == succeed, f"exit {code}, expected {'success' if succeed else 'failure'}: "
                                           f"{out[-1500:]}")


def _openssl(cwd: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> None:
    """test.sh's openssl steps: a CA, a server and a client key and certificate signed by it
    (CN=localhost, passphrases removed), and client2.* with every word's first letter
    capitalised (a key and certificate that cannot be read)."""
    for f in d.glob("*.key"):
        f.unlink()
    for f in d.glob("*.crt"):
        f.unlink()
    subj = "/C=SP/ST=Spain/L=Valdepenias/O=Test/OU={}/CN={}"
    _openssl(d, "genrsa", "-passout", "pass:1234", "-des3", "-out", "ca.key", "4096")
    _openssl(d, "req", "-passin", "pass:1234", "-new", "-x509", "-days", "365", "-key", "ca.key", "-out", "ca.crt",
             "-subj", subj.format("Test", "Root CA"))
    for who in ("server", "client"):
        _openssl(d, "genrsa", "-passout", "pass:1234", "-des3", "-out", f"{who}.key", "4096")
        _openssl(d, "req", "-passin", "pass:1234", "-new", "-key", f"{who}.key", "-out", f"{who}.csr",
                 "-subj", subj.format(who.capitalize(), "localhost"))
        _openssl(d, "x509", "-req", "-passin", "pass:1234", "-days", "365", "-in", f"{who}.csr", "-CA", "ca.crt",
                 "-CAkey", "ca.key", "-set_serial", "01", "-out", f"{who}.crt")
        _openssl(d, "rsa", "-passin", "pass:1234", "-in", f"{who}.key", "-out", f"{who}.key")
    for ext in ("key", "crt"):
        text = (d / f"client.{ext}").read_text()
        (d / f"client2.{ext}").write_text(re.sub(r"\b(.)", lambda m: m.group(1).upper(), text))


def _wait_https(url: str, context: ssl.SSLContext, server, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and server.proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def _wait_models_stable(timeout: float) -> None:
    """util.sh's wait_for_model_stable: until no model of the repository index is loading."""
    import json
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request("http://localhost:8000/v2/repository/index", data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=5) as r:
                if all(m.get("state") not in ("LOADING", "UNLOADING", None) for m in json.loads(r.read())):
                    return
        except OSError:
            pass
        time.sleep(0.5)


# ====================================================================== L0_https
def l0_https(qa) -> None:
    """test.sh puts nginx on port 443 in front of a plain-HTTP server, with the server
    certificate, and runs the HTTP example clients against https://localhost. tritond serves
    HTTPS itself: here it listens on 443 with that certificate in nginx's place."""
    d = qa.qa / "L0_https"
    models = _fresh(d / "models")
    _copytree(qa.examples / "simple", models / "simple")
    clients = _clients(qa)
    cases = ["ssl_infer", "ssl_infer_insecure", "no_ssl_fail_infer", "ssl_wrong_key"]
    for case in cases:
        _skip(qa, f"{case} (c++)", CPP_CLIENT)
    if clients is None:
        for case in cases:
            for aio in ("", ".aio"):
                _skip(qa, case + aio, NEEDS_CLIENTS)
        return
    _certificates(d)
    print("  (deviation: tritond serves HTTPS on port 443 itself, with the certificate test.sh gives nginx, "
          "in place of nginx proxying to a plain-HTTP port)", flush=True)
    s = qa.start(d, f"--model-repository={models} --http-port=443 --http-use-ssl=true "
                    f"--http-server-cert={d / 'server.crt'} --http-server-key={d / 'server.key'}",
                 "server.log", wait="none", timeout=1)
    context = ssl.create_default_context(cafile=str(d / "ca.crt"))
    if s is not None and not _wait_https("https://localhost:443/v2/health/ready", context, s, qa.server_timeout):
        s.stop()
        qa.last_start_error = "HTTPS not ready on port 443"
        s = None
    secure = ["--ssl", "--key-file", "client.key", "--cert-file", "client.crt", "--ca-certs", "ca.crt"]
    for aio, program in (("", "simple_http_infer_client.py"), (".aio", "simple_http_aio_infer_client.py")):
        client = str(clients / program)
        _expect(qa, d, "ssl_infer" + aio, [client, "-v", "-u", "localhost", *secure], True, s)
        _expect(qa, d, "ssl_infer_insecure" + aio, [client, "-v", "-u", "localhost", "--ssl", "--insecure"], True, s)
        _expect(qa, d, "no_ssl_fail_infer" + aio, [client, "-v", "-u", "localhost"], False, s)
        _expect(qa, d, "ssl_wrong_key" + aio, [client, "-v", "-u", "localhost", "--ssl", "--key-file", "client2.key",
                                               "--cert-file", "client.crt", "--ca-certs", "ca.crt"], False, s)
    if s:
        s.stop()


# ====================================================================== L0_secure_grpc
def l0_secure_grpc(qa) -> None:
    d = qa.qa / "L0_secure_grpc"
    models = _fresh(d / "models")
    _copytree(qa.examples / "simple", models / "simple")
    clients = _clients(qa)
    base = (f"--model-repository={models} --grpc-use-ssl=1 --grpc-server-cert server.crt "
            f"--grpc-server-key server.key --grpc-root-cert ca.crt")
    modes = {"server": " --grpc-use-ssl=1", "mutual": " --grpc-use-ssl-mutual=1",
             "both": " --grpc-use-ssl=1 --grpc-use-ssl-mutual=1"}
    for mode in modes:
        _skip(qa, f"{mode}: ssl_infer (c++)", CPP_CLIENT)
    for mode in ("server", "mutual"):
        _skip(qa, f"{mode}: no_ssl_fail_infer (c++)", CPP_CLIENT)
        _skip(qa, f"{mode}: wrong_ssl_fail_infer (c++)", CPP_CLIENT)
    if clients is None:
        for mode in modes:
            _skip(qa, f"{mode}: ssl_infer", NEEDS_CLIENTS)
        return
    _certificates(d)
    programs = ((str(clients / "simple_grpc_infer_client.py"), ""), (str(clients / "simple_grpc_aio_infer_client.py"),
                                                                     ".aio"))
    good = ["--ssl", "--root-certificates", "ca.crt", "--private-key", "client.key", "--certificate-chain", "client.crt"]
    bad = ["--ssl", "--root-certificates", "ca.crt", "--private-key", "client2.key", "--certificate-chain",
           "client2.crt"]
    for mode, extra in modes.items():
        s = qa.start(d, base + extra, f"{mode}.server.log")
        for client, aio in programs:
            _expect(qa, d, f"{mode}: ssl_infer{aio}", [client, "-v", *good], True, s)
        if s:
            s.stop()
    for mode in ("server", "mutual"):
        s = qa.start(d, base + modes[mode], f"{mode}.fail.server.log")
        for client, aio in programs:
            _expect(qa, d, f"{mode}: no_ssl_fail_infer{aio}", [client, "-v"], False, s)
            _expect(qa, d, f"{mode}: wrong_ssl_fail_infer{aio}", [client, "-v", *bad], False, s)
        if s:
            s.stop()


# ====================================================================== L0_json
def l0_json(qa) -> None:
    _skip(qa, "triton_json_test", "a C++ unit test (gtest) of Triton's JSON library (common repository), which "
                                  "tritond does not use; nothing a client observes")


# ====================================================================== L0_query
def l0_query(qa) -> None:
    _skip(qa, "query_test", "a C++ unit test of the core's output buffer query (TRITONBACKEND_OutputBufferQuery)")
    _skip(qa, "query_e2e.py", "tests the core's output buffer query API through Triton's C++ `query` test backend "
                              "(libtriton_query.so), which has no Python stand-in (a Python model cannot query "
                              "output buffers)", "query_e2e.py")


# ====================================================================== L0_data_compression
def l0_data_compression(qa) -> None:
    d = qa.qa / "L0_data_compression"
    _skip(qa, "data_compressor_test", "a C++ unit test of Triton's data compressor (built with the server); "
                                      "validation.py checks only the files it writes")
    _skip(qa, "validation.py validate_compressed_data", "reads the files data_compressor_test writes")
    models = _fresh(d / "models")
    _copytree(qa.examples / "simple", models / "simple")
    clients = _clients(qa)
    combos = [(req, resp) for req in ("deflate", "gzip", "") for resp in ("deflate", "gzip", "") if req != resp]
    for req, resp in combos:
        _skip(qa, f"simple_http_infer_client (c++) request={req or 'none'} response={resp or 'none'}", CPP_CLIENT)
    if clients is None:
        for req, resp in combos:
            _skip(qa, f"request={req or 'none'} response={resp or 'none'}", NEEDS_CLIENTS)
        return
    s = qa.start(d, f"--model-repository={models}", "server.log")
    for program in ("simple_http_infer_client.py", "simple_http_aio_infer_client.py"):
        for req, resp in combos:
            argv = [str(clients / program), "-v"]
            if req:
                argv += ["--request-compression-algorithm", req]
            if resp:
                argv += ["--response-compression-algorithm", resp]
            _expect(qa, d, f"{program} request={req or 'none'} response={resp or 'none'}", argv, True, s)
    if s:
        s.stop()


# ====================================================================== L0_large_payload
def l0_large_payload(qa) -> None:
    """Not run: each case's setUp alone makes a 3 GiB and a 1.9 GiB FP32 tensor from float64
    random arrays (about 10 GiB at once in the client), then the server holds the 1.9 GiB
    request and its response more than once; this shared 24 GiB host cannot spare that."""
    why = ("needs over 15 GiB at once (the client's setUp alone builds 3 GiB and 1.9 GiB tensors from float64 "
           "arrays, about 10 GiB, before the server holds the 1.9 GiB request and response); not run on this "
           "shared 24 GiB host")
    for target in ("onnx", "libtorch", "python"):
        _skip(qa, f"LargePayLoadTest.test_{target}", why, "large_payload_test.py")
    _skip(qa, "LargePayLoadTest.test_plan", "TensorRT (plan_nobatch_zero_1_float32, not generated here)",
          "large_payload_test.py")


# ====================================================================== L0_io
def l0_io(qa) -> None:
    _skip(qa, "memory_alloc", "every case runs memory_alloc, a C++ program built against Triton's in-process C API "
                              "(tritonserver.h): it starts the server inside itself, which tritond does not offer")


# ====================================================================== L0_backend_bls
def l0_backend_bls(qa) -> None:
    _skip(qa, "bls_client", "builds the backend repository's C++ `bls` example backend with cmake (cloned from "
                            "GitHub) and runs its C++ client; a C++ backend with no Python stand-in here")


# ====================================================================== L0_pytorch_python_runtime
def l0_pytorch_python_runtime(qa) -> None:
    why = ("the PyTorch backend's Python-based runtime (`runtime: \"model.py\"`, pytorch_backend's model.py and its "
           "packed environment, cloned and built by test.sh) over models of Triton's prebuilt /data/inferenceserver "
           "store (resnet50_libtorch, pytorch_model_store), none of which is generated here")
    _skip(qa, "unit_test.py", why, "unit_test.py")
    _skip(qa, "infer.py", why, "infer.py")


# ====================================================================== L0_output_validation
def l0_output_validation(qa) -> None:
    """test.sh serves Triton's prebuilt libtorch_model_store2; the three models its client names
    are made here from the generated libtorch identity model: libtorch_zero_1_float32 itself,
    libtorch_datatype_1_float32 (its config declares OUTPUT__0 TYPE_INT32, the model returns FP32)
    and libtorch_index_1_float32 (its config names OUTPUT__1, the model has one output)."""
    d = qa.qa / "L0_output_validation"
    models = _fresh(d / "models")
    src = qa.data / "qa_identity_model_repository" / "libtorch_zero_1_float32"
    for name in ("libtorch_zero_1_float32", "libtorch_datatype_1_float32", "libtorch_index_1_float32"):
        _copytree(src, models / name)
        cfg = models / name / "config.pbtxt"
        text = cfg.read_text().replace("libtorch_zero_1_float32", name)
        if name == "libtorch_datatype_1_float32":
            head, _, tail = text.partition("output [")
            text = head + "output [" + tail.replace("TYPE_FP32", "TYPE_INT32", 1)
        elif name == "libtorch_index_1_float32":
            text = text.replace("OUTPUT__0", "OUTPUT__1")
        cfg.write_text(text)
    print("  (stand-ins: libtorch_datatype_1_float32 and libtorch_index_1_float32, Triton's prebuilt "
          "libtorch_model_store2 models, made from the generated libtorch identity model)", flush=True)
    s = qa.start(d, f"--model-repository={models} --exit-on-error=false", "server.log", wait="live")
    if s is not None:
        _wait_models_stable(qa.server_timeout)
    qa.unittest(d, "lt_op_val_client.py", server=s)
    if s:
        s.stop()


# ====================================================================== L0_http_fuzz
FUZZ_CASES = int(os.environ.get("QA_FUZZ_CASES", "1000"))    # 0: every single mutation (about 4000 a URL)
FUZZ_TIMEOUT = 3600


def l0_http_fuzz(qa) -> None:
    """fuzztest.py with boofuzz (test.sh pip-installs it in a conda environment; here it must be in
    the venv), one mutation at a time as test.sh's boofuzz 0.3.0 fuzzes (fuzz_bounded.py). Each of
    its 20 URLs gets the first QA_FUZZ_CASES test cases (default 1000, about 8 minutes for all on
    this host; 0: all of them, about 4000 a URL)."""
    d = qa.qa / "L0_http_fuzz"
    try:
        import boofuzz  # noqa: F401
    except ImportError:
        _skip(qa, "FuzzTest.test_failures_from_db", "needs boofuzz in the venv (pip install boofuzz)", "fuzztest.py")
        return
    _fresh(d / "models")
    shutil.rmtree(d / "boofuzz-results", ignore_errors=True)
    if FUZZ_CASES:
        print(f"  (deviation: each URL is fuzzed for boofuzz's first {FUZZ_CASES} test cases, QA_FUZZ_CASES)",
              flush=True)
    s = qa.start(d, f"--model-repository={d / 'models'}", "server.log")
    qa.unittest(d, "fuzztest.py", server=s, env={"QA_FUZZ_CASES": str(FUZZ_CASES)}, timeout=FUZZ_TIMEOUT,
                runner=Path(__file__).resolve().parent / "fuzz_bounded.py")
    if s:
        code = s.stop()
        qa.check("server survives the fuzzing and exits cleanly", code == 0, f"exit {code}")
