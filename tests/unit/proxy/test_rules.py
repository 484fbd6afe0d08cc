"""Pure rules: §5 validation, the error-code table, settings."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from popgate_pb.v2 import definition_pb2 as v2

import broker
from popgate_contract import errors, trailer
from popgate_contract.codes import CODES, code_of, name_of
from proxy import validate
from proxy.settings import BrokerAddress, Settings, SettingsError, load
from proxy.v2.convert import SendLimits, to_broker


@pytest.mark.parametrize("name", ["", "a" * 128, "bad name", "t.1", "x/y", "orders\n"])
def test_bad_topic_and_group_names_are_refused_with_the_reason(name: str) -> None:
    with pytest.raises(errors.IllegalTopic, match="topic name"):
        validate.topic(name)
    with pytest.raises(errors.IllegalGroup, match="consumer group name"):
        validate.group(name)


def test_good_names_pass_including_percent_and_dlq_topics() -> None:
    assert validate.topic("%RETRY%g-1_x") == "%RETRY%g-1_x"
    assert validate.topic("%DLQ%" + "g" * 127)
    assert validate.group("g" * 127)


def test_tag_filters_normalise_and_refuse_sql_and_garbage() -> None:
    assert validate.tag_filter("") == "*"
    assert validate.tag_filter(" a || b ") == "a||b"
    with pytest.raises(errors.IllegalFilter, match="SQL92"):
        validate.tag_filter("a > 1", is_sql=True)
    assert validate.tag_filter("a || || b||") == "a||b"  # empty parts skipped, as RocketMQ's FilterAPI does
    with pytest.raises(errors.IllegalFilter, match="no tag"):
        validate.tag_filter(" || ")
    with pytest.raises(errors.IllegalFilter, match="invalid tag"):
        validate.tag_filter("a || * || b")


def test_batch_invisible_body_and_delivery_limits_name_the_rule() -> None:
    with pytest.raises(errors.IllegalBatchSize, match=r"1\.\.32"):
        validate.batch_size(33, limit=32)
    with pytest.raises(errors.IllegalInvisibleTime, match="10 s..43200 s"):
        validate.invisible(5, low=10, high=43200)
    with pytest.raises(errors.MessageBodyEmpty):
        validate.body(b"", limit=10)
    with pytest.raises(errors.MessageBodyTooLarge, match="11 bytes; the limit is 10"):
        validate.body(b"x" * 11, limit=10)
    with pytest.raises(errors.IllegalDeliveryTime, match="milliseconds"):
        validate.delivery_time(1_700_000_000_000, now_s=1_700_000_000, max_delay_s=86400)
    assert validate.delivery_time(1_600_000_000, now_s=1_700_000_000, max_delay_s=86400) == 1_600_000_000
    with pytest.raises(errors.IllegalDeliveryTime) as too_late:  # a 2-day delay: seconds, just too far ahead
        validate.delivery_time(1_700_172_800, now_s=1_700_000_000, max_delay_s=86400)
    assert "172800 s ahead; the longest delay is 86400 s" in str(too_late.value)
    assert "milliseconds" not in str(too_late.value)


def test_message_fields_get_their_own_codes() -> None:
    with pytest.raises(errors.IllegalMessageTag):
        validate.tag("a|b")
    with pytest.raises(errors.IllegalMessageKey):
        validate.keys([" "])
    with pytest.raises(errors.IllegalMessageGroup):
        validate.message_group("g" * 65)
    with pytest.raises(errors.MessagePropertiesTooLarge):
        validate.properties({"k": "v" * 20000})
    with pytest.raises(errors.IllegalPropertyKey):
        validate.properties({"": "v"})


def test_a_blank_message_id_is_illegal_message_id_and_an_empty_one_is_left_to_the_broker() -> None:
    """As RocketMQ's proxy ("message id cannot be empty"): a blank id would be every such message's one id."""
    for blank in (" ", "   "):
        with pytest.raises(errors.IllegalMessage, match="blank") as refused:
            validate.message_id(blank)
        assert name_of(code_of(refused.value)) == "ILLEGAL_MESSAGE_ID"
    assert validate.message_id("") == ""  # the broker assigns one
    assert validate.message_id(" a ") == " a "


def test_a_message_group_of_64_bytes_is_refused_as_by_rocketmqs_proxy() -> None:
    """RocketMQ's proxy refuses a message group of maxMessageGroupSize (64) bytes or more."""
    assert validate.message_group("g" * 63) == "g" * 63
    assert validate.message_group("注" * 21) == "注" * 21  # 63 bytes
    for group in ("g" * 64, "注" * 21 + "g"):
        with pytest.raises(errors.IllegalMessageGroup, match="64 bytes"):
            validate.message_group(group)


