"""Run the scale model: calibration against measured realtime_bench runs, predictions, plots.

PYTHONPATH=. .venv/bin/python -m bench.sim.run calibrate [bench/sim/measured/*.json] [--seeds 5]
PYTHONPATH=. .venv/bin/python -m bench.sim.run predict [--out bench/sim/predict.json] [--only-small]
PYTHONPATH=. .venv/bin/python -m bench.sim.run plot bench/sim/predict.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.sim.calibrate import MEASURED_GLOB, calibrate
from bench.sim.model import Config, simulate

MODES = ("longpoll", "notify", "adaptive", "adaptive-fleet")


def predict_config(
    mode: str, brokers: int, proxies: int, consumers: int, proxy_skew: float = 0.0, rotation: bool = True
) -> Config:
    """Per consumer 0.2 msg/s (every consumer mostly waiting), Poisson, poll 2 s, batch 32, 2 ms processing."""
    big = consumers >= 10000
    scale = 1
    if mode == "notify" and big:
        scale = 10  # 100,000 receives × every broker is too many events: 1/10 of consumers, rate and held limit
    return Config(
        mode="adaptive" if mode == "adaptive-fleet" else mode,
        fleet_aware=mode == "adaptive-fleet",
        brokers=brokers,
        proxies=proxies,
        consumers=consumers // scale,
        rate=consumers * 0.2 / scale,
        arrivals="poisson",
        batch=32,
        process_s=0.002,
        max_held=20000 // scale,
        warmup=2.5,
        duration=3.5 if big else 8.5,
        proxy_skew=proxy_skew,
        random_rotation=rotation,
        seed=7,
    )


def rotation_check() -> dict[str, object]:
    """The proxies' receive rotation as the code has it (every proxy starts at broker 0), 100b/100p/1k longpoll."""
    r = simulate(predict_config("longpoll", 100, 100, 1000, rotation=False))
    rec: dict[str, object] = {"mode": "longpoll, rotation from 0", "brokers": 100, "proxies": 100, "consumers": 1000}
    rec.update({"proxy_skew": 0.0, "scale": 1, "decisions": {}, **r.row()})
    print(json.dumps(rec), flush=True)
    return rec


def predict(out: Path, only_small: bool, cases_arg: str = "") -> None:
    results: list[dict[str, object]] = []
    cases = [(b, p, c, 0.0) for c in ((1000,) if only_small else (1000, 100000)) for b in (10, 100) for p in (10, 100)]
    cases += [(10, 10, 1000, 1.0), (100, 100, 1000, 1.0), (10, 100, 1000, 1.0)]
    if cases_arg:  # e.g. "100x100x100000x0,10x10x1000x1": brokers x proxies x consumers x proxy skew
        cases = [(int(b), int(p), int(c), float(k)) for b, p, c, k in (x.split("x") for x in cases_arg.split(","))]
    else:
        results.append(rotation_check())
    for b, p, c, skew in cases:
        for mode in MODES:
            cfg = predict_config(mode, b, p, c, skew)
            t = time.time()
            r = simulate(cfg)
            scale = c // cfg.consumers
            row = r.row()
            for key in ("rpc_per_broker_s", "max_broker_rpc_s", "held_notes_mean", "held_notes_max", "msg_s"):
                row[key] *= scale
            rec = {
                "mode": mode,
                "brokers": b,
                "proxies": p,
                "consumers": c,
                "proxy_skew": skew,
                "scale": scale,
                "sim_s": cfg.duration - cfg.warmup,
                "wall_s": round(time.time() - t, 1),
                "receives": r.receives,
                "decisions": r.decisions,
                "lost_races": r.lost_races,
                "handoffs": r.handoffs,
                **row,
            }
            results.append(rec)
            print(json.dumps(rec), flush=True)
            out.write_text(json.dumps(results, indent=1))


def small_groups(out: Path) -> None:
    """A small consumer group in a big cluster: fewer receives than brokers, where false empties live."""
    results = []
    for b, p, c in ((100, 10, 10), (100, 10, 50), (10, 10, 5), (100, 100, 50)):
        for mode in MODES:
            cfg = predict_config(mode, b, p, c)
            cfg.rate, cfg.duration, cfg.warmup = 5.0, 32.5, 2.5  # 5 msg/s for the group, 30 s measured
            r = simulate(cfg)
            rec = {"mode": mode, "brokers": b, "proxies": p, "consumers": c, "proxy_skew": 0.0, "scale": 1}
            rec.update({"decisions": r.decisions, "receives": r.receives, **r.row()})
            results.append(rec)
            print(json.dumps(rec), flush=True)
    out.write_text(json.dumps(results, indent=1))


def workloads(out: Path) -> None:
    """Arrivals skewed across brokers (Zipf 1.0) and bursty (5× the rate for 1/5 of each second, then nothing)."""
    results = []
    for b, p, c, rate in ((10, 10, 1000, 200.0), (100, 10, 50, 5.0)):
        for label, skew, burst in (("skewed", 1.0, 1.0), ("bursty", 0.0, 5.0)):
            for mode in MODES:
                cfg = predict_config(mode, b, p, c)
                cfg.rate, cfg.skew, cfg.burst = rate, skew, burst
                if c < 100:
                    cfg.duration = 32.5
                r = simulate(cfg)
                rec = {"mode": f"{mode} ({label})", "brokers": b, "proxies": p, "consumers": c, "proxy_skew": 0.0}
                rec.update({"scale": 1, "decisions": r.decisions, "receives": r.receives, **r.row()})
                results.append(rec)
                print(json.dumps(rec), flush=True)
    out.write_text(json.dumps(results, indent=1))


