"""One simulation's result: what the consumers received and what the brokers served, as a table row."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.sim.config import Config


@dataclass(slots=True)
class Result:
    cfg: Config
    delivered: int = 0
    latencies: list[float] = field(default_factory=list)  # from Send ack, s
    receives: int = 0
    empties: int = 0
    false_empties: int = 0
    full: int = 0
    pops: int = 0  # sent
    notifications: int = 0  # sent
    completed: int = 0  # answered and not cancelled: what the proxy's broker_rpcs_total counts
    measured_s: float = 0.0
    held_notes_mean: float = 0.0  # per broker, time average
    held_notes_max: int = 0  # on the busiest broker, at any sample
    lost_races: int = 0
    handoffs: int = 0
    orphaned: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    max_broker_rpc_s: float = 0.0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q / 100 * len(s)))] * 1000

    @property
    def rpcs_per_msg(self) -> float:
        return (self.pops + self.notifications) / max(1, self.delivered)

    @property
    def completed_per_msg(self) -> float:
        return self.completed / max(1, self.delivered)

    @property
    def false_empty_rate(self) -> float:
        return self.false_empties / max(1, self.receives)

    @property
    def rpc_per_broker_s(self) -> float:
        return (self.pops + self.notifications) / self.cfg.brokers / max(1e-9, self.measured_s)

    def row(self) -> dict[str, float]:
        return {
            "p50_ms": self.pct(50),
            "p90_ms": self.pct(90),
            "p99_ms": self.pct(99),
            "msg_s": self.delivered / max(1e-9, self.measured_s),
            "rpcs_per_msg": self.rpcs_per_msg,
            "completed_per_msg": self.completed_per_msg,
            "false_empties": self.false_empties,
            "false_empty_rate": self.false_empty_rate,
            "empties": self.empties,
            "rpc_per_broker_s": self.rpc_per_broker_s,
            "max_broker_rpc_s": self.max_broker_rpc_s,
            "held_notes_mean": self.held_notes_mean,
            "held_notes_max": self.held_notes_max,
        }