def sized(tag: str, keys: list[str], properties: dict[str, str]) -> v2.Message:
    message = v2.Message(topic=v2.Resource(name="t"), body=b"x", user_properties=properties)
    message.system_properties.message_id = "01ABC"
    message.system_properties.tag = tag
    message.system_properties.keys.extend(keys)
    return message


def test_the_tag_and_keys_count_toward_the_16_kib_of_properties_as_at_rocketmqs_proxy() -> None:
    """RocketMQ's proxy counts the UTF-8 bytes of the tag, each key and each property key and value against its
    16 KiB (maxUserPropertySize) and refuses more with MESSAGE_PROPERTIES_TOO_LARGE; exactly 16 KiB is taken."""
    limits, keys = SendLimits(max_body_bytes=1024, max_delay_s=86400), ["k" * 256] * 63
    too_large = [
        sized("t" * 256, ["k" * 256] * 64, {"p": "v" * 16000}),
        sized("t", ["k" * 256] * 64, {}),  # no property at all
        sized("t", ["注" * 256] * 22, {}),  # 256 characters a key, 768 bytes
        sized("t" * 255, keys, {"p": "v"}),  # 16,385 bytes
    ]
    for message in too_large:
        with pytest.raises(errors.MessagePropertiesTooLarge, match="tag, keys and user properties take"):
            to_broker(message, limits, now_s=0)
    assert to_broker(sized("t" * 254, keys, {"p": "v"}), limits, now_s=0).tag == "t" * 254  # 16,384 bytes


def test_a_trace_context_may_be_any_text_of_up_to_16_kib_without_a_control_character() -> None:
    """RocketMQ's proxy stores a trace context unchecked, as a property, whose separators are control characters."""
    for text in ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "注" * 5461, *UNICODE_TEXT):
        assert validate.trace_context(text) == text
    for text in ("x" * 16385, "注" * 5462, "a\x01b", "a\nb"):
        with pytest.raises(errors.BadRequest, match="trace context"):
            validate.trace_context(text)


# Separators other than ' ' (NBSP, the ideographic space) and format characters (ZWJ) are ordinary text, as to
# RocketMQ's proxy, which refuses only ISO control characters (C0, DEL, C1) in these fields.
UNICODE_TEXT = ["a\u00a0b", "促销\u3000活动", "\U0001f468\u200d\U0001f469", "line\u2028two", "naïve"]
CONTROLS = ["\x00", "\t", "\n", "\x1f", "\x7f", "\x85", "\x9f"]


@pytest.mark.parametrize("text", UNICODE_TEXT)
def test_unicode_text_other_than_control_characters_is_a_tag_key_message_group_or_property_key(text: str) -> None:
    assert validate.tag(text) == text
    assert validate.tag_filter(f"x || {text}") == f"x||{text}"  # a consumer can select it by its tag
    assert validate.keys([text, f"注文{text}1"]) == [text, f"注文{text}1"]
    assert validate.message_group(text) == text
    assert validate.properties({text: "v"}) == {text: "v"}


