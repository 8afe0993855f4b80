"""``phalanx bench compare``'s figures: what Kueue's scheduler-performance runner wrote, what
``phalanx bench e2e`` measured, and their ratios.

Kueue's runner (``test/performance/scheduler/runner``) writes into its output folder:

- ``summary.yaml``: per workload class its ``count``, ``averageTimeToAdmissionMs`` (from the
  recorder's first sight of the Workload to its admission) and ``totalEvictions``; per
  ClusterQueue class the first and last event times;
- ``minimalkueue.stats.yaml``: minimalkueue's ``wallMs`` (process start to exit: what Kueue's
  checker holds against ``rangespec.yaml``'s ``cmd.maxWallMs``), ``userMs`` and ``sysMs``;
- ``wlStates.csv``: one row per Workload, with its ms to admitted and ms to finish (0 when it
  never got there).

The two sides are put on the same footing: wall is Kueue's ``wallMs`` against bench e2e's
``real_wall_ms`` (the figure bench e2e checks against the same ``maxWallMs``); time to admission
per class is, on both sides, from the Workload's first sight (bench e2e's
``avg_admission_from_create_ms``); CPU is process CPU (user + system) of the API server and of the
controller (minimalkueue, the Phalanx operator) divided by the admissions (first admissions plus
re-admissions after an eviction). A ratio is Phalanx's figure over Kueue's: below 1 Phalanx took
less.

minimalkueue's API client is rate limited by the harness (:data:`MINIMALKUEUE_QPS`); the figures
it logged at start (its ``K8S Client`` line) are read back so the report says what it ran with.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "KUEUE_ATTEMPTS",
    "MINIMALKUEUE_BURST",
    "MINIMALKUEUE_QPS",
    "Comparison",
    "KueueOutputError",
    "Side",
    "client_limits",
    "compare",
    "parse_kueue_output",
    "phalanx_side",
    "render",
    "stopped_early",
]

MINIMALKUEUE_QPS = 50
MINIMALKUEUE_BURST = 100
"""Kueue v0.19.2's minimalkueue (test/performance/scheduler/minimalkueue/main.go) sets its
client's ``QPS = 50`` and ``Burst = 100`` after loading the kubeconfig; the runner has no flag to
change them (its ``--qps``/``--burst`` set only the runner's own clients)."""

KUEUE_ATTEMPTS = 3
"""How many times ``bench compare`` runs Kueue's side when its recorder stops early."""

_CLIENT_LINE = re.compile(r'K8S Client\s+\{.*"qps": ([0-9.]+), "burst": ([0-9]+)')
_LOG_SCAN_BYTES = 4 << 20


def qps_note(qps: float, burst: int) -> str:
    return (
        f"minimalkueue's client is limited to {qps:g} QPS (burst {burst}) by Kueue's harness:"
        " v0.19.2's test/performance/scheduler/minimalkueue/main.go sets"
        f" kubeConfig.QPS = {MINIMALKUEUE_QPS} and kubeConfig.Burst = {MINIMALKUEUE_BURST}"
        " (the runner's --qps/--burst apply to the runner's own clients only); the Phalanx"
        " operator's decisions have no requests-per-second limit, only a bound on requests"
        " in flight (its pending explanations: 10 a second)"
    )


def client_limits(log: Path) -> tuple[float, int] | None:
    """The QPS and burst minimalkueue logged at start (its ``"K8S Client"`` line), or None when
    its log (``minimalkueue.err.log``) is missing or has no such line near its start."""
    try:
        with log.open(errors="replace") as handle:
            head = handle.read(_LOG_SCAN_BYTES)
    except FileNotFoundError:
        return None
    match = _CLIENT_LINE.search(head)
    if match is None:
        return None
    return float(match.group(1)), int(match.group(2))


class KueueOutputError(ValueError):
    """Kueue's runner output is missing or not what v0.19.2 writes; the message names the file."""


@dataclass(frozen=True)
class Side:
    """One side's figures, in the units of the comparison."""

    name: str
    workloads: int
    admitted: int
    """Workloads admitted at least once."""
    admissions: int
    """Admitted Workloads plus re-admissions after an eviction."""
    wall_ms: int
    class_avg_admission_ms: dict[str, int]
    apiserver_cpu_s: float | None
    controller_cpu_s: float | None
    etcd_cpu_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    """Side-specific figures shown for reference (never in a ratio)."""

    def per_admission(self, cpu_s: float | None) -> float | None:
        if cpu_s is None or not self.admissions:
            return None
        return cpu_s / self.admissions


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise KueueOutputError(
            f"{path} is missing: Kueue's runner did not finish (see its log in {path.parent})"
        ) from None
    except yaml.YAMLError as exc:
        raise KueueOutputError(f"{path}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise KueueOutputError(f"{path}: expected a mapping, got {type(data).__name__}")
    return data


def _int(data: dict[str, Any], key: str, path: Path) -> int:
    value = data.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise KueueOutputError(f"{path}: {key!r} should be an integer, got {value!r}")
    return value


def _workload_rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except FileNotFoundError:
        raise KueueOutputError(
            f"{path} is missing: Kueue's runner did not finish (see its log in {path.parent})"
        ) from None
    wanted = ("class name", "ms to admitted", "ms to finish", "num evictions")
    if rows and any(column not in rows[0] for column in wanted):
        raise KueueOutputError(f"{path}: expected the columns {', '.join(wanted)}")
    return rows


def parse_kueue_output(
    folder: Path,
    *,
    apiserver_cpu_s: float | None = None,
    etcd_cpu_s: float | None = None,
) -> Side:
    """Kueue's side from its runner's output folder; the API server's and etcd's CPU come from
    outside (the runner does not measure them)."""
    summary_path = folder / "summary.yaml"
    summary = _load_yaml(summary_path)
    classes = summary.get("workloadClasses")
    if not isinstance(classes, dict) or not classes:
        raise KueueOutputError(f"{summary_path}: no workloadClasses")
    class_avg: dict[str, int] = {}
    for name, entry in classes.items():
        if not isinstance(entry, dict):
            raise KueueOutputError(f"{summary_path}: workloadClasses.{name} is not a mapping")
        class_avg[str(name)] = _int(entry, "averageTimeToAdmissionMs", summary_path)
    stats_path = folder / "minimalkueue.stats.yaml"
    stats = _load_yaml(stats_path)
    rows = _workload_rows(folder / "wlStates.csv")
    admitted = sum(
        1 for r in rows if int(r["ms to admitted"] or 0) > 0 or int(r["ms to finish"] or 0) > 0
    )
    finished = sum(1 for r in rows if int(r["ms to finish"] or 0) > 0)
    evictions = sum(int(r["num evictions"] or 0) for r in rows)
    cpu_ms = _int(stats, "userMs", stats_path) + _int(stats, "sysMs", stats_path)
    limits = client_limits(folder / "minimalkueue.err.log")
    return Side(
        name="Kueue",
        workloads=len(rows),
        admitted=admitted,
        admissions=admitted + evictions,
        wall_ms=_int(stats, "wallMs", stats_path),
        class_avg_admission_ms=dict(sorted(class_avg.items())),
        apiserver_cpu_s=apiserver_cpu_s,
        controller_cpu_s=cpu_ms / 1000,
        etcd_cpu_s=etcd_cpu_s,
        extra={
            "finished": finished,
            "evictions": evictions,
            "dropped_workload_events": summary.get("droppedWorkloadEvents", 0),
            "minimalkueue_maxrss_kib": stats.get("maxrss"),
            "cq_event_span_ms": _cq_span_ms(summary),
            "client_qps": None if limits is None else limits[0],
            "client_burst": None if limits is None else limits[1],
        },
    )


def stopped_early(kueue: Side) -> bool:
    """Kueue's runner ended on its own (exit 0: its recorder's timeout is an error) with
    Workloads never admitted. Its recorder (v0.19.2's ``recorder.Run``) stops once the
    generator is done and every ClusterQueue's last status it saw reports nothing pending or
    reserving, or an inactive queue; a status that lags the Workloads just created ends the
    run early (seen once in CI on the tiny TAS scenario: 13/48 admitted, 2.7 s in). Such a
    run measured nothing complete, and ``bench compare`` runs Kueue's side again."""
    return kueue.admitted < kueue.workloads


def _cq_span_ms(summary: dict[str, Any]) -> int | None:
    """First to last ClusterQueue event over every ClusterQueue class (None if unknown)."""
    spans = [
        (c.get("firstEventTime"), c.get("lastEventTime"))
        for c in (summary.get("clusterQueueClasses") or {}).values()
        if isinstance(c, dict)
    ]
    try:
        first = min(datetime.fromisoformat(str(a)) for a, _ in spans)
        last = max(datetime.fromisoformat(str(b)) for _, b in spans)
    except ValueError:
        return None
    return int((last - first).total_seconds() * 1000)


def phalanx_side(e2e: dict[str, Any]) -> Side:
    """Phalanx's side from ``phalanx bench e2e --json``'s result."""
    plane = e2e.get("control_plane_cpu_s") or {}
    classes = e2e.get("classes") or {}
    return Side(
        name="Phalanx",
        workloads=int(e2e["workloads"]),
        admitted=int(e2e["finished"]),
        admissions=int(e2e["admissions"]),
        wall_ms=int(e2e["real_wall_ms"]),
        class_avg_admission_ms={
            name: int(c["avg_admission_from_create_ms"]) for name, c in sorted(classes.items())
        },
        apiserver_cpu_s=plane.get("kube-apiserver"),
        controller_cpu_s=e2e.get("operator_cpu_s"),
        etcd_cpu_s=plane.get("etcd"),
        extra={
            "finished": e2e["finished"],
            "evictions": e2e["evictions"],
            "avg_time_to_admission_from_schedule_ms": {
                name: c["avg_time_to_admission_ms"] for name, c in sorted(classes.items())
            },
            "api_writes_per_admission": e2e.get("api_writes_per_admission"),
            "stopped_components": list(e2e.get("stopped_components") or ()),
            "v1beta1_served": e2e.get("v1beta1_served"),
        },
    )


@dataclass(frozen=True)
class Row:
    label: str
    unit: str
    kueue: float | None
    phalanx: float | None

    @property
    def ratio(self) -> float | None:
        """Phalanx over Kueue; None when either is unknown or Kueue's is 0."""
        if self.kueue is None or self.phalanx is None or self.kueue == 0:
            return None
        return self.phalanx / self.kueue


@dataclass(frozen=True)
class Comparison:
    scenario: str
    kueue: Side
    phalanx: Side
    rows: tuple[Row, ...]

    def note(self) -> str:
        """The client limit minimalkueue ran with: from its own log when it logged it."""
        qps = self.kueue.extra.get("client_qps")
        burst = self.kueue.extra.get("client_burst")
        if qps is None or burst is None:
            return qps_note(MINIMALKUEUE_QPS, MINIMALKUEUE_BURST) + " (not found in its log)"
        return qps_note(float(qps), int(burst)) + " (as minimalkueue logged at start)"

    def problems(self) -> list[str]:
        """Either side not admitting every Workload of the scenario."""
        out = []
        for side in (self.kueue, self.phalanx):
            if side.admitted < side.workloads or side.workloads == 0:
                out.append(f"{side.name} admitted {side.admitted}/{side.workloads} workloads")
        if self.kueue.workloads != self.phalanx.workloads:
            out.append(
                f"the sides ran different numbers of workloads: Kueue {self.kueue.workloads},"
                f" Phalanx {self.phalanx.workloads}"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        def side(s: Side) -> dict[str, Any]:
            return {
                "workloads": s.workloads,
                "admitted": s.admitted,
                "admissions": s.admissions,
                "wall_ms": s.wall_ms,
                "avg_time_to_admission_ms": s.class_avg_admission_ms,
                "apiserver_cpu_s": _round(s.apiserver_cpu_s, 2),
                "controller_cpu_s": _round(s.controller_cpu_s, 2),
                "etcd_cpu_s": _round(s.etcd_cpu_s, 2),
                **s.extra,
            }

        return {
            "scenario": self.scenario,
            "kueue": side(self.kueue),
            "phalanx": side(self.phalanx),
            "ratios": {row.label: _round(row.ratio, 3) for row in self.rows},
            "note": self.note(),
            "problems": self.problems(),
        }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def compare(scenario: str, kueue: Side, phalanx: Side) -> Comparison:
    """The side-by-side rows: wall, time to admission per class, CPU per admission."""
    rows = [Row("wall", "ms", kueue.wall_ms, phalanx.wall_ms)]
    for name in sorted(set(kueue.class_avg_admission_ms) | set(phalanx.class_avg_admission_ms)):
        rows.append(
            Row(
                f"time to admission {name} (avg)",
                "ms",
                kueue.class_avg_admission_ms.get(name),
                phalanx.class_avg_admission_ms.get(name),
            )
        )
    rows.append(
        Row(
            "API-server CPU per admission",
            "ms",
            _ms(kueue.per_admission(kueue.apiserver_cpu_s)),
            _ms(phalanx.per_admission(phalanx.apiserver_cpu_s)),
        )
    )
    rows.append(
        Row(
            "controller CPU per admission",
            "ms",
            _ms(kueue.per_admission(kueue.controller_cpu_s)),
            _ms(phalanx.per_admission(phalanx.controller_cpu_s)),
        )
    )
    return Comparison(scenario=scenario, kueue=kueue, phalanx=phalanx, rows=tuple(rows))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _cell(value: float | None, digits: int = 0) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}"


def render(comparison: Comparison) -> str:
    """The text report: both sides' admissions, the rows with their ratios, the QPS note."""
    k, p = comparison.kueue, comparison.phalanx
    lines = [
        f"scenario {comparison.scenario}: Kueue v0.19.2 (runner + minimalkueue on envtest) vs"
        " Phalanx (bench e2e on the local control plane), same kube-apiserver and etcd binaries",
        f"  admitted: Kueue {k.admitted}/{k.workloads} ({k.admissions} admissions),"
        f" Phalanx {p.admitted}/{p.workloads} ({p.admissions} admissions)",
        f"  {'':34s} {'Kueue':>12s} {'Phalanx':>12s} {'Phalanx/Kueue':>14s}",
    ]
    for row in comparison.rows:
        digits = 2 if "CPU" in row.label else 0
        lines.append(
            f"  {row.label + ' (' + row.unit + ')':34s} {_cell(row.kueue, digits):>12s}"
            f" {_cell(row.phalanx, digits):>12s} {_cell(row.ratio, 2):>14s}"
        )
    span = k.extra.get("cq_event_span_ms")
    lines.append(
        "  wall: Kueue's is minimalkueue's process wall (wallMs: its start-up to the runner"
        f" stopping it), first to last ClusterQueue event {_cell(span)} ms; Phalanx's is bench"
        " e2e's real wall (first scheduled creation to the last Workload finished)"
    )
    lines.append(
        f"  CPU (s): API server Kueue {_cell(k.apiserver_cpu_s, 1)}, Phalanx"
        f" {_cell(p.apiserver_cpu_s, 1)}; controller Kueue {_cell(k.controller_cpu_s, 1)},"
        f" Phalanx {_cell(p.controller_cpu_s, 1)}; etcd Kueue {_cell(k.etcd_cpu_s, 1)},"
        f" Phalanx {_cell(p.etcd_cpu_s, 1)}"
    )
    stopped = p.extra.get("stopped_components") or []
    lines.append(
        "  Phalanx's side ran on etcd and kube-apiserver alone, as Kueue's envtest does"
        f" (--bare: {', '.join(stopped)} stopped after the set-up)"
        if stopped
        else "  Phalanx's side ran on the whole local control plane: kube-controller-manager,"
        " kube-scheduler and KWOK too (--bare stops them after the set-up)"
    )
    if p.extra.get("v1beta1_served") is False:
        lines.append(
            "  Phalanx's CRDs served v1beta2 alone (--v1beta1 off): no v1beta1 watch cache"
            " converting through the webhook (Kueue's envtest CRDs convert v1beta1 without one)"
        )
    elif p.extra.get("v1beta1_served"):
        lines.append(
            "  Phalanx's CRDs served v1beta1 too, as installed by default: the API server"
            " converted every Workload and queue change through the operator's webhook for its"
            " v1beta1 watch cache (Kueue's envtest CRDs convert v1beta1 without one)"
        )
    runs = int(k.extra.get("runs") or 1)
    if runs > 1:
        lines.append(
            f"  Kueue's side ran {runs} times: its recorder stopped early before (the figures"
            " are the last run's)"
        )
    lines.append(f"  note: {comparison.note()}")
    problems = comparison.problems()
    lines.append("PASS: both sides admitted every workload" if not problems else "FAIL")
    lines.extend(f"  - {problem}" for problem in problems)
    return "\n".join(lines)
