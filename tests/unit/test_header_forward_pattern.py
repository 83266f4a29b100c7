"""The header forward pattern matches as Triton's RE2 PartialMatch of "(?i)" + pattern does,
RE2's mid-pattern flag groups included; reserved names fail the request."""
import pytest

from tritond.frontend.header_forward import HeaderForward, PatternError, compile_pattern
from tritond.wire.errors import TritonError


@pytest.mark.parametrize("pattern, name, matches", [
    ("MY_HEADER.*", "my_header_1", True),
    ("MY_HEADER.*", "x-my_header", True),          # searched anywhere, as PartialMatch
    ("MY_HEADER.*", "header", False),
    ("(?-i)MY_HEADER.*", "my_header_1", False),
    ("(?-i)MY_HEADER.*", "MY_HEADER_1", True),
    ("a(?-i)B|c", "AB", True),                     # the flag holds over the next alternative
    ("a(?-i)B|c", "C", False),
    ("a(?-i)B|c", "ab", False),
    ("(x(?-i)Y)z", "xYZ", True),                   # ... and at its group's end
    ("(x(?-i)Y)z", "xyZ", False),
    ("[(?-i)]A", "ia", True),                      # inside a class it is no flag group
    (r"\(?-i\)A", "(-i)a", True),
    ("", "anything", True),                        # Triton's "(?i)" alone matches every name
])
def test_pattern_matches_as_re2_with_case_insensitive_prefix(pattern, name, matches):
    assert (compile_pattern(pattern).search(name) is not None) is matches


@pytest.mark.parametrize("pattern", ["MY_(HEADER", "(?U)a"])
def test_a_bad_pattern_is_refused(pattern):
    with pytest.raises(PatternError):
        compile_pattern(pattern)


def test_forwarded_parameters_and_reserved_names():
    forward = HeaderForward("^x-")
    assert forward.parameters([("x-a", "1"), ("y", "2"), ("x-b", b"\xc3\xa9")]) == {"x-a": "1", "x-b": "é"}
    for name in ("x-", "x-triton"):
        assert forward.parameters([(name, "v")]) == {name: "v"}
    forward = HeaderForward(".*")
    for name in ("sequence_id", "headers", "triton_grpc_error"):
        with pytest.raises(TritonError, match=f"Header '{name}' is reserved for Triton usage"):
            forward.parameters([(name, "v")])
