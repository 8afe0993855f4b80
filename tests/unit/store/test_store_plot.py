"""``phalanx report usage --plot``: the bars are the report per bucket (they add up to the
table), the figure is a real image, and a bad ``--plot`` is refused naming the flag."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from store_builders import condition, workload

from phalanx.store import db, plot, report
from phalanx.store import events as ev

NOW = dt.datetime(2026, 3, 10, 12, 0, 0)


def _iso(at: dt.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _fill(engine: db.Engine) -> None:
    """team-a: 4 GPUs for 30 h across two days, queued 10 min; team-b: 2 GPUs for 3 h,
    queued 1 min."""
    a_start = NOW - dt.timedelta(hours=40)
    a = workload(
        uid="a",
        namespace="team-a",
        name="train",
        created=_iso(a_start - dt.timedelta(minutes=10)),
        cluster_queue="cq-a",
        gpus=4,
        conditions=[
            condition("QuotaReserved", _iso(a_start)),
            condition("Finished", _iso(a_start + dt.timedelta(hours=30))),
        ],
    )
    b_start = NOW - dt.timedelta(hours=5)
    b = workload(
        uid="b",
        namespace="team-b",
        name="eval",
        queue="lq-b",
        created=_iso(b_start - dt.timedelta(minutes=1)),
        cluster_queue="cq-b",
        gpus=2,
        conditions=[
            condition("QuotaReserved", _iso(b_start)),
            condition("Finished", _iso(b_start + dt.timedelta(hours=3))),
        ],
    )
    db.write_events(engine, ev.events_of(a) + ev.events_of(b))


@pytest.fixture
def engine(store_url: str):  # type: ignore[no-untyped-def]
    engine = db.open_engine(store_url)
    db.upgrade(engine)
    try:
        yield engine
    finally:
        engine.dispose()


def test_the_buckets_add_up_to_the_report(engine: db.Engine) -> None:
    _fill(engine)
    since = NOW - dt.timedelta(days=3)
    data = plot.series(engine, since=since, until=NOW, by="namespace")
    assert data.resource == "nvidia.com/gpu", "the accelerator, not cpu"
    assert data.width == dt.timedelta(days=1) and len(data.starts) == 3
    totals = {row.group: row.resource_hours()["nvidia.com/gpu"] for row in data.totals}
    assert totals == pytest.approx({"team-a": 120.0, "team-b": 6.0})
    for group, values in data.hours.items():
        assert sum(values) == pytest.approx(totals[group]), group
    # team-a ran from NOW-40h to NOW-10h: 4 GPUs x 16 h in the second day, 14 h in the third.
    assert data.hours["team-a"] == pytest.approx([0.0, 64.0, 56.0])
    assert data.hours["team-b"] == pytest.approx([0.0, 0.0, 6.0])


def test_the_bucket_width_follows_the_window() -> None:
    assert plot.bucket_width(dt.timedelta(hours=12)) == dt.timedelta(hours=1)
    assert plot.bucket_width(dt.timedelta(days=2)) == dt.timedelta(hours=1)
    assert plot.bucket_width(dt.timedelta(days=30)) == dt.timedelta(days=1)
    wide = plot.bucket_width(dt.timedelta(days=365))
    assert dt.timedelta(days=365) / wide == pytest.approx(plot.MAX_BUCKETS)


def test_the_resource_drawn_is_the_most_used_accelerator_else_cpu() -> None:
    gpu, cpu = report.UsageRow("x"), report.UsageRow("y")
    gpu.resource_seconds.update({"cpu": 9e9, "nvidia.com/gpu": 1.0, "example.com/tpu": 2.0})
    cpu.resource_seconds.update({"cpu": 1.0, "memory": 9e9})
    assert plot.pick_resource([gpu]) == "example.com/tpu"
    assert plot.pick_resource([cpu]) == "cpu"
    assert plot.pick_resource([]) is None


def test_the_figure_draws_each_group_and_is_written_as_an_image(
    engine: db.Engine, tmp_path: Path
) -> None:
    _fill(engine)
    data = plot.series(engine, since=NOW - dt.timedelta(days=3), until=NOW, by="namespace")
    out = tmp_path / "usage.png"
    figure = plot.draw(data, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    over_time, waits = figure.axes
    heights = {
        container.get_label(): [bar.get_height() for bar in container]
        for container in over_time.containers
    }
    assert heights.keys() == data.hours.keys()
    for group, values in data.hours.items():
        assert heights[group] == pytest.approx(values), group
    assert [t.get_text() for t in waits.get_yticklabels()] == ["team-a", "team-b"]
    p95 = [bar.get_width() for bar in waits.containers[1]]
    assert p95 == pytest.approx([600.0, 60.0])
    svg = tmp_path / "usage.svg"
    plot.draw(data, svg)
    assert b"<svg" in svg.read_bytes()[:400]


def test_the_cli_writes_the_plot_and_refuses_a_bad_file(
    store_url: str, engine: db.Engine, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from phalanx.cli.main import main

    recent = workload(
        uid="now",
        cluster_queue="cq-a",
        created=_iso(dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)),
        conditions=[
            condition("QuotaReserved", _iso(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)))
        ],
    )
    db.write_events(engine, ev.events_of(recent))
    out = tmp_path / "week.png"
    assert main(["report", "usage", "--plot", str(out), "--store", store_url]) == 0
    assert out.stat().st_size > 10_000
    assert "cq-a" in capsys.readouterr().out, "the table is printed as well"
    for bad, says in (
        (str(tmp_path / "week.jpg"), ".png, .svg or .pdf"),
        (str(tmp_path / "missing" / "week.png"), "does not exist"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["report", "usage", "--plot", bad, "--store", store_url])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "--plot" in err and says in err, err
