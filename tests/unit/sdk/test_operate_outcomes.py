"""What `popgate group|topic ...` says of a broker whose answer it did not get: one that refused the change did not
make it ("NOT on"), one whose call ended unanswered may have ("not known whether applied"), and a refusal is not
called a broker that "did not answer"."""

from __future__ import annotations

import argparse

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate.cli.admin import BROKERS_MISSING
from popgate.cli.fanout import Fanned
from popgate.cli.fanout import finish as finish_operation


def finish(failures: dict[str, str], unknown: set[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    args = argparse.Namespace(json=False, parser=argparse.Namespace(prog="popgate"), timeout=3.0)
    fanned = Fanned([bpb.DeleteTopicResponse(broker="b1", existed=True)], failures, unknown)
    code = finish_operation(args, fanned, {}, ["b1: deleted"], change=True)
    return code, capsys.readouterr().err


def test_a_broker_that_refused_is_named_so_and_not_applied_there(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = finish({"b2": "RESOURCE_EXHAUSTED: topic t is being deleted on broker b2"}, set(), capsys)
    assert code == BROKERS_MISSING
    assert "broker b2 refused it: RESOURCE_EXHAUSTED: topic t is being deleted" in err and "did not answer" not in err
    assert "applied on b1 only, NOT on b2" in err


def test_a_call_cut_short_may_have_applied_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = finish({"b2": "UNAVAILABLE: broker b2 is unavailable: Cancelling all calls"}, {"b2"}, capsys)
    assert code == BROKERS_MISSING
    assert "broker b2 did not answer" in err and "NOT on" not in err
    assert "not known whether applied on b2: its call ended without an answer" in err and "safe to repeat" in err


def test_a_broker_past_the_timeout_is_told_to_try_a_longer_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = finish({"b2": "DEADLINE_EXCEEDED: broker b2 did not answer in time"}, {"b2"}, capsys)
    assert code == BROKERS_MISSING
    assert "not known whether applied on b2: no answer within --timeout (3 s)" in err and "NOT on" not in err


def test_a_broker_not_reached_did_not_answer_and_did_not_apply_it(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = finish({"b2": "UNAVAILABLE: failed to connect to all addresses"}, set(), capsys)
    assert code == BROKERS_MISSING
    assert "broker b2 did not answer" in err and "NOT on b2" in err
