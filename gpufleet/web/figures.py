"""The job page's charts as Plotly figures (JSON the page gives ``Plotly.react``): drawn by Plotly's
own script, which the service serves from the plotly package installed with it (no CDN, no
network), never by hand."""

from __future__ import annotations

import json
from importlib.resources import files

import plotly.graph_objects as go
import plotly.io
from plotly.subplots import make_subplots

PLOTLY_JS = files("plotly") / "package_data" / "plotly.min.js"
METRICS = (("utilization_pct", "utilisation %"), ("memory_pct", "memory used %"), ("power_watts", "power W"),
           ("tensor_active_pct", "tensor cores active %"))


def gpu_figure(series: dict) -> dict:
    """One panel per metric, one line per GPU, the time axis shared and zoomable together. The
    layout is Plotly's (``make_subplots``, validated); the traces are given as Plotly's own JSON
    form, unvalidated: validating 64 GPUs x 4 metrics x 600 points took 1.4 s of the page's time."""
    fig = make_subplots(rows=len(METRICS), cols=1, shared_xaxes=True, vertical_spacing=0.04,
                        subplot_titles=[label for _, label in METRICS])
    fig.update_layout(height=820, margin={"l": 50, "r": 20, "t": 40, "b": 30}, hovermode="x unified",
                      legend={"title": {"text": "GPU"}})
    fig.update_xaxes(type="date")  # the points' times are epoch ms
    layout = json.loads(plotly.io.to_json(fig))["layout"]
    traces = [{"type": "scatter", "mode": "lines", "x": gpu["t"], "y": gpu[key], "name": gpu["gpu"],
               "legendgroup": gpu["gpu"], "showlegend": row == 1, "connectgaps": False,
               "xaxis": "x" if row == 1 else f"x{row}", "yaxis": "y" if row == 1 else f"y{row}"}
              for row, (key, _) in enumerate(METRICS, start=1) for gpu in series["gpus"]]
    return {"data": traces, "layout": layout}


def waterfall_figure(rows: list[dict]) -> dict:
    """Where the GPU-hours went: a bar per goodput bucket."""
    fig = go.Figure(go.Bar(x=[r["label"] for r in rows], y=[r["gpu_hours"] for r in rows],
                           text=[f"{r['share_pct']:.1f}%" for r in rows], textposition="auto",
                           marker={"color": ["#2a9d8f" if r["bucket"] == "productive" else
                                             "#adb5bd" if r["bucket"] in ("unobserved", "unclassified") else
                                             "#e76f51" for r in rows]}))
    fig.update_layout(height=320, margin={"l": 50, "r": 20, "t": 20, "b": 80}, yaxis={"title": {"text": "GPU-hours"}})
    return json.loads(plotly.io.to_json(fig))


# A replica's window as the worker judged it by its traffic, and its colour on the page.
STATES = (("BUSY", "near its capacity", "#2a9d8f"), ("HEADROOM", "below its capacity", "#8ecae6"),
          ("SATURATED", "requests waited", "#e9c46a"), ("IDLE", "no request", "#e76f51"))


def traffic_figure(serving: dict) -> dict:
    """A serving replica's requests a second over its life: a bar per step, coloured by how its
    windows were judged (a trace per state, so that the legend names them), and the capacity it
    was judged against."""
    fig = go.Figure()
    for state, meaning, colour in STATES:
        picked = [i for i, s in enumerate(serving["state"]) if s == state]
        if picked:
            fig.add_trace(go.Bar(x=[serving["t"][i] for i in picked], y=[serving["requests_per_s"][i] for i in picked],
                                 name=f"{state.lower()} ({meaning})", marker={"color": colour}))
    if serving["capacity_per_s"] and serving["t"]:
        fig.add_trace(go.Scatter(x=[serving["t"][0], serving["t"][-1]], y=[serving["capacity_per_s"]] * 2,
                                 mode="lines", name="capacity", line={"dash": "dash", "color": "#264653"}))
    fig.update_layout(height=300, margin={"l": 50, "r": 20, "t": 20, "b": 30}, barmode="overlay", bargap=0,
                      xaxis={"type": "date"}, yaxis={"title": {"text": "requests/s"}})
    return json.loads(plotly.io.to_json(fig))


def service_figure(service: dict) -> dict:
    """A service over time: its requests a second (bars), and the replicas that held GPUs for it,
    those that served a request, and the replicas its busiest span needed (lines, on their own axis)."""
    chart = service["chart"]
    fig = go.Figure(go.Bar(x=chart["t"], y=chart["requests_per_s"], name="requests/s", marker={"color": "#8ecae6"}))
    fig.add_trace(go.Scatter(x=chart["t"], y=chart["held"], name="replicas held", mode="lines",
                             line={"shape": "hv", "color": "#e76f51"}, yaxis="y2"))
    fig.add_trace(go.Scatter(x=chart["t"], y=chart["served"], name="replicas that served", mode="lines",
                             line={"shape": "hv", "color": "#2a9d8f", "width": 5}, yaxis="y2"))  # (under the need)
    if chart["t"]:
        fig.add_trace(go.Scatter(x=[chart["t"][0], chart["t"][-1]], y=[service["replicas_needed"]] * 2,
                                 name=f"replicas its peak needed (+{service['margin']:.0%})", mode="lines",
                                 line={"dash": "dash", "color": "#264653"}, yaxis="y2"))
    fig.update_layout(height=320, margin={"l": 50, "r": 50, "t": 20, "b": 30}, bargap=0, xaxis={"type": "date"},
                      yaxis={"title": {"text": "requests/s"}},
                      yaxis2={"title": {"text": "replicas"}, "overlaying": "y", "side": "right", "rangemode": "tozero"})
    return json.loads(plotly.io.to_json(fig))
