"""phantom.figures: the offline renderer, captions, axis titles, client-side sliders."""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
import pytest

from phantom import figures


def bar_fig() -> go.Figure:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1.0, -1.0]))
    return figures.style(fig, title="t", x="response (index)", y="advantage (dimensionless)")


def test_figure_html_has_no_plotly_js_no_cdn_and_a_stable_id():
    html = figures.figure_html(bar_fig(), "demo")
    assert 'id="fig-demo"' in html and "Plotly.newPlot" in html
    assert "cdn." not in html and "<script src" not in html
    assert len(html) < 20_000, "plotly.js must not be embedded"
    assert figures.figure_html(bar_fig(), "demo") == html  # deterministic: cacheable, diffable


def test_book_renderer_is_registered_and_offline():
    bundle = pio.renderers["book"].to_mimebundle(bar_fig().to_dict())
    assert list(bundle) == ["text/html"] and "cdn." not in bundle["text/html"]


def test_setup_picks_the_renderer_from_the_environment(monkeypatch):
    monkeypatch.setenv("PHANTOM_BOOK", "1")
    figures.setup()
    assert pio.renderers.default == "book" and figures.in_book()
    monkeypatch.delenv("PHANTOM_BOOK")
    figures.setup()
    assert pio.renderers.default == "plotly_mimetype" and not figures.in_book()


def test_show_in_the_book_emits_one_captioned_figure(monkeypatch):
    shown = []
    monkeypatch.setenv("PHANTOM_BOOK", "1")
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    figures.show(bar_fig(), "A caption with *emphasis* & `code`.", number="2.1", name="demo")
    (html,) = [o.data for o in shown]
    assert html.startswith('<figure class="phantom-figure" id="figure-demo">')
    assert "<strong>Figure 2.1.</strong> A caption with <em>emphasis</em> &amp; <code>code</code>." in html


def test_show_in_jupyterlab_uses_the_plotly_mimetype_and_a_markdown_caption(monkeypatch):
    shown, plotted = [], []
    monkeypatch.delenv("PHANTOM_BOOK", raising=False)
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    monkeypatch.setattr(go.Figure, "show", lambda self, *a, **k: plotted.append(self))
    figures.show(bar_fig(), "caption", number="1.1")
    assert len(plotted) == 1 and shown[0].data == "**Figure 1.1.** caption"


@pytest.mark.parametrize("caption", ["", "   "])
def test_show_refuses_a_figure_without_caption(caption):
    with pytest.raises(ValueError, match="caption"):
        figures.show(bar_fig(), caption)


def test_show_refuses_untitled_axes_but_accepts_shared_subplot_axes():
    fig = go.Figure(go.Scatter(x=[0, 1], y=[0, 1]))
    with pytest.raises(ValueError, match="xaxis has no title"):
        figures.show(fig, "caption")
    from plotly.subplots import make_subplots

    sub = make_subplots(rows=1, cols=2, shared_yaxes=True)
    sub.add_bar(x=[1], y=[1], row=1, col=1)
    sub.add_bar(x=[1], y=[1], row=1, col=2)
    sub.update_xaxes(title_text="x (units)")
    sub.update_yaxes(title_text="y (units)", row=1, col=1)
    figures._check_axis_titles(sub)  # yaxis2 matches yaxis: no title needed


def test_show_rejects_bad_names():
    with pytest.raises(ValueError, match="name="):
        figures.show(bar_fig(), "c", name="Bad Name!")


def test_add_slider_builds_update_steps_with_dotted_title_keys():
    fig = bar_fig()
    fig.add_bar(x=["a", "b"], y=[0.5, 0.5])
    ys = [np.array([1.0, -1.0]), np.array([2.0, -2.0])]
    figures.add_slider(fig, ["0.1", "0.3"], [{"y": [y, y / 2]} for y in ys], titles=["λ = 0.1", "λ = 0.3"],
                       prefix="λ = ", active=1)
    slider = fig.layout.sliders[0]
    assert slider.active == 1 and [s.label for s in slider.steps] == ["0.1", "0.3"]
    step = json.loads(pio.to_json(fig))["layout"]["sliders"][0]["steps"][0]
    assert step["method"] == "update"
    data, layout, traces = step["args"]
    assert layout == {"title.text": "λ = 0.1"} and "title" not in layout  # plotly.js >= 3 blanks {"title": ...}
    assert traces == [0, 1] and data["y"] == [[1.0, -1.0], [0.5, -0.5]]


@pytest.mark.parametrize(("labels", "data", "kw", "match"), [
    (["a"], [], {}, "equally long"),
    (["a"], [{"y": [[1], [2]]}], {"traces": [0]}, "2 values for 1 traces"),
    (["a", "b"], [{"y": [[1]]}, {"y": [[2]]}], {"traces": [0], "titles": ["x"]}, "titles"),
    (["a"], [{"y": [[1]]}], {"traces": [0], "active": 3}, "active=3"),
])
def test_add_slider_validates(labels, data, kw, match):
    with pytest.raises(ValueError, match=match):
        figures.add_slider(bar_fig(), labels, data, **kw)


def test_title_update_uses_the_dotted_key():
    assert figures.title_update("x") == {"title.text": "x"}


def test_table_needs_a_caption_and_renders_it(monkeypatch):
    import pandas as pd

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    figures.table(pd.DataFrame({"a": [1.23456]}), "My caption", number="2.1", precision=2)
    assert "Table 2.1. My caption" in shown[0].data and "1.23" in shown[0].data and 'class="phantom-table"' in shown[0].data
    with pytest.raises(ValueError, match="caption"):
        figures.table(pd.DataFrame({"a": [1]}), "")


def test_table_caption_markup_is_html_not_literal_backticks(monkeypatch):
    import pandas as pd

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    figures.table(pd.DataFrame({"a": [1]}), "Clip rate (`actor/pg_clipfrac`) for a < b, *mean*", number="7.3")
    assert "Table 7.3. Clip rate (<code>actor/pg_clipfrac</code>) for a &lt; b, <em>mean</em>" in shown[0].data
    assert "`" not in shown[0].data


def test_axis_names_carry_units():
    for key, text in figures.AXIS.items():
        assert "(" in text and ")" in text, f"AXIS[{key!r}] = {text!r} names no unit"
