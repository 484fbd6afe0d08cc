"""The v2 signature checker and permissions: pure, no sockets (proxy/auth.py, proxy/v2/access.py)."""

from __future__ import annotations

import calendar
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from popgate_pb.v2 import definition_pb2 as v2
from popgate_pb.v2 import service_pb2 as pb

from popgate_contract.broker_token import TOKEN_KEY, token_ok
from popgate_contract.codes import code_of
from popgate_contract.errors import Forbidden, Unauthorized
from proxy import auth, server, settings
from proxy.auth import Account, Authenticator
from proxy.v2 import access

NOW = calendar.timegm((2026, 11, 21, 7, 0, 0, 0, 0, 0))  # 2026-11-21T07:00:00Z
ALICE = Account("alice", "alice-s3cret-0123", publish=("orders", "log-*"), subscribe=("orders",), groups=("billing",))


def date_at(epoch: float) -> str:
    return time.strftime(auth.DATE_FORMAT, time.gmtime(epoch))


def headers(ak: str = "alice", sk: str = "alice-s3cret-0123", *, at: float = NOW) -> dict[str, str]:
    date = date_at(at)
    return {"authorization": auth.authorization(ak, sk, date), auth.DATE_HEADER: date}


def checker(skew_s: float = 300.0) -> Authenticator:
    return Authenticator([ALICE], skew_s=skew_s, clock=lambda: NOW)


def test_signature_is_the_official_clients_lower_case_hex_hmac_sha1() -> None:
    value = "MQv2-HMAC-SHA1 Credential=alice, SignedHeaders=x-mq-date-time, Signature=9c78ab"
    assert auth.parse_authorization(value) == ("alice", "9c78ab")
    sig = auth.sign("alice-s3cret-0123", "20261121T070000Z")
    assert len(sig) == 40 and sig == sig.lower()


def test_valid_signature_returns_the_account_and_upper_case_hex_is_accepted() -> None:
    assert checker().authenticate(headers()) is ALICE
    h = headers()
    sig = auth.sign("alice-s3cret-0123", h[auth.DATE_HEADER])
    h["authorization"] = h["authorization"].replace(sig, sig.upper())
    assert checker().authenticate(h) is ALICE


@pytest.mark.parametrize(
    "meta",
    [
        {},  # no header at all
        {"authorization": "Basic abc", auth.DATE_HEADER: date_at(NOW)},
        {"authorization": "MQv2-HMAC-SHA1 Credential=alice", auth.DATE_HEADER: date_at(NOW)},
        headers(sk="wrong"),
        headers(ak="mallory"),
        headers(ak="mallory", sk=""),
        {"authorization": headers()["authorization"]},  # date header missing
        {**headers(), auth.DATE_HEADER: "yesterday"},  # signed date differs from the one sent
        {**headers(), "authorization": headers()["authorization"].rsplit("=", 1)[0] + "=é"},  # non-ASCII
        {**headers(), "authorization": headers()["authorization"].rsplit("=", 1)[0] + "=\ufffd"},  # byte 0xff
    ],
)
def test_missing_malformed_wrong_or_unknown_credentials_are_unauthorized(meta: dict[str, str]) -> None:
    with pytest.raises(Unauthorized) as caught:
        checker().authenticate(meta)
    assert code_of(caught.value) == v2.UNAUTHORIZED == 40100


def test_a_garbled_date_that_is_signed_is_unauthorized_not_a_crash() -> None:
    meta = {
        "authorization": auth.authorization("alice", "alice-s3cret-0123", "not-a-date"),
        auth.DATE_HEADER: "not-a-date",
    }
    with pytest.raises(Unauthorized, match="YYYYMMDD"):
        checker().authenticate(meta)


@pytest.mark.parametrize(
    "zone_s",
    [0, 3600, -3600, 8 * 3600, 14 * 3600, -12 * 3600, 5 * 3600 + 1800, 5 * 3600 + 2700, -(9 * 3600 + 1800)],
)
@pytest.mark.parametrize("drift_s", [0, 299, -299])
def test_local_time_suffixed_z_is_fresh_in_any_real_time_zone_within_the_skew(zone_s: int, drift_s: int) -> None:
    # The official client sends datetime.now() (local) with a Z: UTC+8 looks 8 h in the future.
    assert checker().authenticate(headers(at=NOW + zone_s + drift_s)) is ALICE


@pytest.mark.parametrize(
    "offset_s",
    [
        301,  # UTC host, clock 5 min off
        -301,
        3600 + 450,  # 7.5 minutes off every real zone (UTC+1:00 and UTC+1:15)
        14 * 3600 + 301,  # beyond the easternmost zone
        -12 * 3600 - 301,  # beyond the westernmost zone
        2 * 24 * 3600,  # a replayed date from days ago / ahead
        -2 * 24 * 3600,
    ],
)
def test_stale_or_off_zone_dates_are_unauthorized(offset_s: int) -> None:
    with pytest.raises(Unauthorized, match="too far"):
        checker().authenticate(headers(at=NOW + offset_s))


