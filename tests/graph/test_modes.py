import pytest

from harness.graph.modes import CUDAGraphMode as M
from harness.graph.modes import parse_mode

# mode: (decode, mixed, separate, has_full, has_piecewise, runtime)
TABLE = {
    M.NONE: (M.NONE, M.NONE, False, False, False, True),
    M.PIECEWISE: (M.PIECEWISE, M.PIECEWISE, False, False, True, True),
    M.FULL: (M.FULL, M.FULL, False, True, False, True),
    M.FULL_DECODE_ONLY: (M.FULL, M.NONE, True, True, False, False),
    M.FULL_AND_PIECEWISE: (M.FULL, M.PIECEWISE, True, True, True, False),
}


@pytest.mark.parametrize("mode", list(M), ids=str)
def test_mode_properties(mode):
    decode, mixed, separate, full, piecewise, runtime = TABLE[mode]
    assert mode.decode_mode() is decode
    assert mode.mixed_mode() is mixed
    assert mode.separate_routine() is separate
    assert mode.has_full_cudagraphs() is full
    assert mode.has_piecewise_cudagraphs() is piecewise
    assert mode.is_runtime_mode() is runtime


def test_values_follow_vllm():
    assert M.FULL_DECODE_ONLY.value == (2, 0)
    assert M.FULL_AND_PIECEWISE.value == (2, 1)


@pytest.mark.parametrize("name", ["full_decode_only", "FULL_DECODE_ONLY", " Full_Decode_Only "])
def test_parse_mode_case_insensitive(name):
    assert parse_mode(name) is M.FULL_DECODE_ONLY


def test_parse_mode_lists_valid_names():
    with pytest.raises(ValueError, match="'fulll'.*NONE, PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE"):
        parse_mode("fulll")


def test_str_is_name():
    assert str(M.FULL_AND_PIECEWISE) == "FULL_AND_PIECEWISE"
