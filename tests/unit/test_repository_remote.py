"""Remote repository URLs and the incremental, confined mirroring of a model."""
from __future__ import annotations

import os

import fsspec
import pytest

from tritond.repository import remote
from tritond.repository.remote import RemoteError, is_remote, parse


def test_triton_url_forms():
    assert parse("s3://bucket/path/to/repo").root == "bucket/path/to/repo"
    assert parse("s3://bucket/path").options == ()
    loc = parse("s3://minio.local:9000/bucket/models")
    assert loc.root == "bucket/models"
    assert dict(loc.options) == {"client_kwargs": {"endpoint_url": "http://minio.local:9000"}}
    loc = parse("s3://https://minio.local:9443/bucket/models/")
    assert loc.root == "bucket/models" and dict(loc.options)["client_kwargs"]["endpoint_url"] == "https://minio.local:9443"
    assert parse("gs://bucket/models").protocol == "gcs"
    loc = parse("as://account/container/models")
    assert (loc.protocol, loc.root, dict(loc.options)["account_name"]) == ("abfs", "container/models", "account")
    assert is_remote("s3://b/p") and not is_remote("/models") and not is_remote("http://x/y")


@pytest.mark.parametrize("url, why", [
    ("s3://", "names no bucket"),
    ("s3://host:9000/", "names no bucket"),
    ("as:///container", "names no storage account"),
    ("s3://bucket/../etc", "'..' path component"),
    ("ftp://host/models", "expected s3://, gs:// or as://"),
])
def test_malformed_urls(url, why):
    with pytest.raises(RemoteError, match=why):
        parse(url)


def listing(fs, root: str) -> dict:
    return {os.path.relpath(p, root): info for p, info in fs.find(root, detail=True).items()}


def test_mirror_is_incremental_and_prunes(tmp_path):
    src, repo = tmp_path / "bucket" / "m", tmp_path / "cache"
    (src / "1").mkdir(parents=True)
    (src / "config.pbtxt").write_text("name: 'm'")
    (src / "1" / "model.py").write_text("v1")
    fs = fsspec.filesystem("file")
    local = str(repo / "m")
    remote._mirror(fs, str(src), local, str(repo), "m", listing(fs, str(src)), prune=True)
    assert open(os.path.join(local, "1", "model.py")).read() == "v1"
    before = os.stat(os.path.join(local, "config.pbtxt")).st_ino

    (src / "1" / "model.py").write_text("version one")          # changed (size differs)
    (src / "2").mkdir()
    (src / "2" / "model.py").write_text("v2")                   # added
    (src / "config.pbtxt").touch()
    os.utime(src / "config.pbtxt", (1, 1))
    remote._mirror(fs, str(src), local, str(repo), "m", listing(fs, str(src)), prune=True)
    assert open(os.path.join(local, "1", "model.py")).read() == "version one"
    assert open(os.path.join(local, "2", "model.py")).read() == "v2"
    assert os.stat(os.path.join(local, "config.pbtxt")).st_ino != before   # mtime changed: fetched anew

    unchanged = os.stat(os.path.join(local, "2", "model.py")).st_ino
    (src / "1" / "model.py").unlink()
    (src / "1").rmdir()
    remote._mirror(fs, str(src), local, str(repo), "m", listing(fs, str(src)), prune=True)
    assert sorted(os.listdir(local)) == ["2", "config.pbtxt"]               # version 1 is gone
    assert os.stat(os.path.join(local, "2", "model.py")).st_ino == unchanged   # not fetched again
    assert not [n for n in os.listdir(os.path.join(local, "2")) if n.startswith(".part-")]


def test_keys_leaving_the_model_directory_are_refused(tmp_path):
    with pytest.raises(RemoteError, match="not a plain relative path: '1/../../x'"):
        remote._confined(str(tmp_path), "1/../../x", "m")
    with pytest.raises(RemoteError, match="not a plain relative path"):
        remote._confined(str(tmp_path), "/etc/passwd", "m")
    assert remote._confined(str(tmp_path), "1/model.onnx", "m") == str(tmp_path / "1" / "model.onnx")


def test_cache_root_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv(remote.CACHE_ENV, str(tmp_path / "cache"))
    path = remote.repository_cache("s3://bucket/models")
    assert path.startswith(str(tmp_path / "cache"))
    assert os.stat(path).st_mode & 0o777 == 0o700
    assert remote.repository_cache("s3://bucket/other") != path
