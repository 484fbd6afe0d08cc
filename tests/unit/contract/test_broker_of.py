"""`broker_of` reads a receipt handle's broker without decoding a handle spelt as brokers write them: it names the
broker `ReceiptHandle.decode` names, and refuses what it refuses, with the same error."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from popgate_contract import errors
from popgate_contract.receipt import MAX_HANDLE_LEN, ReceiptHandle, broker_of, encode_handle

names = st.text(st.characters(exclude_characters="~"), min_size=1, max_size=40)
numbers = st.integers(0, 2**64)
handles = st.builds(encode_handle, names, names, numbers, numbers, st.integers(1, 2**31), numbers, numbers)
# What a handle's fields may hold when garbled: separators, signs, spaces, other digits and letters.
pieces = st.sampled_from(["~", "0", "1", "9", "-", "+", "_", " ", "\n", "a", "f", "g", "x", "٣", "²", "", "1~b"])


def read(read_broker: object, handle: str) -> tuple[str, str]:
    try:
        return "broker", read_broker(handle)  # type: ignore[operator]
    except errors.InvalidReceiptHandle as exc:
        return "refused", exc.message


def decoded_broker(handle: str) -> str:
    return ReceiptHandle.decode(handle).broker


def same_as_broker_of(handle: str) -> None:
    assert read(broker_of, handle) == read(decoded_broker, handle)


@settings(max_examples=300, deadline=None)
@given(handles)
def test_a_valid_handle_names_the_broker_broker_of_names(handle: str) -> None:
    same_as_broker_of(handle)
    assert read(broker_of, handle)[0] == "broker" or len(handle) > MAX_HANDLE_LEN


@settings(max_examples=1000, deadline=None)
@given(handles, st.lists(st.tuples(st.integers(0, 200), st.integers(0, 3), pieces), min_size=1, max_size=4))
def test_a_garbled_handle_is_refused_as_broker_of_refuses_it(handle: str, edits: list[tuple[int, int, str]]) -> None:
    for at, cut, piece in edits:  # replace `cut` characters at `at` by `piece`
        at %= len(handle) + 1
        handle = handle[:at] + piece + handle[at + cut :]
    same_as_broker_of(handle)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_text_is_read_as_broker_of_reads_it(text: str) -> None:
    same_as_broker_of(text)


def test_handles_at_the_edges_are_read_as_broker_of_reads_them() -> None:
    plain = encode_handle("b1", "t", 0, 5, 1, 0xAB, 1_700_000_000_000)
    for handle in (
        plain,
        "",
        plain.replace("~1~ab~", "~0~ab~"),  # attempt 0
        plain.replace("~1~ab~", "~01~ab~"),
        plain.replace("~1~ab~", "~-1~ab~"),
        plain.replace("~0~5~", "~-0~5~"),  # a number broker_of reads, spelt as no broker writes it
        plain.replace("~0~5~", "~ 0~5~"),
        plain.replace("~0~5~", "~0_0~5~"),
        plain.replace("~ab~", "~0xab~"),
        plain.replace("~ab~", "~-ab~"),
        plain + "\n",
        "2" + plain[1:],
        plain.replace("~b1~", "~~"),
        plain.replace("~t~", "~~"),
        encode_handle("b" * (MAX_HANDLE_LEN - 40), "t", 0, 5, 1, 0xAB, 1_700_000_000_000),
        encode_handle("b" * MAX_HANDLE_LEN, "t", 0, 5, 1, 0xAB, 1_700_000_000_000),
    ):
        same_as_broker_of(handle)
