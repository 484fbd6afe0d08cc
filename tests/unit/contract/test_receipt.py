import pytest
from hypothesis import given
from hypothesis import strategies as st

from popgate_contract.errors import InvalidReceiptHandle
from popgate_contract.receipt import ReceiptHandle, broker_of

names = st.from_regex(r"[%a-zA-Z0-9_-]{1,40}", fullmatch=True)
handles = st.builds(
    ReceiptHandle,
    broker=names,
    topic=names,
    queue_id=st.integers(0, 1000),
    offset=st.integers(0, 2**62),
    attempt=st.integers(1, 100),
    token=st.integers(0, 2**48 - 1),
    invisible_until_ms=st.integers(0, 2**50),
)


@given(handles)
def test_round_trip(handle: ReceiptHandle) -> None:
    assert ReceiptHandle.decode(handle.encode()) == handle
    assert broker_of(handle.encode()) == handle.broker


@given(st.text(max_size=300))
def test_garbage_is_a_clear_error_never_a_crash(text: str) -> None:
    try:
        ReceiptHandle.decode(text)
    except InvalidReceiptHandle as exc:
        assert "receipt handle" in str(exc)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1~b~t~0~0~1~ff",
        "2~b~t~0~0~1~ff~5",
        "1~b~t~x~0~1~ff~5",
        "1~b~t~0~0~0~ff~5",
        "1~b~t~-1~0~1~ff~5",
        "1~b~t~0~0~1~zz~5",
        "x" * 5000,
    ],
)
def test_malformed_handles(text: str) -> None:
    with pytest.raises(InvalidReceiptHandle):
        ReceiptHandle.decode(text)
