"""The model's parameters: one run's configuration and the calibrated latency medians."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.receive.adaptive import AdaptiveSettings


@dataclass(frozen=True, slots=True)
class Latency:
    """Median costs in seconds (each × `scale`, sampled lognormal with `sigma`); docs/SCALE.md has the calibration."""

    hop: float = 0.00035  # one gRPC message proxy <-> broker, one way
    proxy_step: float = 0.00025  # proxy: handle one broker answer / issue the next call
    pop_take: float = 0.0005  # broker: a Pop that takes messages (group-committed in-flight record)
    pop_empty: float = 0.0001  # broker: a Pop or Notification that finds nothing / holds
    store: float = 0.00133  # broker: Send commit (Send = hop + store + hop ~ 2.0 ms)
    answer: float = 0.00095  # proxy -> consumer: three stream frames
    request: float = 0.0005  # consumer -> proxy: ReceiveMessage arrives and is dispatched
    # The medians above were derived on 2026-11-21 06:42; the re-measurement of 08:36-08:44 found the broker Send
    # (hop + store + hop) 1.08 x slower at the median and wider (its quartiles to p95 fit sigma 0.3, was 0.25).
    scale: float = 1.08
    sigma: float = 0.3
    tail_p: float = 0.002  # probability that a step hits a scheduling stall (shared 2-core machine)
    tail_s: float = 0.002  # mean of that stall (exponential)


@dataclass(slots=True)
class Config:
    mode: str = "notify"  # notify | longpoll | adaptive
    brokers: int = 4
    proxies: int = 1
    consumers: int = 1
    rate: float = 10.0  # messages / s offered, whole topic
    arrivals: str = "uniform"  # poisson | uniform (50-250 ms gaps, sparse bench) | ticks (20 ms batches, dense bench)
    burst: float = 1.0  # >1: on/off modulation, rate × burst while on (on 1/burst of the time), 0 while off
    burst_period: float = 1.0
    skew: float = 0.0  # Zipf exponent of the broker a message goes to (0 = even)
    proxy_skew: float = 0.0  # Zipf exponent of the proxy a consumer connects to (0 = round-robin)
    poll_s: float = 2.0  # client's long-polling time
    reserve_s: float = 0.3  # proxy's reserve: brokers hold poll_s - reserve_s
    client_timeout_s: float = 3.0  # request timeout on top of poll_s (hard deadline = poll + this - reserve)
    batch: int = 32
    process_s: float = 0.0  # consumer: fixed time per non-empty answer (e.g. the ack round trip)
    process_per_msg_s: float = 0.0
    max_held: int = 20000  # per broker (broker --max-held)
    full_backoff_s: float = 1.0  # consumer: wait after TOO_MANY_REQUESTS (every broker full)
    duration: float = 10.0
    warmup: float = 1.0
    messages: int = 0  # > 0: stop producing after this many (sparse bench: 300)
    seed: int = 1
    adaptive: AdaptiveSettings = field(default_factory=AdaptiveSettings)
    random_rotation: bool = False  # each proxy's receive rotation starts at a random broker (default: at 0, as now)
    fleet_aware: bool = False  # AdaptiveSettings(proxies=<proxies>): concurrency judged fleet-wide
    latency: Latency = field(default_factory=Latency)
    sample_s: float = 0.1