def fleet_sweep(img_dir: Path) -> None:
    """20 brokers, 400 consumers, 1..80 proxies: adaptive as shipped vs fleet-aware, calls per message."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    proxies = [1, 2, 5, 10, 20, 40, 80]
    series: dict[str, list[float]] = {}
    for mode in ("longpoll", "adaptive", "adaptive-fleet"):
        series[mode] = []
        for p in proxies:
            cfg = predict_config(mode, 20, p, 400)
            cfg.duration = 6.5
            r = simulate(cfg)
            series[mode].append(r.rpcs_per_msg)
            print(mode, p, round(r.rpcs_per_msg, 2), r.false_empties, flush=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for mode, ys in series.items():
        ax.plot([400 / p for p in proxies], ys, marker="o", label=mode)
    ax.axvline(20, color="grey", ls=":", lw=1)
    ax.text(20, ax.get_ylim()[1] * 0.5, " receives per proxy = brokers", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("consumers per proxy (400 consumers over 1..80 proxies)")
    ax.set_ylabel("broker calls per message")
    ax.set_title("20 brokers, 400 consumers: adaptive as shipped vs fleet-aware")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(img_dir / "scale_fleet.png", dpi=110)
    plt.close(fig)


def table(path: Path) -> None:
    rows = json.loads(path.read_text())
    print(
        "| brokers | proxies | consumers | skew | mode | false-empty % | p50 ms | p99 ms | RPCs/msg | "
        "RPC/s per broker (max) | held notifications per broker (max) | notify decisions % |"
    )
    print("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        d = r["decisions"]
        share = 100 * d.get("notify", 0) / max(1, d.get("notify", 0) + d.get("longpoll", 0)) if d else float("nan")
        star = ("*" if r["scale"] > 1 else "") + ("†" if r.get("predates") else "")  # †: earlier latency parameters
        print(
            f"| {r['brokers']} | {r['proxies']} | {r['consumers']:,} | {r['proxy_skew']:g} | {r['mode']}{star} | "
            f"{100 * r['false_empty_rate']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['rpcs_per_msg']:.2f} | "
            f"{r['rpc_per_broker_s']:,.0f} ({r['max_broker_rpc_s']:,.0f}) | {r['held_notes_mean']:,.0f} "
            f"({r['held_notes_max']:,.0f}) | {share:.0f} |"
        )


def plot(path: Path, img_dir: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in json.loads(path.read_text()) if r["proxy_skew"] == 0]
    labels = sorted({(r["brokers"], r["proxies"], r["consumers"]) for r in rows}, key=lambda k: (k[2], k[0], k[1]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.2
    for i, mode in enumerate(MODES):
        by = {(r["brokers"], r["proxies"], r["consumers"]): r for r in rows if r["mode"] == mode}
        xs = [j + (i - 1.5) * width for j in range(len(labels))]
        axes[0].bar(xs, [by[k]["rpcs_per_msg"] if k in by else 0 for k in labels], width, label=mode)
        axes[1].bar(xs, [by[k]["p99_ms"] if k in by else 0 for k in labels], width, label=mode)
    stale = {(r["brokers"], r["proxies"], r["consumers"]) for r in rows if r.get("predates")}
    names = [f"{b}b/{p}p/{c // 1000}k" + ("†" if (b, p, c) in stale else "") for b, p, c in labels]
    for ax, title in zip(axes, ("broker RPCs per message", "delivery latency p99 (ms)"), strict=True):
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("popgate scale model: brokers/proxies/consumers (thousands), 0.2 msg/s per consumer, poll 2 s")
    fig.tight_layout()
    img_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(img_dir / "scale_modes.png", dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("calibrate")
    c.add_argument("measured", type=Path, nargs="*", help=f"realtime_bench --json files (default: {MEASURED_GLOB})")
    c.add_argument("--seeds", type=int, default=5)
    p = sub.add_parser("predict")
    p.add_argument("--out", type=Path, default=Path("bench/sim/predict.json"))
    p.add_argument("--only-small", action="store_true")
    p.add_argument("--cases", default="", help="brokers x proxies x consumers x skew, comma-separated")
    s = sub.add_parser("groups")
    s.add_argument("--out", type=Path, default=Path("bench/sim/groups.json"))
    w = sub.add_parser("workloads")
    w.add_argument("--out", type=Path, default=Path("bench/sim/workloads.json"))
    f = sub.add_parser("fleet")
    f.add_argument("--img-dir", type=Path, default=Path("docs/img"))
    t = sub.add_parser("table")
    t.add_argument("path", type=Path)
    g = sub.add_parser("plot")
    g.add_argument("path", type=Path)
    g.add_argument("--img-dir", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    if args.cmd == "calibrate":
        paths = args.measured or sorted(Path().glob(MEASURED_GLOB))
        sys.exit(0 if calibrate(paths, args.seeds) else 1)  # 1: a row outside the 20 % of issue 10
    elif args.cmd == "predict":
        predict(args.out, args.only_small, args.cases)
    elif args.cmd == "groups":
        small_groups(args.out)
    elif args.cmd == "workloads":
        workloads(args.out)
    elif args.cmd == "fleet":
        fleet_sweep(args.img_dir)
    elif args.cmd == "table":
        table(args.path)
    else:
        plot(args.path, args.img_dir)


if __name__ == "__main__":
    main()
