"""``phalanx report usage --plot FILE``: the usage report drawn with matplotlib.

Two panels, readable at a glance: the chosen resource's hours per group over the window, as
stacked bars per time bucket (an hour for windows up to two days, else a day; at most 90
buckets), and each group's wait p50 and p95. Each bucket is what the table's report gives over
that bucket (:func:`phalanx.store.report.resource_seconds_per_bucket`, one query for all
buckets), so the bars add up to the table.

matplotlib is an optional dependency (``pip install 'phalanx[plot]'``); without it ``--plot``
says so and the table still works.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from phalanx.store import report

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PlotUnavailable", "Series", "bucket_width", "draw", "pick_resource", "series"]

MAX_BUCKETS = 90
_PLAIN = ("cpu", "memory", "ephemeral-storage", "pods")


class PlotUnavailable(Exception):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class Series:
    resource: str
    by: str
    since: dt.datetime
    until: dt.datetime
    starts: list[dt.datetime]
    width: dt.timedelta
    hours: dict[str, list[float]]
    """Group -> the resource's hours (in its display unit) in each bucket."""
    totals: list[report.UsageRow]
    """The whole window's report (what the table prints)."""

    @property
    def label(self) -> str:
        unit = report.resource_unit(self.resource)[0]
        return f"{self.resource} hours" + (f" ({unit})" if unit else "")


def bucket_width(span: dt.timedelta) -> dt.timedelta:
    """An hour up to two days, a day beyond; wider when that would make over 90 buckets."""
    width = dt.timedelta(hours=1) if span <= dt.timedelta(days=2) else dt.timedelta(days=1)
    if span / width > MAX_BUCKETS:
        width = span / MAX_BUCKETS
    return width


def pick_resource(rows: Sequence[report.UsageRow]) -> str | None:
    """The resource to draw: the most used accelerator-like one (not cpu, memory, storage or
    pods), else cpu, else whatever was used."""
    used: dict[str, float] = {}
    for row in rows:
        for resource, seconds in row.resource_seconds.items():
            used[resource] = used.get(resource, 0.0) + seconds
    special = [r for r in used if r not in _PLAIN and not r.startswith("hugepages-")]
    for candidates in (special, [r for r in used if r == "cpu"], list(used)):
        if candidates:
            return max(sorted(candidates), key=lambda r: used[r])
    return None


def series(
    engine: Engine,
    *,
    since: dt.datetime,
    until: dt.datetime,
    by: str,
    resource: str | None = None,
) -> Series:
    totals = report.usage(engine, since=since, until=until, by=by)
    chosen = resource or pick_resource(totals) or "cpu"
    width = bucket_width(until - since)
    starts: list[dt.datetime] = []
    start = since
    while start < until:
        starts.append(start)
        start += width
    groups = [row.group for row in totals]
    hours: dict[str, list[float]] = {g: [0.0] * len(starts) for g in groups}
    per_bucket = report.resource_seconds_per_bucket(
        engine, since=since, until=until, width=width, by=by
    )
    per_unit = 3600 * report.resource_unit(chosen)[1]
    for group, buckets in per_bucket.items():
        values = hours.setdefault(group, [0.0] * len(starts))
        for index, held in enumerate(buckets):
            values[index] = held.get(chosen, 0.0) / per_unit
    return Series(
        resource=chosen,
        by=by,
        since=since,
        until=until,
        starts=starts,
        width=width,
        hours=hours,
        totals=totals,
    )


def draw(data: Series, path: Path) -> Figure:
    """Write the figure to ``path`` (its suffix picks the format: .png, .svg, .pdf)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.dates import DateFormatter
        from matplotlib.figure import Figure
    except ImportError as error:
        raise PlotUnavailable(
            "--plot needs matplotlib: pip install 'phalanx[plot]' (or pip install matplotlib)"
        ) from error
    figure = Figure(figsize=(11, 7.5), layout="constrained")
    over_time, waits = figure.subplots(2, 1, height_ratios=(3, 2))
    width_days = data.width / dt.timedelta(days=1)
    bottom = [0.0] * len(data.starts)
    for group in sorted(data.hours):
        values = data.hours[group]
        over_time.bar(
            data.starts,
            values,
            width=width_days * 0.9,
            bottom=bottom,
            align="edge",
            label=group or "(none)",
        )
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    over_time.set_title(
        f"{data.label} per {data.by}, {data.since:%Y-%m-%d %H:%M} to "
        f"{data.until:%Y-%m-%d %H:%M} UTC (per {_human(data.width)})"
    )
    over_time.set_ylabel(data.label)
    if data.hours:
        over_time.legend(loc="upper left", fontsize="small", ncols=min(4, len(data.hours)))
    over_time.set_ylim(0, max(bottom, default=0.0) * 1.15 or 1.0)
    formatter = DateFormatter("%m-%d %H:%M")  # type: ignore[no-untyped-call]  # untyped upstream
    over_time.xaxis.set_major_formatter(formatter)
    over_time.tick_params(axis="x", labelrotation=30)
    groups = [row.group or "(none)" for row in data.totals]
    p50 = [row.wait_percentile(0.5) or 0.0 for row in data.totals]
    p95 = [row.wait_percentile(0.95) or 0.0 for row in data.totals]
    positions = list(range(len(groups)))
    waits.barh([p + 0.2 for p in positions], p50, height=0.4, label="wait p50", color="0.65")
    waits.barh([p - 0.2 for p in positions], p95, height=0.4, label="wait p95", color="0.3")
    waits.set_yticks(positions, groups)
    waits.set_xlabel("seconds from queued to quota reserved")
    waits.set_title(f"Wait per {data.by} (admissions in the window)")
    if groups:
        waits.legend(loc="lower right", fontsize="small")
    figure.savefig(path, dpi=110)
    return figure


def _human(width: dt.timedelta) -> str:
    if width == dt.timedelta(hours=1):
        return "hour"
    if width == dt.timedelta(days=1):
        return "day"
    return f"{width.total_seconds() / 3600:g} h"
