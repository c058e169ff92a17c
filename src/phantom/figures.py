"""Plotly figures for the book: one style, captions, client-side sliders, an offline renderer.

Chapters call :func:`setup` once and :func:`show` for every figure. Inside the book build
(``PHANTOM_BOOK=1``, set by :mod:`phantom.book`) a figure becomes one ``text/html`` output: a
``<figure>`` holding the plotly div, the call to the page-level ``Plotly`` (served from
``_static/vendor``, never a CDN) and a ``<figcaption>``. In JupyterLab the same call shows plotly's
native mimetype followed by the caption, so one chapter source serves both.

Sliders that a reader of the static book needs are plotly ``layout.sliders`` (they run in the
browser, without a kernel); :func:`add_slider` builds them. plotly.js >= 3 blanks a title set with
``{"title": "..."}`` in slider arguments, so titles always go through ``{"title.text": ...}``.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.io._base_renderers import MimetypeRenderer

__all__ = [
    "ARM_COLORS",
    "ARM_LABELS",
    "ESTIMATOR_COLORS",
    "REPORTED_MARKER",
    "AXIS",
    "BookHtmlRenderer",
    "in_book",
    "setup",
    "style",
    "figure_html",
    "caption_html",
    "show",
    "title_update",
    "add_slider",
    "table",
]

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
#: Estimator colours for the arithmetic chapters (std-normalized GRPO vs centred-only Dr. GRPO).
ESTIMATOR_COLORS = {"grpo": "#D55E00", "drgrpo": "#009E73"}
#: Numbers reported by a paper are drawn as open grey diamonds, never like our own results.
REPORTED_MARKER = dict(symbol="diamond-open", size=11, color=ARM_COLORS["reported"], line=dict(width=2))
#: Axis titles with their units, shared so every chapter names quantities the same way.
AXIS = {
    "adv": "advantage A (dimensionless)",
    "len_chars": "response length (characters)",
    "len_tokens": "response length (tokens)",
    "score": "shaped score r (reward units)",
    "lam": "shaping weight λ (reward units)",
    "step": "training step (optimizer updates)",
    "acc": "accuracy (fraction correct)",
    "frac_groups": "groups (fraction of the batch)",
    "response": "response in the group (#)",
}

_BOOK_ENV = "PHANTOM_BOOK"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def in_book() -> bool:
    """True while :mod:`phantom.book` executes the chapter (offline HTML outputs only)."""
    return os.environ.get(_BOOK_ENV) == "1"


def figure_html(fig: go.Figure | Mapping[str, Any], name: str | None = None, *, height: int | None = None) -> str:
    """The plotly div and its ``Plotly.newPlot`` call, without plotly.js or MathJax.

    A fixed ``name`` gives a stable element id (``fig-<name>``): executed notebooks stay byte-identical
    across runs, and tests can find a figure on the page.
    """
    fig_dict = fig.to_dict() if isinstance(fig, go.Figure) else dict(fig)
    div_id = f"fig-{name}" if name else None
    if height is None:
        height = (fig_dict.get("layout") or {}).get("height") or 460
    return pio.to_html(fig_dict, config=_PLOT_CONFIG, include_plotlyjs=False, include_mathjax=False,
                       full_html=False, default_width="100%", default_height=height, validate=False,
                       div_id=div_id)


class BookHtmlRenderer(MimetypeRenderer):
    """``text/html`` without plotly.js or MathJax: the book page loads ``vendor/plotly.min.js`` itself."""

    def __init__(self, config: dict | None = None):
        self.config = dict(config or {})

    def to_mimebundle(self, fig_dict):
        return {"text/html": figure_html(fig_dict)}


pio.renderers["book"] = BookHtmlRenderer(config=_PLOT_CONFIG)

_TEMPLATE = go.layout.Template(
    layout=dict(
        font=dict(family="Inter, Helvetica, Arial, sans-serif", size=13),
        paper_bgcolor="white",
        plot_bgcolor="white",
        # the top margin leaves the mode bar (top right, on hover) a row of its own above the title
        margin=dict(l=60, r=20, t=78, b=50),
        title=dict(y=0.985, yanchor="top", yref="container", pad=dict(t=30)),
        xaxis=dict(showgrid=True, gridcolor="#EEE", zeroline=False, linecolor="#888", ticks="outside"),
        yaxis=dict(showgrid=True, gridcolor="#EEE", zeroline=False, linecolor="#888", ticks="outside"),
        legend=dict(bgcolor="rgba(255,255,255,0.8)"),
        colorway=list(ARM_COLORS.values()),
    )
)
pio.templates["phantom"] = _TEMPLATE


def setup(renderer: str | None = None) -> None:
    """Use the phantom template and a renderer that suits where the chapter runs (call once).

    Default: ``book`` inside the book build, ``plotly_mimetype`` elsewhere (JupyterLab, VS Code).
    """
    pio.templates.default = "plotly_white+phantom"
    if renderer is None:
        renderer = "book" if in_book() else "plotly_mimetype"
    if renderer != "default":
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


def caption_markup(caption: str) -> str:
    """Caption text as HTML: escaped, with ``*emphasis*`` and ``` `code` ``` kept as markup.

    Figure and table captions are raw HTML in the page (MyST never sees them), so the inline markup
    chapter authors write in them must be turned into tags here or it shows as literal backticks.
    """
    text = html.escape(caption.strip())
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", text)


def caption_html(caption: str, number: str | None = None) -> str:
    """``<figcaption>`` of a figure: :func:`caption_markup` after a bold "Figure N."."""
    head = f"<strong>Figure {html.escape(str(number))}.</strong> " if number else ""
    return f'<figcaption class="phantom-caption">{head}{caption_markup(caption)}</figcaption>'


def show(fig: go.Figure, caption: str, *, number: str | None = None, name: str | None = None) -> None:
    """Display a figure with its caption (every book figure goes through here).

    Raises ``ValueError`` for an empty caption or a figure whose cartesian axes lack titles, so a
    figure without units cannot reach the book.
    """
    from IPython.display import HTML, Markdown, display

    if not caption or not caption.strip():
        raise ValueError("every book figure needs a caption")
    if name is not None and not _NAME_RE.match(name):
        raise ValueError(f"name={name!r} is invalid; allowed: lowercase letters, digits and '-'")
    _check_axis_titles(fig)
    if in_book():
        div = figure_html(fig, name)
        anchor = f' id="figure-{name}"' if name else ""
        display(HTML(f'<figure class="phantom-figure"{anchor}>{div}{caption_html(caption, number)}</figure>'))
    else:
        fig.show()
        head = f"**Figure {number}.** " if number else ""
        display(Markdown(f"{head}{caption.strip()}"))


def _check_axis_titles(fig: go.Figure) -> None:
    layout = fig.layout
    cartesian = any(getattr(t, "type", "scatter") in ("scatter", "bar", "histogram", "box", "heatmap")
                    for t in fig.data)
    if not cartesian:
        return
    for key in [k for k in layout.to_plotly_json() if re.fullmatch(r"[xy]axis\d*", k)] or ["xaxis", "yaxis"]:
        axis = layout[key]
        if axis.visible is False or axis.matches:  # hidden, or shares a titled axis (subplots)
            continue
        if not (axis.title and axis.title.text):
            raise ValueError(f"{key} has no title; give every axis a title with its unit")


def title_update(text: str) -> dict[str, str]:
    """Layout update that sets the title in slider/button args (plotly.js >= 3 needs ``title.text``)."""
    return {"title.text": text}


def add_slider(fig: go.Figure, labels: Sequence[str], data: Sequence[Mapping[str, Sequence[Any]]], *,
               traces: Sequence[int] | None = None, titles: Sequence[str] | None = None,
               prefix: str = "", active: int = 0, y: float = -0.18) -> go.Figure:
    """Attach a client-side slider: step ``i`` restyles ``traces`` with ``data[i]`` (and the title).

    ``data[i]`` maps a trace attribute (``"y"``, ``"x"``, ``"text"``...) to one value per trace in
    ``traces``. The figure's traces should already hold step ``active``'s values, so the page opens
    in a state the slider can return to.
    """
    if not labels or len(labels) != len(data):
        raise ValueError(f"labels ({len(labels)}) and data ({len(data)}) must be non-empty and equally long")
    if titles is not None and len(titles) != len(labels):
        raise ValueError(f"titles ({len(titles)}) must match labels ({len(labels)})")
    if not 0 <= active < len(labels):
        raise ValueError(f"active={active} is out of range; allowed: 0..{len(labels) - 1}")
    idx = list(range(len(fig.data))) if traces is None else list(traces)
    steps = []
    for i, (label, upd) in enumerate(zip(labels, data)):
        restyle: dict[str, list[Any]] = {}
        for attr, values in upd.items():
            values = list(values)
            if len(values) != len(idx):
                raise ValueError(f"step {label!r}: {attr} has {len(values)} values for {len(idx)} traces")
            restyle[attr] = [list(v) if hasattr(v, "__len__") and not isinstance(v, str) else v for v in values]
        layout = title_update(titles[i]) if titles is not None else {}
        steps.append(dict(method="update", label=str(label), args=[restyle, layout, idx]))
    fig.update_layout(sliders=[dict(active=active, steps=steps, pad=dict(t=10, b=10), y=y, yanchor="top",
                                    currentvalue=dict(prefix=prefix, font=dict(size=14)), len=1.0, x=0.0)])
    fig.update_layout(margin=dict(b=max(fig.layout.margin.b or 50, 140)))
    return fig


def table(df: Any, caption: str, *, number: str | None = None, precision: int = 3, index: bool = False,
          formats: Mapping[str, str] | None = None) -> None:
    """Display a DataFrame as a captioned HTML table (the same in the book and in JupyterLab)."""
    from IPython.display import HTML, display

    if not caption or not caption.strip():
        raise ValueError("every book table needs a caption")
    styler = df.style.format(precision=precision, na_rep="–")
    if formats:
        styler = styler.format(dict(formats), na_rep="–")
    if not index:
        styler = styler.hide(axis="index")
    head = f"Table {html.escape(str(number))}. " if number else ""
    styler = styler.set_caption(f"{head}{caption_markup(caption)}").set_table_attributes('class="phantom-table"')
    display(HTML(styler.to_html()))
