"""The `popgate` commands that operate a cluster (issue 30, points 2 and 4), on brokers that do not auto-create
topics (the brokers' default outside `popgate up`): `topic create` makes a topic on every broker, a send or
receive of another is TOPIC_NOT_FOUND and leaves no group state; `lookup` finds keys newest first; resets and
deletes refuse without a terminal or --yes (exit 77) and say where they were not applied when a broker is down
(exit 75), safe to run again; a receive waiting on a deleted topic is told TOPIC_NOT_FOUND at once; `--broker`
asks the brokers directly."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from popgate_pb import broker_pb2 as bpb

from popgate import NotFound, Producer, SimpleConsumer
from popgate.cli.admin import BROKERS_MISSING, Broker, fetch_stats
from popgate.cli.cluster import Cluster, ClusterConfig
from popgate.cli.main import main
from popgate.cli.operate import NOT_CONFIRMED
from tests.integration.sdk.conftest import drain
from tests.procs import wait_until


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    config = ClusterConfig(
        brokers=2,
        listen="127.0.0.1:0",
        data_dir=tmp_path_factory.mktemp("strict"),
        proxy_args=("--min-invisible-s", "1", "--broker-timeout-s", "1"),
        # `dlq resend`'s group out of attempts at its first delivery: a letter it leaves must stay in the DLQ
        broker_args=("--group-max-attempts", "popgate-dlq-resend=1"),
        auto_create=False,
    )
    with Cluster(config) as started:
        yield started


def topic_stats(cluster: Cluster, topic: str) -> list[bpb.StatsResponse]:
    brokers = [Broker(name, child.address) for name, child in cluster.brokers.items()]
    return list(fetch_stats(brokers, bpb.StatsRequest(topic=topic), 3.0).values())


def groups_on_brokers(cluster: Cluster, topic: str) -> set[str]:
    return {g.group for a in topic_stats(cluster, topic) for g in a.groups}


def held_requests(cluster: Cluster, topic: str) -> int:
    return sum(a.held_pops + a.held_notifications for a in topic_stats(cluster, topic))


def test_topics_are_created_explicitly_and_unknown_ones_are_not_found(
    strict: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    e = strict.endpoint
    assert main(["topic", "create", "orders", "-e", e, "--queues", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == ["b1: created with 2 queue(s)", "b2: created with 2 queue(s)"]
    assert main(["topic", "create", "orders", "-e", e]) == 0  # again: it exists, its queues kept
    assert "b1: exists with 2 queue(s)" in capsys.readouterr().out
    with Producer(e) as producer, SimpleConsumer(e, "billing", "orders") as consumer:
        producer.send("orders", b"paid")
        assert [m.body for m in drain(consumer, 1)] == [b"paid"]
        with pytest.raises(NotFound):
            producer.send("ordres", b"typo")
    capsys.readouterr()
    assert main(["send", "ordres", "typo", "-e", e]) == 1
    assert "`popgate topic create NAME`, or a typo?" in capsys.readouterr().err
    with SimpleConsumer(e, "typo-group", "ordres") as typo, pytest.raises(NotFound):
        typo.receive(max=1, wait=1)  # not [] for ever
    assert not groups_on_brokers(strict, "ordres")  # and no group state made for it


def test_deleting_what_no_broker_has_says_so(strict: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped name deletes nothing anywhere: said once on stderr besides each broker's line (exit 0: deleting
    again what is gone is harmless)."""
    e = strict.endpoint
    capsys.readouterr()
    assert main(["group", "delete", "no-such-group", "--yes", "-e", e]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == ["b1: had no state of it", "b2: had no state of it"]
    assert "no broker has state of group no-such-group: nothing was deleted" in err
    assert main(["topic", "delete", "no-such-topic", "--yes", "-e", e]) == 0
    assert "no broker has topic no-such-topic: nothing was deleted" in capsys.readouterr().err
    assert main(["topic", "create", "here", "-e", e]) == 0
    capsys.readouterr()
    assert main(["topic", "delete", "here", "--yes", "-e", e]) == 0
    out, err = capsys.readouterr()
    assert "b1: deleted 0 message(s)" in out and "nothing was deleted" not in err


def test_dlq_resends_own_group_is_kept_unless_forced(strict: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    e = strict.endpoint
    capsys.readouterr()
    assert main(["group", "delete", "popgate-dlq-resend", "--yes", "-e", e]) == 2
    assert "its next runs send every letter still in a DLQ again; give --force" in capsys.readouterr().err
    assert main(["group", "delete", "popgate-dlq-resend", "--yes", "--force", "-e", e]) == 0
    assert "b1: had no state of it" in capsys.readouterr().out


def test_lookup_prints_matches_newest_first(strict: Cluster, capsys: pytest.CaptureFixture[str]) -> None:
    e = strict.endpoint
    assert main(["topic", "create", "lookups", "-e", e]) == 0
    with Producer(e) as producer:
        ids = [producer.send("lookups", f"v{i}".encode(), keys=["k"]).message_id for i in range(3)]
    capsys.readouterr()
    assert main(["lookup", "lookups", "--key", "k", "-n", "2", "-e", e, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [m["stored"]["message"]["messageId"] for m in document["messages"]] == ids[::-1][:2]
    assert main(["lookup", "lookups", "--id", ids[0], "--body", "-e", e]) == 0
    out = capsys.readouterr().out
    assert ids[0] in out and "body: b'v0'" in out and "1 message(s)" in out


def test_dangerous_operations_need_confirmation_and_name_a_broker_down(
    strict: Cluster, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    e = strict.endpoint
    assert main(["topic", "create", "risky", "-e", e]) == 0
    with Producer(e) as producer, SimpleConsumer(e, "g", "risky") as consumer:
        for _ in range(4):
            producer.send("risky", b"m")
        drain(consumer, 4)
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["group", "reset", "g", "-t", "risky", "--earliest", "-e", e]) == NOT_CONFIRMED
    assert "give --yes" in capsys.readouterr().err
    assert main(["topic", "delete", "risky", "-e", e]) == NOT_CONFIRMED

    strict.brokers["b2"].signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        argv = ["group", "reset", "g", "-t", "risky", "--earliest", "--yes", "-e", e, "--timeout", "2.5"]
        assert main(argv) == BROKERS_MISSING
        assert time.monotonic() - started >= 2.4  # the proxy waited --timeout for b2, not its own 1 s
        err = capsys.readouterr().err
        # b2 has the reset in its socket, applied once it runs again: not known, not "NOT applied"
        assert "broker b2 did not answer" in err and "not known whether applied on b2" in err
        assert "NOT on" not in err and "safe to repeat" in err
    finally:
        strict.brokers["b2"].signal(signal.SIGCONT)
    assert main(["group", "reset", "g", "-t", "risky", "--earliest", "--yes", "-e", e, "--timeout", "5"]) == 0
    assert "b2: 4 queue(s) at offsets 0, 0, 0, 0" in capsys.readouterr().out  # b2 too, this time
    direct = [arg for name, c in strict.brokers.items() for arg in ("--broker", f"{name}={c.address}")]
    assert main(["group", "delete", "g", "--yes", *direct]) == 0  # a proxy-less emergency: each broker asked
    assert capsys.readouterr().out.splitlines() == ["b1: state on risky deleted", "b2: state on risky deleted"]
    waiting: list[BaseException] = []

    waiter = SimpleConsumer(e, "waiter", "risky")
    drain(waiter, 4)  # what the topic holds: its next receive waits

    def receive() -> None:
        try:
            got = waiter.receive(max=1, wait=15)
            waiting.append(RuntimeError(f"answered {got!r}"))
        except NotFound as exc:
            waiting.append(exc)

    receiver = threading.Thread(target=receive)
    receiver.start()
    assert wait_until(lambda: held_requests(strict, "risky") > 0)  # its receive is held at the brokers
    started = time.monotonic()
    assert main(["topic", "delete", "risky", "--yes", "-e", e]) == 0
    assert "b1: deleted" in capsys.readouterr().out
    receiver.join(20)
    waiter.close()
    assert waiting and isinstance(waiting[0], NotFound), waiting
    assert time.monotonic() - started < 5  # told TOPIC_NOT_FOUND at once, not left waiting 15 s


def test_a_reset_of_a_topic_only_a_broker_down_has_names_that_broker(
    strict: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A topic on no broker that answered may be on one that did not: the reset says to run it again, exit 75."""
    b1 = strict.brokers["b1"]
    direct = ["--broker", f"b1={b1.address}", "--broker", "b2=127.0.0.1:1", "--timeout", "1"]  # b2 down
    capsys.readouterr()
    assert main(["group", "reset", "g", "-t", "only-on-b2", "--earliest", "--yes", *direct]) == BROKERS_MISSING
    err = capsys.readouterr().err
    assert "topic only-on-b2 exists on no broker that answered" in err and "broker b2 did not answer" in err, err
    assert "NOT on b2: run the same command again" in err, err
    assert main(["group", "reset", "g", "-t", "only-on-b2", "--earliest", "--yes", *direct, "--json"]) == 75
    document = json.loads(capsys.readouterr().out)
    assert list(document["failures"]) == ["b2"] and document["answers"] == [{"broker": "b1", "queues": []}], document


def test_dlq_resend_of_a_group_without_dead_letters_on_production_brokers_resends_nothing(
    strict: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Brokers without --auto-create have no %DLQ%<group> before its first letter: nothing to resend, as `dlq list`
    says 0 — but a letter's origin topic that is gone still fails the resend."""
    capsys.readouterr()
    assert main(["dlq", "resend", "no-letters-yet", "-e", strict.endpoint, "--wait", "0"]) == 0
    err = capsys.readouterr().err
    assert "resent 0 message(s) from %DLQ%no-letters-yet: nothing to resend" in err and "topic create" not in err, err
    e = strict.endpoint
    assert main(["topic", "create", "gone", "-e", e]) == 0
    with Producer(e) as producer, SimpleConsumer(e, "left", "gone") as consumer:
        producer.send("gone", b"m")
        consumer.forward_to_dlq(drain(consumer, 1, ack=False)[0])
    assert main(["topic", "delete", "gone", "--yes", "-e", e]) == 0
    capsys.readouterr()
    assert main(["dlq", "resend", "left", "-e", e, "--wait", "0"]) == 1
    assert "TOPIC_NOT_FOUND" in capsys.readouterr().err


def test_dlq_resend_leaves_a_letter_whose_topic_is_gone_and_resends_the_others(
    strict: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """A letter whose origin topic no broker has is left in the DLQ and named, as one without ORIGIN_TOPIC: the
    letters around it are re-sent, and the next run sees it again at once (exit 1 both times), not "nothing to
    resend" with exit 0 while `dlq list` still shows it. The resend group's attempts running out does not move it
    on to that group's own DLQ, out of `dlq list`."""
    e = strict.endpoint
    for topic in ("resend-gone", "resend-kept"):
        assert main(["topic", "create", topic, "-e", e]) == 0
    with Producer(e) as producer:
        gone = producer.send("resend-gone", b"g0").message_id
        producer.send_many("resend-kept", [b"k0", b"k1", b"k2"])
    for topic, count in (("resend-gone", 1), ("resend-kept", 3)):
        with SimpleConsumer(e, "resend-mix", topic) as consumer:
            for message in drain(consumer, count, ack=False):
                consumer.forward_to_dlq(message)
    assert main(["topic", "delete", "resend-gone", "--yes", "-e", e]) == 0
    capsys.readouterr()
    assert main(["dlq", "resend", "resend-mix", "-e", e, "--wait", "0.5"]) == 1
    err = capsys.readouterr().err
    assert "resent 3 message(s) from %DLQ%resend-mix: 3 to resend-kept" in err, err
    assert "1 dead letter(s) left in %DLQ%resend-mix, to resend-gone: TOPIC_NOT_FOUND" in err, err
    with SimpleConsumer(e, "resend-mix", "resend-kept") as consumer:
        assert sorted(m.body for m in drain(consumer, 3)) == [b"k0", b"k1", b"k2"]
    assert main(["dlq", "resend", "resend-mix", "-e", e, "--wait", "0.5"]) == 1  # given back: seen again at once
    err = capsys.readouterr().err
    assert "resent 0 message(s)" in err and "left in %DLQ%resend-mix, to resend-gone: TOPIC_NOT_FOUND" in err, err
    assert main(["dlq", "list", "resend-mix", "-e", e]) == 0
    out = capsys.readouterr().out
    assert "%DLQ%resend-mix: 1 message(s) not yet re-sent (4 stored)" in out and "resend-gone" in out, out
    assert gone in out or "g0" in out, out


def test_dlq_resend_reports_a_proxy_gone_mid_run_within_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The proxy gone at the first re-send of 12 dead letters: the run reports UNAVAILABLE and exits 1 within
    seconds, the letters it could not give back coming back after their invisible time, rather than retrying each
    give-back in full against the dead proxy first (~4 s a letter)."""
    config = ClusterConfig(
        brokers=1,
        listen="127.0.0.1:0",
        data_dir=tmp_path,
        proxy_args=("--min-invisible-s", "1", "--shutdown-grace-s", "0.5"),
        broker_args=("--shutdown-grace-s", "0.5"),
    )
    with Cluster(config) as cluster:
        e = cluster.endpoint
        with Producer(e) as producer:
            producer.send_many("gone-mid-run", [f"m{i}".encode() for i in range(12)])
        with SimpleConsumer(e, "gone-mid-run", "gone-mid-run") as consumer:
            for message in drain(consumer, 12, ack=False):
                consumer.forward_to_dlq(message)
        send_many = Producer.send_many

        def proxy_killed_first(self: Producer, *args: Any, **kwargs: Any) -> Any:
            if cluster.proxies[0].running:
                cluster.proxies[0].kill()
            return send_many(self, *args, **kwargs)

        monkeypatch.setattr(Producer, "send_many", proxy_killed_first)
        capsys.readouterr()
        started = time.monotonic()
        assert main(["dlq", "resend", "gone-mid-run", "-e", e, "--wait", "1", "--quiet"]) == 1
        took = time.monotonic() - started
    assert "UNAVAILABLE" in capsys.readouterr().err
    assert took < 20, took