@pytest.mark.parametrize("control", CONTROLS)
def test_control_characters_are_refused_in_a_tag_key_message_group_property_key_or_filter(control: str) -> None:
    text = f"a{control}b"
    with pytest.raises(errors.IllegalMessageTag, match="control character"):
        validate.tag(text)
    with pytest.raises(errors.IllegalFilter):
        validate.tag_filter(f"x || {text}")
    with pytest.raises(errors.IllegalMessageKey, match="control character"):
        validate.keys([text])
    with pytest.raises(errors.IllegalMessageGroup, match="control character"):
        validate.message_group(text)
    with pytest.raises(errors.IllegalPropertyKey, match="control character"):
        validate.properties({text: "v"})


def test_every_proxy_error_has_a_row_and_a_specific_code() -> None:
    def subclasses(cls: type[errors.DomainError]) -> list[type[errors.DomainError]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    for cls in subclasses(errors.DomainError):
        assert cls in CODES, f"{cls.__name__} has no row in the code table"
    assert name_of(code_of(errors.InvalidReceiptHandle("x"))) == "INVALID_RECEIPT_HANDLE"
    assert name_of(code_of(errors.MessageBodyTooLarge("x"))) == "MESSAGE_BODY_TOO_LARGE"
    assert name_of(code_of(errors.TooManyRequests("x"))) == "TOO_MANY_REQUESTS"
    assert name_of(code_of(ValueError("bug"))) == "INTERNAL_SERVER_ERROR"
    assert name_of(code_of(errors.NotImplementedRpc("x"))) == "NOT_IMPLEMENTED"


def test_every_broker_error_name_maps_to_the_same_named_proxy_error() -> None:
    for cls in errors.BROKER_ERRORS:
        assert type(trailer.from_broker(cls.__name__, "m", broker="b1")) is cls
    assert isinstance(trailer.from_broker("Strange", "m", broker="b1"), errors.BrokerFailure)
    assert isinstance(trailer.from_broker("DomainError", "m", broker="b1"), errors.BrokerFailure)


def test_every_error_a_broker_raises_is_one_its_trailer_may_name() -> None:
    """A class outside BROKER_ERRORS raised by a broker would reach the client as a BrokerFailure."""
    raised: set[str] = set()
    for path in Path(broker.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if isinstance(getattr(errors, name, None), type):
                    raised.add(name)
    assert raised, "no domain error raised in broker/: the check reads nothing"
    assert raised - {"DomainError"} <= {cls.__name__ for cls in errors.BROKER_ERRORS}


def test_settings_precedence_flags_over_env_over_config(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('[proxy]\nbrokers = ["b1=h1:1"]\nmax-batch = 8\nlisten = "127.0.0.1:1"\n')
    env = {"POPGATE_MAX_BATCH": "16", "POPGATE_CONFIG": str(config)}
    settings = load(["--max-batch", "24"], env)
    assert settings.max_batch == 24 and settings.listen == "127.0.0.1:1"
    assert [b.name for b in settings.brokers] == ["b1"]
    assert load([], env).max_batch == 16
    assert load(["--broker", "x=h:2", "--broker", "y=h:3"], env).brokers[1].target == "h:3"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "at least one --broker"),
        (["--broker", "b1"], "NAME=HOST:PORT"),
        (["--broker", "b1=h:1", "--broker", "b1=h:2"], "unique"),
        (["--broker", "b1=h:1", "--adaptive-window-s", "0"], "--adaptive-window-s=0.0 out of range"),
        (["--broker", "b1=h:1", "--adaptive-rate-threshold", "-1"], "--adaptive-rate-threshold=-1.0 out"),
        (["--broker", "b1=h:1", "--receive-mode", "fast"], "choose one of"),
        (["--broker", "b1=h:1", "--max-batch", "64"], "--max-batch=64 out of range"),
        (["--broker", "b1=h:1", "--max-batch", "many"], "expected int"),
        (["--broker", "b1=h:1", "--max-message-bytes", "2GiB"], "--max-message-bytes=2147483648 out of range"),
        (
            ["--broker", "b1=h:1", "--health-interval-s", "1e-9"],
            "--health-interval-s=1e-09 out of range: must be >= 0.1",
        ),
        (["--broker-srv", "x", "--broker-dns-interval-s", "0.01"], "--broker-dns-interval-s=0.01 out of range"),
        (["--broker", "b1=h:1", "--export-interval-s", "0.01"], "--export-interval-s=0.01 out of range"),
        (["--broker", "b1=h:1", "--tls-reload-s", "0.01"], "--tls-reload-s=0.01 out of range: must be 0 \\(never\\)"),
    ],
)
def test_bad_settings_are_refused_with_a_message_naming_them(argv: list[str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load(argv, {})


def test_namespaced_names_are_stored_as_rocketmq_5_stores_them_and_given_back_bare() -> None:
    assert validate.topic_in("", "orders") == "orders"
    assert validate.topic_in("tenantA", "orders") == "tenantA%orders"
    assert validate.group_in("tenantA", "billing") == "tenantA%billing"
    assert validate.topic_in("tenantA", "%DLQ%billing") == "%DLQ%tenantA%billing"
    for stored in ("tenantA%orders", "%DLQ%tenantA%billing"):
        assert validate.topic_in("tenantA", validate.outside("tenantA", stored)) == stored
    assert validate.outside("", "x%y") == "x%y"


@pytest.mark.parametrize("namespace", ["bad ns", "a%b", "n" * 65, "ns\n"])
def test_a_bad_namespace_is_refused_naming_the_namespace(namespace: str) -> None:
    with pytest.raises(errors.IllegalTopic, match="namespace"):
        validate.topic_in(namespace, "orders")
    with pytest.raises(errors.IllegalGroup, match="namespace"):
        validate.group_in(namespace, "billing")


def test_a_name_too_long_with_its_namespace_is_refused() -> None:
    with pytest.raises(errors.IllegalTopic, match="limit is 127"):
        validate.topic_in("tenant", "t" * 125)


@pytest.mark.parametrize(
    "name", ["%DLQ%billing", "%RETRY%billing", "%SYS%x", "TBW102", "SCHEDULE_TOPIC_XXXX", "rmq_sys_x"]
)
def test_a_send_to_a_system_topic_is_refused(name: str) -> None:
    """As RocketMQ's proxy (cannot access system topic): a producer must not put messages into a group's
    dead-letter queue, which `popgate dlq resend` would then deliver to the topic named inside them."""
    with pytest.raises(errors.IllegalTopic, match="system topic"):
        validate.publish_topic(name)
    assert validate.topic(name) == name  # reading one (a DLQ, to inspect it) stays allowed


def test_ordinary_topics_may_be_sent_to() -> None:
    assert validate.publish_topic("orders%eu") == "orders%eu"


def test_the_proxys_default_limits_are_designs_and_their_bounds_are_inclusive() -> None:
    """docs/ARCHITECTURE.md §5: body ≤ 4 MiB, receive batch 1..32, invisible 10 s..12 h, long polling 0..30 s."""
    s = Settings(brokers=(BrokerAddress("b1", "127.0.0.1:1"),))
    assert (s.max_body_bytes, s.max_batch) == (4 * 1024 * 1024, 32)
    assert (s.min_invisible_s, s.max_invisible_s) == (10, 12 * 3600)
    assert (s.min_long_polling_s, s.max_long_polling_s) == (0, 30)
    limit = s.max_body_bytes
    assert len(validate.body(b"x" * limit, limit=limit)) == limit  # exactly 4 MiB is a legal body
    assert [validate.batch_size(n, limit=s.max_batch) for n in (1, s.max_batch)] == [1, 32]
    for seconds in (s.min_invisible_s, s.max_invisible_s):
        assert validate.invisible(seconds, low=s.min_invisible_s, high=s.max_invisible_s) == seconds
