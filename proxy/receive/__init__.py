"""Receive: how one client ReceiveMessage becomes broker calls (docs/ARCHITECTURE.md §3, docs/RECEIVE.md).

- `seam`: the request, the result and the `ReceiveStrategy` protocol the core calls; the proxy's close watch.
- `coupled`: coupled long polling (`--receive-mode longpoll`), one Pop held at one broker; with `coverage`, the
  pure bookkeeping of a group's held Pops and of the Notifications that cover the brokers holding none.
- `notify` (pure state machine) and `notify_driver`: pop with notify (`--receive-mode notify`).
- `adaptive` (pure policy) and `adaptive_driver`: per request one of the two (`--receive-mode adaptive`).
- `modes`: builds the strategy the settings name.
- `polltime` (how long a broker may hold a receive) and `announce` (the groups announced to every broker).
"""
