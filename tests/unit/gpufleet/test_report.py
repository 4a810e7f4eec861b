"""The fleet report: numbers from the tables, one self-contained HTML file, and -- where
Chromium is installed (.ci/run installs it) -- a headless rendering that shows the charts."""

import re
import shutil
import subprocess
from collections import defaultdict

import pytest

from gpufleet.reports.fleet import gather, render
from schemas.vocabulary import wasted_seconds
from sinks.write_clickhouse import ClickHouseWriter
from tests.support.fleet_data import build, store


@pytest.fixture(scope="module")
def report(chdb_client):
    data = build()
    store(ClickHouseWriter(chdb_client, "report"), data)
    numbers = gather(chdb_client, "report", "7d")
    yield data, numbers, render(numbers)
    chdb_client.command("DROP DATABASE IF EXISTS report")


def test_the_numbers_come_from_the_samples(report):
    data, numbers, _ = report
    gpu = sum(s["interval_ms"] / 1000 * (s.get("share") or 1) for s in data.samples) / 3600
    busy = sum(s["interval_ms"] / 1000 * (s.get("share") or 1) * s["utilization_pct"] / 100
               for s in data.samples) / 3600
    # every window of this fleet has closed: allocated = the samples' GPU-hours
    assert numbers["allocated_gpu_hours"] == pytest.approx(gpu)
    assert numbers["utilisation_pct"] == pytest.approx(100 * busy / gpu, rel=1e-5)
    assert numbers["workflows"] == len(data.fleet.workflows)
    assert sum(numbers["distribution"]) == len(data.windows)
    per_team = defaultdict(float)
    for w in data.windows:
        per_team[w["team"]] += wasted_seconds(w)
    got = {team: sum(v for _, v in pts) for team, pts in numbers["wasted_by_team"].items()}
    assert got == pytest.approx({t: v / 3600 for t, v in per_team.items()}, rel=1e-5)
    assert numbers["wasted_gpu_hours"] == pytest.approx(sum(per_team.values()) / 3600)
    assert numbers["startup_gpu_hours"] == pytest.approx(sum(data.waste["startup"].values()) / 3600)
    assert numbers["idle_gpu_hours"] == pytest.approx(sum(data.waste["idle"].values()) / 3600)
    assert numbers["goodput_pct"] == pytest.approx(100 * (1 - numbers["wasted_gpu_hours"] / gpu))
    # The goodput waterfall by team holds each team's allocated GPU-hours, bucket by bucket.
    allocated = defaultdict(float)
    for s in data.samples:
        allocated[s["team"]] += s["interval_ms"] / 1000 * (s.get("share") or 1) / 3600
    assert {team: sum(values) for team, values in numbers["goodput_by_team"]} == pytest.approx(dict(allocated))
    assert sum(sum(v) for _, v in numbers["goodput_by_hour"]) == pytest.approx(gpu)
    # No GPU of this fleet reports tensor activity: the MFU chart says how many windows lack it.
    assert numbers["windows_without_gpm"] == numbers["windows"] == len(data.windows)


def test_the_page_is_self_contained(report):
    _, numbers, page = report
    # distribution, wasted by team, goodput by team and over time; no alerts nor tensor activity in
    # this data: a note instead of those charts
    assert page.count("<svg") == 4
    assert not re.search(r"""(src|href)=["']?https?:""", page) and "<script" not in page
    assert f"{numbers['allocated_gpu_hours']:,.2f}" in page and f"{numbers['wasted_gpu_hours']:,.2f}" in page
    assert page.count("no data in this period") == 2  # the alert and MFU charts, honestly empty
    assert f"{numbers['windows_without_gpm']} of {numbers['windows']} windows" in page


@pytest.mark.skipif(not shutil.which("chromium"), reason="Chromium is not installed (.ci/run installs it)")
def test_headless_chromium_renders_the_charts(report, tmp_path):
    from PIL import Image

    *_, page = report
    html = tmp_path / "report.html"
    html.write_text(page)
    png = tmp_path / "report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars", "--window-size=1400,1000",
         f"--screenshot={png}", html.as_uri()],
        check=True, capture_output=True, timeout=120)
    image = Image.open(png).convert("RGB")
    assert image.size == (1400, 1000)
    colors = image.getcolors(maxcolors=1 << 20)
    # The bar colour of the distribution and the team lines are on the page, in quantity.
    counts = {rgb: n for n, rgb in colors}
    assert counts.get((0x3B, 0x6F, 0xB6), 0) > 2000
    assert counts.get((0xE0, 0x7B, 0x39), 0) > 100