def test_fresh_is_within_skew_of_a_quarter_hour_zone() -> None:
    assert auth.fresh(0, 1) and auth.fresh(900, 1) and not auth.fresh(450, 300)
    assert auth.fresh(450, 450)  # a skew of 7.5 min or more accepts anything between UTC-12 and UTC+14
    assert not auth.fresh(14 * 3600 + 60, 30)


def test_no_accounts_means_open_even_with_the_clients_empty_credentials_header() -> None:
    open_auth = Authenticator([])
    assert not open_auth.enabled
    assert open_auth.authenticate({}) is None
    assert access.check(open_auth, [("authorization", "garbage")], pb.SendMessageRequest()) == ""
    assert access.check(open_auth, [], pb.HeartbeatRequest(group=v2.Resource(name="any"))) == ""


def send(*topics: str) -> pb.SendMessageRequest:
    return pb.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name=t)) for t in topics])


def receive(topic: str, group: str) -> pb.ReceiveMessageRequest:
    return pb.ReceiveMessageRequest(
        group=v2.Resource(name=group), message_queue=v2.MessageQueue(topic=v2.Resource(name=topic))
    )


@pytest.mark.parametrize(
    "request_",
    [
        send("orders"),
        send("log-a", "log-b"),
        receive("orders", "billing"),
        pb.AckMessageRequest(group=v2.Resource(name="billing"), topic=v2.Resource(name="orders")),
        pb.ChangeInvisibleDurationRequest(group=v2.Resource(name="billing"), topic=v2.Resource(name="orders")),
        pb.EndTransactionRequest(topic=v2.Resource(name="orders")),
        pb.RecallMessageRequest(topic=v2.Resource(name="log-x")),
        pb.QueryRouteRequest(topic=v2.Resource(name="anything")),  # route: a valid key is enough
        pb.HeartbeatRequest(),  # a producer's: no group
        pb.HeartbeatRequest(group=v2.Resource(name="billing")),
        pb.NotifyClientTerminationRequest(),
        pb.NotifyClientTerminationRequest(group=v2.Resource(name="billing")),
        None,  # Telemetry
    ],
)
def test_permitted_requests_pass(request_: object) -> None:
    assert access.check(checker(), list(headers().items()), request_) == "alice"  # whose client ids it names


@pytest.mark.parametrize(
    "request_",
    [
        send("payments"),
        send("orders", "payments"),  # one forbidden topic in a batch refuses the batch
        receive("log-a", "billing"),  # may publish, not subscribe
        receive("orders", "other-group"),
        pb.AckMessageRequest(group=v2.Resource(name="other"), topic=v2.Resource(name="orders")),
        pb.ForwardMessageToDeadLetterQueueRequest(group=v2.Resource(name="billing"), topic=v2.Resource(name="x")),
        pb.EndTransactionRequest(topic=v2.Resource(name="payments")),  # commits and recalls need publish
        pb.RecallMessageRequest(topic=v2.Resource(name="payments")),
        pb.HeartbeatRequest(group=v2.Resource(name="other-group")),  # a consumer's heartbeat: the group's rights
        pb.NotifyClientTerminationRequest(group=v2.Resource(name="other-group")),
    ],
)
def test_requests_beyond_the_accounts_permissions_are_forbidden(request_: object) -> None:
    with pytest.raises(Forbidden) as caught:
        access.check(checker(), list(headers().items()), request_)
    assert code_of(caught.value) == v2.FORBIDDEN == 40300


def test_metadata_values_may_be_bytes_and_keys_any_case() -> None:
    meta = [(k.upper(), v.encode()) for k, v in headers().items()]
    access.check(checker(), meta, send("orders"))


def test_patterns() -> None:
    assert auth.matches(["*"], "x") and auth.matches(["a-*"], "a-b") and auth.matches(["a"], "a")
    assert not auth.matches(["a-*"], "a") and not auth.matches([], "a") and not auth.matches(["ab"], "a")


def test_a_prefix_pattern_stays_within_its_namespace() -> None:
    """Topics and groups of namespace ``eu`` are stored as ``eu%name``: another account's ``orders-*`` does not reach
    tenant ``orders-eu``'s, and a tenant account is given its names and its groups' dead letters with ``%``."""
    assert not auth.matches(["orders-*"], "orders-eu%payments") and auth.matches(["orders-*"], "orders-eu")
    assert auth.matches(["eu%*"], "eu%payments") and not auth.matches(["eu%*"], "eu2%payments")
    assert auth.matches(["%DLQ%eu%*"], "%DLQ%eu%billing") and not auth.matches(["%DLQ%*"], "%DLQ%eu%billing")
    assert auth.matches(["*"], "eu%payments")


