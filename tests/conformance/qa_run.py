"""Run Triton's own L0 conformance suites (qa/L0_*/test.sh of triton-inference-server/server)
against tritond and print pass/fail/skip per test module.

Each suite in qa_suites.py mirrors its test.sh: the same model repositories (built from the
fetched checkout's generators), the same server flags and environment, one server per test.sh
`run_server`, the same python test cases; what test.sh checks in shell (a log line, a refused
start-up) is recorded as a case of the pseudo-module `test.sh`. Nothing is downloaded.

Usage: python qa_run.py --qa <work copy of qa/> --data <model data dir> --examples <docs
model_repository dir> --results <dir> [--drop MODEL ...] [suite ...]
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNITTEST = HERE / "qa_unittest.py"
PORTS = (8000, 8001, 8002)

# Cases not run here, with why (each is reported as skipped with its reason).
SKIP = {
    "HttpTest.test_loading_large_invalid_model":
        "sends a 2.8 GB request body; the client alone needs over 10 GB of memory",
    "InputShapeTest.test_wrong_input_shape_tensor_size": "TensorRT shape-tensor models (plan_*)",
    "TestHttpAioClient.test_get_model_repository_index":
        "counts 7 models, two of them left out here (densenet_onnx, simple_string_dyna_sequence)",
    "TestGrpcAioClient.test_get_model_repository_index":
        "counts 8 models, two of them left out here (densenet_onnx, simple_string_dyna_sequence)",
}

# Cases that fail here for a reason outside tritond: (why, text the failure must contain). Such a
# failure is recorded as skipped with its reason; any other failure of the case stays a failure.
TRT_RESHAPE = ("after its onnx, libtorch and ensemble models it checks plan (TensorRT) reshape models, not "
               "generated here", "Request for unknown model: 'plan_")
TRT_STATUS = ("checks a plan (TensorRT) model of qa_model_repository, not generated here",
              "Request for unknown model: 'plan_")
TRT_FIRST = ("checks a plan (TensorRT) model, not generated here, before its onnx and libtorch trials",
             "Request for unknown model: 'plan_")
NO_GPU = ("loads KIND_GPU instances, which tritond refuses on a host without GPUs (as it must)",
          "but no GPUs are available")
KNOWN = {
    **{f"TestInstanceUpdate.{n}": NO_GPU
       for n in ("test_gpu_instance_update", "test_gpu_cpu_instance_update", "test_instance_name_update",
                 "test_instance_signature", "test_direct_scheduler_update_with_ongoing_sequences",
                 "test_oldest_scheduler_update_with_ongoing_sequences")},
    "ClientNonInferTimeoutTest.test_grpc_register_cuda_shared_memory":
        ("creates a CUDA shared-memory region in the client, which needs a GPU on this host",
         "unable to create cuda shared memory handle"),
    **{f"InferVariableTest.{n}": TRT_FIRST
       for n in ("test_class_fff", "test_class_iii", "test_mix_iii", "test_raw_fff", "test_raw_iii")},
    "ServerMetadataTest.test_model_latest_infer": TRT_STATUS,
    "ServerMetadataTest.test_model_specific_infer":
        ("its last trial asks whether plan_float32_float32_float32 (TensorRT, not generated here) is ready; the "
         "libtorch and onnx trials before it passed", "False is not true"),
    "ModelMetadataTest.test_model_versions_added": TRT_STATUS,
    "ServerMetadataTest.test_basic":
        ("expects the cuda_shared_memory extension, which tritond lists only on a host with a GPU",
         "'cuda_shared_memory' not found"),
    "ModelMetadataTest.test_infer_stats_no_model":
        ("counts the ready versions of Triton's whole qa_model_repository (144, with its plan, openvino "
         "and other models); the one generated here holds fewer", "expected 144 infer stats"),
    "InferReshapeTest.test_ff2": TRT_RESHAPE,
    "InferReshapeTest.test_ff4": TRT_RESHAPE,
    "IterativeSequenceTest.test_reschedule_error":
        ("expects the sequence aborted 200 ms (max_sequence_idle_microseconds) after its request arrived while the "
         "model still runs it, as Triton counts a sequence with nothing queued as idle; tritond keeps a sequence "
         "whose request executes", "InferenceServerException not raised"),
    "OutputNameValidationTest.test_grpc":
        ("its last trial needs plan_nobatch_zero_1_float32 (TensorRT, not generated here); the libtorch "
         "and onnx trials before it passed", "'plan_nobatch_zero_1_float32' is not found"),
}


def _port_busy(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def _last_error(log: str) -> str:
    """The server log's last error line, for a start-up that failed."""
    lines = [ln for ln in log.splitlines() if ln.startswith("E") or "error" in ln.lower()]
    return (lines[-1] if lines else (log.strip().splitlines() or [""])[-1])[:300]