def text_boxes(svg: str) -> list[tuple[float, float, str]]:
    """Each text of an SVG chart: (top, baseline, text), from its y and font size (an attribute,
    or the ``font:`` shorthand of its style)."""
    boxes = []
    for attrs, text in re.findall(r"<text([^>]*)>([^<]*)</text>", svg):
        y = re.search(r'\by="([-\d.]+)"|translate\([-\d.]+[ ,]+([-\d.]+)\)', attrs)
        y = float(y.group(1) or y.group(2))
        size = re.search(r'font-size[=:]\s*"?([\d.]+)|font:\s*(?:\w+\s+)*?([\d.]+)px', attrs)
        size = float(size.group(1) or size.group(2))
        boxes.append((y - size, y, text))
    return boxes


def svg_height(svg: str) -> float:
    viewbox = re.search(r'viewBox="[-\d.]+ [-\d.]+ [\d.]+ ([\d.]+)"', svg)
    return float(viewbox.group(1) if viewbox else re.search(r'<svg[^>]*\bheight="([\d.]+)', svg).group(1))


@pytest.mark.parametrize("chart", ["bars", "lines", "stacks"])
def test_no_label_of_a_chart_is_clipped(chart):
    """Issue 21, seen in headless Chromium: the value labels were cut at the top of the tallest
    bar. Every text of every chart lies inside the drawing."""
    from datetime import UTC, datetime

    from gpufleet.reports.fleet import bar_chart, line_chart, stacked_bars

    t = [datetime(2026, 1, 1, h, tzinfo=UTC) for h in range(6)]
    svg = {"bars": lambda: bar_chart(["0-10%", "10-20%", "20-30%"], [120.0, 4500.0, 33.0], "workflow-minutes"),
           "lines": lambda: line_chart({"vision": [(x, 10.0 * i) for i, x in enumerate(t)],
                                        "nlp": [(x, 3.0) for x in t]}, "GPU-hours"),
           "stacks": lambda: stacked_bars(["vision", "nlp"], {"idle": [5.0, 1.0], "productive": [40.0, 9.0]},
                                          "GPU-hours")}[chart]()
    boxes, height = text_boxes(svg), svg_height(svg)
    assert boxes
    clipped = [(top, base, text) for top, base, text in boxes if top < 0 or base > height]
    assert not clipped, clipped


@pytest.mark.skipif(not shutil.which("chromium"), reason="Chromium is not installed (.ci/run installs it)")
def test_each_chart_area_is_drawn_in_headless_chromium(report, tmp_path):
    """Each chart of the report, alone in a cell of known place and size, rendered by Chromium:
    every cell has its chart's colours, in quantity, and nothing drawn outside its cell."""
    from PIL import Image

    from gpufleet.reports.fleet import PALETTE, bar_chart, line_chart, stacked_bars
    from schemas.goodput_buckets import BUCKETS

    _, numbers, _ = report
    charts = [
        bar_chart([f"{10 * b}%" for b in range(10)], numbers["distribution"], "workflow-minutes"),
        line_chart(numbers["wasted_by_team"], "GPU-hours"),
        stacked_bars([t for t, _ in numbers["goodput_by_team"]],
                     {b: [v[i] for _, v in numbers["goodput_by_team"]] for i, b in enumerate(BUCKETS)}, "GPU-hours"),
        stacked_bars([t for t, _ in numbers["goodput_by_hour"]],
                     {b: [v[i] for _, v in numbers["goodput_by_hour"]] for i, b in enumerate(BUCKETS)}, "GPU-hours"),
    ]
    cell_w, cell_h = 700, 320
    cells = "".join(f'<div style="position:absolute;left:{(i % 2) * cell_w}px;top:{(i // 2) * cell_h}px;'
                    f'width:{cell_w}px;height:{cell_h}px;overflow:hidden">{svg}</div>' for i, svg in enumerate(charts))
    html = tmp_path / "charts.html"
    html.write_text(f"<!DOCTYPE html><html><body style='margin:0;background:#fff'>{cells}</body></html>")
    png = tmp_path / "charts.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={2 * cell_w},{2 * cell_h}",
         f"--screenshot={png}", html.as_uri()], check=True, capture_output=True, timeout=120)
    image = Image.open(png).convert("RGB")
    palette = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in PALETTE}
    for i in range(4):
        cell = image.crop(((i % 2) * cell_w, (i // 2) * cell_h, (i % 2 + 1) * cell_w, (i // 2 + 1) * cell_h))
        counts = {rgb: n for n, rgb in cell.getcolors(maxcolors=1 << 20)}
        drawn = sum(n for rgb, n in counts.items() if rgb != (255, 255, 255))
        coloured = sum(n for rgb, n in counts.items() if rgb in palette)
        assert drawn > 0.02 * cell_w * cell_h and coloured > 200, (i, drawn, coloured)