def test_secret_never_in_repr() -> None:
    assert "alice-s3cret-0123" not in repr(ALICE)


def test_acl_tables_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(
        """
broker = ["b1=127.0.0.1:9001"]
auth_skew_s = 120

[[acl]]
access_key = "alice"
secret_key = "alice-s3cret-0123"
publish = ["orders", "log-*"]
subscribe = ["orders"]
groups = ["billing"]

[[acl]]
access_key = "ops"
secret_key = "ops-t0ken-0123456"
subscribe = ["*"]
groups = "*"
admin = true
"""
    )
    loaded = settings.load(["--config", str(config)], env={})
    assert loaded.accounts == (ALICE, Account("ops", "ops-t0ken-0123456", subscribe=("*",), groups=("*",), admin=True))
    assert not ALICE.admin
    assert loaded.auth_skew_s == 120
    assert settings.load(["--broker", "b1=127.0.0.1:9001"], env={}).accounts == ()


def test_a_proxy_that_requires_authentication_refuses_to_start_without_accounts(tmp_path: Path) -> None:
    """`auth = "required"` (the prod overlay's POPGATE_AUTH) refuses a config file whose [[acl]] tables were all
    emptied or commented out, rather than starting an open proxy; the default, `auto`, serves open without accounts
    (`make run`), which the proxy logs at start (tests/integration/sdk/test_up.py)."""
    config = tmp_path / "acl.toml"
    emptied = 'broker = ["b1=127.0.0.1:9001"]\nbroker_token = "broker-secret"\n# [[acl]] tables go here\n'
    config.write_text(emptied)
    for env in ({"POPGATE_CONFIG": str(config), "POPGATE_AUTH": "required"}, {"POPGATE_AUTH": "required"}):
        with pytest.raises(settings.SettingsError, match=r"AUTH required: no \[\[acl\]\] accounts in the config"):
            settings.load(["--broker", "b1=127.0.0.1:9001"], env=env)
    assert settings.load([], env={"POPGATE_CONFIG": str(config)}).accounts == ()  # auto: open
    config.write_text(emptied + '[[acl]]\naccess_key = "a"\nsecret_key = "s-0123456789abcdef"\n')
    required = settings.load(["--auth", "required"], env={"POPGATE_CONFIG": str(config)})
    assert [a.access_key for a in required.accounts] == ["a"]
    with pytest.raises(settings.SettingsError, match="--auth 'off': choose one of auto, required"):
        settings.load(["--auth", "off", "--broker", "b1=127.0.0.1:9001"], env={})


@pytest.mark.parametrize(
    "acl",
    [
        '[[acl]]\naccess_key = "a"\n',  # no secret
        '[[acl]]\naccess_key = "a"\nsecret_key = "s-0123456789abcdef"\npublish = [1]\n',
        '[[acl]]\naccess_key = "a"\nsecret_key = "s-0123456789abcdef"\npublsh = ["t"]\n',
        '[[acl]]\naccess_key = "a"\nsecret_key = "s-0123456789abcdef"\n'
        '[[acl]]\naccess_key = "a"\nsecret_key = "t-0123456789abcdef"\n',
        '[[acl]]\naccess_key = "a"\nsecret_key = "s-0123456789abcdef"\nadmin = "yes"\n',
    ],
)
def test_bad_acl_tables_are_settings_errors(tmp_path: Path, acl: str) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('broker = ["b1=127.0.0.1:9001"]\n' + acl)
    with pytest.raises(settings.SettingsError, match="acl"):
        settings.load(["--config", str(config)], env={})


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ("REPLACE-WITH-A-RANDOM-SECRET", "a placeholder"),  # acl.example.toml's, copied unedited
        ("REPLACE-ME-0123456789", "a placeholder"),
        ("orders-secret", "shorter than 16 characters"),
    ],
)
def test_a_placeholder_or_short_secret_is_refused_naming_the_key_not_the_secret(
    tmp_path: Path, secret: str, why: str
) -> None:
    config = tmp_path / "acl.toml"
    config.write_text(
        f'broker = ["b1=127.0.0.1:9001"]\n[[acl]]\naccess_key = "orders-service"\nsecret_key = "{secret}"\n'
    )
    with pytest.raises(settings.SettingsError) as refused:
        settings.load(["--config", str(config)], env={})
    assert str(refused.value) == (
        f"--config {config}: acl[0]: the secret_key of access key orders-service is {why}: give it a random secret"
    )
    assert secret not in str(refused.value)


