"""A client id is printed to operators (`popgate group consumers`): one holding a control character (terminal escape
sequences) is a BadRequest, as grpc's own clients refuse to send it; popgate's HTTP/2 server would pass it on."""

from __future__ import annotations

import pytest

from popgate_contract import errors
from proxy.v2.access import CLIENT_ID, client_id_of


def test_a_client_id_with_a_control_character_is_a_bad_request() -> None:
    assert client_id_of([(CLIENT_ID, "hôte@1@0@abc")]) == "hôte@1@0@abc"
    for text in ("\x1b]0;title\x07x", b"\x1b[2J"):
        with pytest.raises(errors.BadRequest, match="control character"):
            client_id_of([(CLIENT_ID, text)])
