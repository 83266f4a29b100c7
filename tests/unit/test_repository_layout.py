import pytest

from tritond.repository.layout import ModelSource, scan, validate_model_name, version_dirs


def test_scan_lists_every_subdirectory_as_a_model(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "1").mkdir(parents=True)
    (tmp_path / "README.md").write_text("not a model")
    found = scan([str(tmp_path)])
    assert found == {
        "a": ModelSource("a", str(tmp_path / "a"), str(tmp_path)),
        "b": ModelSource("b", str(tmp_path / "b"), str(tmp_path)),
    }


def test_scan_marks_a_name_in_two_repositories_unavailable(tmp_path):
    r1, r2 = tmp_path / "r1", tmp_path / "r2"
    (r1 / "m").mkdir(parents=True)
    (r2 / "m").mkdir(parents=True)
    (r2 / "only2").mkdir()
    found = scan([str(r1), str(r2)])
    assert found["m"].error == "model 'm' appears in multiple repositories"
    assert found["only2"].error == ""


def test_scan_missing_repository_raises(tmp_path):
    with pytest.raises(OSError):
        scan([str(tmp_path / "nope")])


def test_version_dirs_keep_positive_integers_only(tmp_path):
    for name in ("1", "3", "10", "0", "01", "configs", "x2"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    assert version_dirs(str(tmp_path)) == [1, 3, 10]
    assert version_dirs(str(tmp_path / "missing")) == []


@pytest.mark.parametrize(
    "name", ["../etc", "a/../b", "..", "/etc/passwd", "model/", "model/subdir", " ..", ".. ", "."]
)
def test_traversal_names_are_refused(name):
    assert "must not contain path traversal characters" in validate_model_name(name)


@pytest.mark.parametrize("name, shown", [("a\nb", "a\\nb"), ("echo\n", "echo\\n"), ("x\x1by", "x\\x1by"),
                                         ("\rm", "\\rm"), ("a\x7f", "a\\x7f"), ("a\x85b", "a\\x85b")])
def test_control_characters_are_refused(name, shown):
    assert validate_model_name(name) == f"invalid model name '{shown}', model name must not contain control characters"


@pytest.mark.parametrize("name", ["", " ", "\t\n"])
def test_empty_names_are_refused(name):
    assert validate_model_name(name).startswith("Model name cannot be empty")


@pytest.mark.parametrize("name", ["...", "model..1", "simple", "model.onnx", "a-b_c", "a\\b"])
def test_ordinary_names_are_accepted(name):
    assert validate_model_name(name) is None


def test_subdirectories_that_are_not_versions_are_named_as_triton_names_them(tmp_path):
    from tritond.repository.layout import ignored_version_dirs
    for d in ("1", "003", "abc", "0", "configs", "warmup"):
        (tmp_path / d).mkdir()
    assert ignored_version_dirs(str(tmp_path)) == [
        "ignore version directory '003' which contains leading zeros in its directory name",
        "ignore version directory 'abc' which fails to convert to integral number"]