def test_broker_token_check() -> None:
    assert token_ok([(TOKEN_KEY, "t")], "t") and token_ok([(TOKEN_KEY, b"t")], "t")
    assert not token_ok([(TOKEN_KEY, "u")], "t") and not token_ok([], "t") and not token_ok(None, "t")


@given(header=st.text(max_size=200), date=st.text(max_size=40))
@hsettings(max_examples=300, deadline=None)
def test_any_header_and_date_is_an_account_or_unauthorized_never_a_crash(header: str, date: str) -> None:
    signed = {
        "authorization": auth.authorization("alice", "alice-s3cret-0123", date),
        auth.DATE_HEADER: date,
    }  # reaches the date
    for meta in (
        {"authorization": header, auth.DATE_HEADER: date},
        {"authorization": "MQv2-HMAC-SHA1 " + header},
        signed,
    ):
        try:
            checker().authenticate(meta)
        except Unauthorized:
            pass


def test_a_producer_gets_checks_only_of_topics_it_may_publish_to() -> None:
    """Transaction checks carry half messages' bodies: a Telemetry producer registers only for topics its account
    may publish to (proxy.v2.telemetry._published)."""
    from proxy.v2.telemetry import _published

    settings = v2.Settings(
        publishing=v2.Publishing(topics=[v2.Resource(name=t) for t in ("orders", "payments", "log-1")])
    )
    may = access.publishable(checker(), list(headers().items()))
    assert _published(settings, may) == ["orders", "log-1"]
    anyone = access.publishable(Authenticator([]), [])
    assert _published(settings, anyone) == ["orders", "payments", "log-1"]
    with pytest.raises(Unauthorized):
        access.publishable(checker(), [])


def test_verified_headers_are_kept_only_while_their_date_is_fresh() -> None:
    """The same signed headers again are the same account (kept, no second HMAC) while their date is fresh; once it
    is not they are refused as before, and headers that failed are never kept."""
    now = [float(NOW)]
    checker = Authenticator([ALICE], skew_s=300.0, clock=lambda: now[0])
    signed = headers()
    assert checker.authenticate(signed) is ALICE
    assert checker.authenticate(dict(signed)) is ALICE
    assert len(checker._verified) == 1
    now[0] += 301
    with pytest.raises(Unauthorized, match="too far"):
        checker.authenticate(signed)
    forged = {**signed, "authorization": signed["authorization"][:-4] + "0000"}
    now[0] = NOW
    with pytest.raises(Unauthorized, match="bad signature"):
        checker.authenticate(forged)
    assert len(checker._verified) == 1
    for padding in range(50):  # the same signature, padded with fields the check ignores: the same one kept
        padded = {**signed, "authorization": f"{signed['authorization']}, P{padding}={'x' * 1000}"}
        assert checker.authenticate(padded) is ALICE
    assert len(checker._verified) == 1


def test_a_call_refused_at_its_headers_stays_refused_when_its_date_turns_fresh() -> None:
    """A date 301 s ahead of the proxy's clock is refused at the call's headers; the metadata its handler sees
    refuses it with the same reason a moment later, when that date has turned fresh, instead of serving the empty
    request the server gave the handler. A call that verifies is heard as usual."""
    now = [float(NOW)]
    checker = Authenticator([ALICE], skew_s=300.0, clock=lambda: now[0])
    unverified = server._unverified(checker)
    assert unverified is not None
    path = "/apache.rocketmq.v2.MessagingService/QueryRoute"
    early = tuple(headers(at=NOW + 301).items())
    told = unverified(path, early)
    assert told is not None
    now[0] += 2
    assert checker.authenticate(dict(early)) is ALICE  # fresh by now
    with pytest.raises(Unauthorized, match="too far from the proxy's clock"):
        checker.authenticate(access.metadata_of(told))
    assert unverified(path, tuple(headers(at=now[0]).items())) is None
    own = {**headers(at=now[0]), auth.REFUSED_KEY: "a client's own"}  # a plain str: not the proxy's refusal
    assert unverified(path, tuple(own.items())) is None and checker.authenticate(own) is ALICE
    assert unverified("/grpc.health.v1.Health/Check", ()) is None  # needs no credentials
    assert unverified("/apache.rocketmq.v2.MessagingService/ChangeInvisibleDuration", ()) is None  # echoes the request


def test_verified_headers_kept_are_bounded() -> None:
    checker = Authenticator([ALICE], skew_s=3600.0, clock=lambda: NOW)
    for second in range(auth.VERIFIED_KEPT + 10):
        assert checker.authenticate(headers(at=NOW - second)) is ALICE
    assert len(checker._verified) <= auth.VERIFIED_KEPT
