"""`--model-repository s3://host:port/bucket/path` against a local S3 server (moto's standalone
server, started here; never the internet): models are mirrored into the server's private
cache before loading, explicit loads re-read the bucket, credentials come from the usual
files, and a missing bucket is a clear startup error."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TritondServer, free_port, http_get, serving, wait_for, worker_title

boto3 = pytest.importorskip("boto3", reason="boto3 comes with moto[server] (scripts/setup.sh --test)")
pytest.importorskip("s3fs", reason="s3fs is installed by scripts/setup.sh --test")

BUCKET = "models-bucket"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A local S3 server and a client for it; the credentials live in an AWS credentials file."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def answering() -> bool:
            assert proc.poll() is None, "the moto server exited"
            return http_get(f"http://127.0.0.1:{port}/", 1.0)[0] != 0
        wait_for(answering, 30, "the moto server to answer")
        creds = tmp_path_factory.mktemp("aws") / "credentials"
        creds.write_text("[default]\naws_access_key_id = tritond-test\naws_secret_access_key = tritond-secret\n")
        env = {"AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_DEFAULT_REGION": "us-east-1"}
        client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                              aws_access_key_id="tritond-test", aws_secret_access_key="tritond-secret")
        client.create_bucket(Bucket=BUCKET)
        yield port, client, env
    finally:
        proc.terminate()
        proc.wait(10)


def upload(client, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local).as_posix()}")


def infer_identity(server: TritondServer, model: str, values: list[float]) -> np.ndarray:
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("INPUT0", [len(values)], "FP32")
    x.set_data_from_numpy(np.array(values, np.float32))
    return client.infer(model, [x]).as_numpy("OUTPUT0")


def model_dirs(server: TritondServer) -> list[str]:
    """The local directories the workers loaded their models from."""
    return [worker_title(pid)["dir"] for pid in server.worker_pids()]


def test_serve_from_s3_with_credentials_file(s3, example_repo):
    port, client, env = s3
    upload(client, example_repo / "identity_fp32", "repo-a/identity_fp32")
    upload(client, example_repo / "mlp_onnx", "repo-a/mlp_onnx")
    client.put_object(Bucket=BUCKET, Key="repo-a/README.txt", Body=b"not a model")
    with serving(TritondServer(f"s3://127.0.0.1:{port}/{BUCKET}/repo-a", env=env)) as s:
        np.testing.assert_array_equal(infer_identity(s, "identity_fp32", [1, 2, 3]), [1, 2, 3])
        mlp = httpclient.InferenceServerClient(s.http_url)
        meta = mlp.get_model_metadata("mlp_onnx")
        width = int(meta["inputs"][0]["shape"][1])
        x = httpclient.InferInput(meta["inputs"][0]["name"], [1, width], "FP32")
        x.set_data_from_numpy(np.ones((1, width), np.float32))
        assert mlp.infer("mlp_onnx", [x]).as_numpy(meta["outputs"][0]["name"]).shape[0] == 1
        # The mirror is private (0700 from the cache root down) and inside the run directory.
        dirs = model_dirs(s)
        assert dirs and all("/tritond-" in d and "/model-cache/" in d for d in dirs), dirs
        cache = dirs[0].split("/model-cache/")[0] + "/model-cache"
        for d in [cache, os.path.dirname(dirs[0]), dirs[0]]:
            assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert not os.path.exists(cache)


def test_explicit_load_reads_the_bucket_again(s3, example_repo, tmp_path):
    port, client, env = s3
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    config = (example_repo / "identity_fp32" / "config.pbtxt").read_text().replace("identity_fp32", "m")
    (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.py").write_text((example_repo / "identity_fp32" / "1" / "model.py").read_text())
    upload(client, model, "repo-b/m")
    with serving(TritondServer(f"s3://127.0.0.1:{port}/{BUCKET}/repo-b", ["--model-control-mode=explicit"],
                               env=env)) as s:
        c = httpclient.InferenceServerClient(s.http_url)
        assert not c.is_model_ready("m")
        c.load_model("m")
        assert c.get_model_metadata("m")["versions"] == ["1"]
        np.testing.assert_array_equal(infer_identity(s, "m", [4, 5]), [4, 5])

        # Version 2 appears in the bucket, version 1 goes: the next load serves version 2 only
        # and the mirror no longer holds version 1.
        (model / "2").mkdir()
        (model / "2" / "model.py").write_text((model / "1" / "model.py").read_text())
        upload(client, model / "2", "repo-b/m/2")
        client.delete_object(Bucket=BUCKET, Key="repo-b/m/1/model.py")
        c.unload_model("m")
        c.load_model("m")
        assert c.get_model_metadata("m")["versions"] == ["2"]
        np.testing.assert_array_equal(infer_identity(s, "m", [6]), [6])
        [mirror] = {d for d in model_dirs(s)}
        assert sorted(os.listdir(mirror)) == ["2", "config.pbtxt"], os.listdir(mirror)

        # A model that is not in the bucket: Triton's error, the server stays up.
        with pytest.raises(InferenceServerException, match="failed to poll from model repository"):
            c.load_model("absent")
        assert c.is_server_live()


def test_missing_bucket_fails_startup_with_the_reason(s3):
    port, _, env = s3
    s = TritondServer(f"s3://127.0.0.1:{port}/no-such-bucket/models", env=env)
    s.start(wait="exit")
    assert s.returncode == 1, s.log
    assert "model repository 's3://127.0.0.1:" in s.log and "/no-such-bucket/models' does not exist" in s.log, s.log
    s.assert_clean()


def test_missing_package_or_bad_url_is_a_usage_error():
    s = TritondServer("s3://").start(wait="exit")
    assert s.returncode == 1 and "names no bucket" in s.log, s.log
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed here; the missing-package message cannot be seen")
    except ImportError:
        pass
    s = TritondServer("gs://bucket/models").start(wait="exit")
    assert s.returncode == 1 and "needs the 'gcsfs' package: pip install 'tritond[gcs]'" in s.log, s.log
