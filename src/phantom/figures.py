"""Plotly figures for the book: one style, and a renderer that works offline in the static site.

In a notebook call :func:`setup` once. JupyterLab then gets plotly's native mimetype; the built
book gets ``text/html`` that calls the page-level ``Plotly`` (served from ``_static``) instead of
embedding 4.8 MB of plotly.js per figure or loading it from a CDN.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

__all__ = ["ARM_COLORS", "ARM_LABELS", "BookHtmlRenderer", "setup", "style"]

#: One colour per arm everywhere in the book (colour-blind safe, Okabe-Ito).
ARM_COLORS = {
    "none": "#D55E00",      # no filter: vermillion
    "score": "#CC79A7",     # shaped-score gate: reddish purple
    "outcome": "#0072B2",   # binary-outcome gate: blue
    "drgrpo": "#009E73",    # Dr. GRPO: bluish green
    "gspo": "#E69F00",      # GSPO: orange
    "reported": "#7F7F7F",  # numbers reported by the paper: grey
}
ARM_LABELS = {
    "none": "no filter",
    "score": "filter on shaped score",
    "outcome": "filter on binary outcome",
}


class BookHtmlRenderer(MimetypeRenderer):
    """``text/html`` without plotly.js or MathJax: the book page loads ``plotly.min.js`` itself."""

    def __init__(self, config: dict | None = None):
        self.config = dict(config or {})

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, config=self.config, include_plotlyjs=False, include_mathjax=False,
                           full_html=False, default_width="100%", default_height=460, validate=False)
        return {"text/html": html}


pio.renderers["book"] = BookHtmlRenderer(config={"displaylogo": False, "responsive": True})

_TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        paper_bgcolor="white",
        plot_bgcolor="white",
        margin=dict(l=60, r=20, t=50, b=50),
        xaxis=dict(showgrid=True, gridcolor="#EEE", zeroline=False, linecolor="#888", ticks="outside"),
        yaxis=dict(showgrid=True, gridcolor="#EEE", zeroline=False, linecolor="#888", ticks="outside"),
        legend=dict(bgcolor="rgba(255,255,255,0.8)"),
        colorway=list(ARM_COLORS.values()),
    )
)
pio.templates["phantom"] = _TEMPLATE


def setup(renderer: str = "plotly_mimetype+book") -> None:
    """Use the phantom template and the offline-safe renderer (call once per notebook)."""
    pio.templates.default = "plotly_white+phantom"
    if renderer and renderer != "default":
        pio.renderers.default = renderer


def style(fig: go.Figure, *, title: str | None = None, x: str | None = None, y: str | None = None,
          height: int = 420) -> go.Figure:
    """Apply the house style and axis titles (with units) to a figure."""
    fig.update_layout(template="plotly_white+phantom", height=height)
    if title is not None:
        fig.update_layout(title=dict(text=title, x=0.0, xanchor="left"))
    if x is not None:
        fig.update_xaxes(title_text=x)
    if y is not None:
        fig.update_yaxes(title_text=y)
    return fig
