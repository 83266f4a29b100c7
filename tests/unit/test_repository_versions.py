import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tritond.repository.versions import select_versions


def policy(text):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


@pytest.mark.parametrize(
    "text, available, expected",
    [
        ("", [1, 2, 10], [10]),
        ("version_policy { latest { num_versions: 2 } }", [3, 1, 10, 2], [3, 10]),
        ("version_policy { latest { num_versions: 5 } }", [1, 2], [1, 2]),
        ("version_policy { latest { num_versions: 0 } }", [1, 2], []),
        ("version_policy { all {} }", [2, 1], [1, 2]),
        ("version_policy { specific { versions: [1, 3, 7] } }", [1, 2, 3], [1, 3]),
        ("version_policy { specific { versions: [4] } }", [1, 2], []),
        ("", [], []),
    ],
)
def test_select_versions(text, available, expected):
    assert select_versions(policy(text), available) == expected
