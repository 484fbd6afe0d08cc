"""What two popgate processes must agree on, in one place: broker, proxy and SDK import it, it imports none of them.

- `errors`: the domain errors, one vocabulary for every process; `codes`: the one table from them to v2 codes.
- `trailer`: how a broker's error crosses a call (status code and ``popgate-error`` trailer), both directions.
- `receipt`: the receipt handle a broker issues and the proxy routes by.
- `validation`: names, limits, tags and addresses, checked alike everywhere.
- `session_client`: the client side of a broker's Session stream; `broker_token`: the broker token interceptors.
- `lag`: lag in time, as brokers report it.

Nothing here starts servers, reads settings or changes the process (that is `popgate_process`).
"""
