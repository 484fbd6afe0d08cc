"""`popgate recall` and the transactions of `popgate send --transaction` (beside `sending`)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..client import Producer
from ..message import SendReceipt
from .options import Sub, check_listening, client_options, connection, quiet_option, topic_name, utf8_text
from .output import error_console, explain


def add_parsers(sub: Sub) -> None:
    recall = sub.add_parser("recall", help="withdraw scheduled messages (sent with --delay) before they are due")
    client_options(recall)
    recall.add_argument("topic", type=topic_name)
    recall.add_argument(
        "handles", nargs="+", type=utf8_text, metavar="HANDLE", help="recall handle `send --delay --ids` printed"
    )
    quiet_option(recall)
    recall.set_defaults(handler=recall_command)


def recall_command(args: argparse.Namespace) -> int:
    """Prints each recalled message's id; exit 1 when any could not be recalled (said on stderr)."""
    err = error_console()
    code = 0
    with Producer(args.endpoint, **connection(args)) as producer:
        check_listening(args.endpoint)
        for handle in args.handles:
            try:
                print(producer.recall(args.topic, handle), flush=True)
            except errors.PopgateError as exc:
                err.print(f"popgate recall: {explain(exc)}", style="red")
                code = 1
    return code


def send_transaction(
    producer: Producer, topic: str, bodies: list[bytes], options: Mapping[str, Any], *, commit: bool
) -> list[SendReceipt]:
    """The bodies as one transaction's half messages, then committed or rolled back."""
    fields = {k: options[k] for k in ("tag", "keys", "properties")}
    with producer.transaction() as tx:
        receipts = [tx.send(topic, body, **fields) for body in bodies]
        if not commit:
            tx.rollback()
    return receipts


def receipt_line(receipt: SendReceipt) -> str:
    """A message id, and its recall handle when it has one (`popgate recall` takes it)."""
    return f"{receipt.message_id} {receipt.recall_handle}" if receipt.recall_handle else receipt.message_id
