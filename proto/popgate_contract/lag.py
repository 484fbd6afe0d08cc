"""Lag in time, as brokers report it and the `popgate stats` command shows it."""

from __future__ import annotations


def lag_seconds(oldest_unacked_store_ms: int, now_ms: int) -> float:
    """Lag in time: seconds since the oldest un-acked message was stored; 0 when none is (store time 0), and
    never below 0 (a store clock ahead of this one)."""
    return max(0.0, (now_ms - oldest_unacked_store_ms) / 1000) if oldest_unacked_store_ms else 0.0