class Server:
    """One `tritond` started with a test.sh SERVER_ARGS line; stdout+stderr go to its log."""

    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc = proc
        self.log = log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, timeout: float = 120.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


class QA:
    """What the suites use: start servers, run test modules, record results."""

    def __init__(self, qa: Path, data: Path, examples: Path, results: Path, drop: list[str],
                 tritond: list[str]) -> None:
        self.qa, self.data, self.examples, self.results = qa, data, examples, results
        self.drop = drop
        self.tritond = tritond
        self.records: list[dict] = []
        self.suite = ""
        self.jsonl = results / "cases.jsonl"
        self.last_start_error = ""
        self.current: Server | None = None
        self.server_timeout = 120.0

    # ------------------------------------------------------------------ results
    def record(self, module: str, case: str, status: str, detail: str = "") -> None:
        rec = {"suite": self.suite, "module": module, "case": case, "status": status, "detail": detail}
        self.records.append(rec)
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        if status not in ("pass", "skip"):
            print(f"    {status.upper()}: {module} {case}: {detail.strip().splitlines()[-1] if detail.strip() else ''}",
                  flush=True)

    # ------------------------------------------------------------------ repositories
    def prune(self, repo: Path) -> None:
        """Leave out the models named by --drop (each listed once in the summary)."""
        for entry in list(repo.iterdir()) if repo.is_dir() else []:
            if any(fnmatch.fnmatch(entry.name, pat) for pat in self.drop):
                shutil.rmtree(entry)

    # ------------------------------------------------------------------ servers
    def start(self, cwd: Path, args: str, log: str, env: dict[str, str] | None = None,
              timeout: float | None = None, wait: str = "ready", free_ports: bool = True) -> Server | None:
        """Start like util.sh's run_server: wait until /v2/health/<wait> answers 200, else None.
        wait="none" is run_server_nowait followed by test.sh's sleep of `timeout` seconds. The
        default timeout is --server-timeout (util.sh's 30 s is short for a loaded 2-core host)."""
        timeout = self.server_timeout if timeout is None else timeout
        for port in PORTS if free_ports else ():
            deadline = time.monotonic() + 60
            while _port_busy(port) and time.monotonic() < deadline:
                time.sleep(0.5)
            if _port_busy(port):
                raise SystemExit(f"port {port} is in use: the qa tests need 8000-8002 free")
        for token in args.split():
            if token.startswith("--model-repository="):
                self.prune((cwd / token.split("=", 1)[1]).resolve())
        path = self.results / f"{self.suite}.{log}"
        out = open(path, "w")
        full_env = dict(os.environ, **(env or {}))
        print(f"  === {self.suite}: tritond {args}" + (f"  [{' '.join(f'{k}={v}' for k, v in env.items())}]" if env else ""),
              flush=True)
        proc = subprocess.Popen(self.tritond + args.split(), cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                env=full_env, start_new_session=True)
        out.close()
        server = Server(proc, path)
        self.current = server
        if wait == "none":
            time.sleep(timeout)
            if proc.poll() is None:
                return server
            self.last_start_error = _last_error(server.text())
            return None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                self.last_start_error = _last_error(server.text())
                return None
            if _status(f"http://localhost:8000/v2/health/{wait}") == 200:
                return server
            time.sleep(0.5)
        server.stop()
        self.last_start_error = f"not {wait} within {timeout:g}s; " + _last_error(server.text())
        return None

    def refused(self, cwd: Path, args: str, log: str, expect: str, case: str, timeout: float = 30.0) -> None:
        """A start-up test.sh expects to fail, with `expect` in the server's log."""
        server = self.start(cwd, args, log, timeout=timeout)
        text = (self.results / f"{self.suite}.{log}").read_text(errors="replace")
        if server is not None:
            server.stop()
            self.record("test.sh", case, "fail", "server started, expected it to refuse")
        elif expect not in text:
            self.record("test.sh", case, "fail", f"log lacks '{expect}': {text[-600:]}")
        else:
            self.record("test.sh", case, "pass")

    # ------------------------------------------------------------------ test modules
    def unittest(self, cwd: Path, module: str, names: list[str] | tuple[str, ...] = (), variant: str = "",
                 env: dict[str, str] | None = None, server: Server | None = None, timeout: float = 1800,
                 runner: Path = UNITTEST) -> None:
        """Run `python3 <module> [names]` from `cwd` (the suite's directory), one record per case;
        `runner` is qa_unittest.py or a script that prepares something and then runs it.

        With server None (it did not start) every named case is an error naming the start-up."""
        tmp = self.results / "tmp.jsonl"
        tmp.unlink(missing_ok=True)
        label = variant
        if server is None:
            for name in names or [module]:
                self.record(module, name + (f"[{variant}]" if variant else ""), "error",
                            f"server did not start: {self.last_start_error}")
            return
        cmd = [sys.executable, str(runner), str(tmp), label, module, *names]
        env = dict(env or {}, QA_SKIP=json.dumps(SKIP))
        log = self.results / f"{self.suite}.client.log"
        with open(log, "a") as out:
            out.write(f"\n=== {module} {' '.join(names)} {variant}\n")
            out.flush()
            try:
                subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout,
                               env=dict(os.environ, **env))
            except subprocess.TimeoutExpired:
                pass
        seen = set()
        if tmp.exists():
            for line in tmp.read_text().splitlines():
                r = json.loads(line)
                seen.add(r["case"])
                status, detail = r["status"], r["detail"]
                why, sign = KNOWN.get(r["case"], ("", None))
                if status in ("fail", "error") and sign is not None and sign in detail:
                    status, detail = "skip", why
                self.record(module, r["case"] + (f"[{variant}]" if variant else ""), status, detail)
        for name in names:
            if not any(s == name or s.startswith(name + ".") or s.endswith("." + name) for s in seen):
                self.record(module, name + (f"[{variant}]" if variant else ""), "error", "no result (timeout or crash)")
        if not names and not seen:
            self.record(module, module + (f"[{variant}]" if variant else ""), "error",
                        f"no result (timeout after {timeout:g}s or crash)")

    def check(self, case: str, ok: bool, detail: str = "") -> None:
        self.record("test.sh", case, "pass" if ok else "fail", "" if ok else detail)

    # ------------------------------------------------------------------ summary
    def summary(self) -> int:
        table: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for r in self.records:
            status = "fail" if r["status"] == "error" else r["status"]
            table[(r["suite"], r["module"])][status] += 1
        print("\n{:<22} {:<34} {:>5} {:>5} {:>5}".format("suite", "module", "pass", "fail", "skip"))
        totals = defaultdict(int)
        for (suite, module), counts in sorted(table.items()):
            print("{:<22} {:<34} {:>5} {:>5} {:>5}".format(suite, module, counts["pass"], counts["fail"], counts["skip"]))
            for k, v in counts.items():
                totals[k] += v
        print("{:<22} {:<34} {:>5} {:>5} {:>5}".format("total", "", totals["pass"], totals["fail"], totals["skip"]))
        if self.drop:
            print(f"models left out of every repository (--drop): {', '.join(self.drop)}")
        failed = [r for r in self.records if r["status"] in ("fail", "error")]
        if failed:
            print("\nfailures:")
            for r in failed:
                last = r["detail"].strip().splitlines()[-1] if r["detail"].strip() else ""
                print(f"  {r['suite']} {r['module']} {r['case']}: {last[:220]}")
        return 1 if failed else 0


def main() -> int:
    import qa_suites

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qa", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--examples", type=Path, required=True)
    p.add_argument("--results", type=Path, required=True)
    p.add_argument("--drop", action="append", default=[], help="model name (glob) left out of every repository")
    p.add_argument("--server-timeout", type=float, default=120.0, help="seconds a server may take to be ready")
    p.add_argument("suites", nargs="*", default=list(qa_suites.SUITES))
    args = p.parse_args()
    unknown = [s for s in args.suites if s not in qa_suites.SUITES]
    if unknown:
        p.error(f"unknown suite(s) {unknown}; known: {', '.join(qa_suites.SUITES)}")
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "cases.jsonl").unlink(missing_ok=True)
    tritond = [str(Path(sys.executable).with_name("tritond"))]
    qa = QA(args.qa.resolve(), args.data.resolve(), args.examples.resolve(), args.results.resolve(),
            [d for entry in args.drop for d in entry.split(",") if d], tritond)
    qa.server_timeout = args.server_timeout
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for name in args.suites:
            qa.suite = name
            print(f"\n##### {name}", flush=True)
            qa_suites.SUITES[name](qa)
    finally:
        if qa.current is not None:
            qa.current.stop(timeout=30)
    return qa.summary()


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main())
