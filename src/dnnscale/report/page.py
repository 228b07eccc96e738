"""The HTML page around the charts: one self-contained file (inline CSS and SVG, no script,
no network at view time), sections, tables and the error band's wording."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1160px; padding: 16px 24px 48px; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.8em; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.sub { color: #555; margin-top: 0; }
.summary { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0; }
.figure { border: 1px solid #ddd; border-radius: 6px; padding: 10px 14px; min-width: 150px; }
.figure .v { font-size: 1.35em; font-weight: 600; }
.figure .k { color: #666; font-size: 0.85em; }
.band { color: #555; font-size: 0.9em; }
.band.none { color: #a15c00; }
table { border-collapse: collapse; margin: 8px 0; font-size: 0.9em; }
th, td { border-bottom: 1px solid #e4e4e4; padding: 4px 10px; text-align: left;
         vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.depth1 td:first-child { padding-left: 28px; color: #444; }
tr.total td { font-weight: 600; border-top: 2px solid #bbb; }
tr.best td { background: #fff6e0; }
.note { color: #555; font-size: 0.88em; max-width: 980px; }
svg.chart { max-width: 100%; height: auto; display: block; margin: 6px 0; }
svg .tick, svg .legend-label, svg .lane-label { fill: #333; }
svg .mark-label, svg .change-label { font-size: 11px; }
details { margin: 8px 0; }
footer { margin-top: 3em; color: #777; font-size: 0.85em; }
"""


def page(title: str, subtitle: str, sections: Iterable[str]) -> str:
    """The whole document."""
    from dnnscale import __version__

    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1><p class=\"sub\">{escape(subtitle)}</p>"
            + "".join(sections)
            + f"<footer>Made by dnnscale {escape(__version__)}. Every number is the model's "
            "prediction unless it says measured; the charts are drawn from the model's own "
            "records, not from traces.</footer></body></html>\n")


def section(anchor: str, heading: str, *content: str) -> str:
    return (f"<section id=\"{escape(anchor)}\"><h2>{escape(heading)}</h2>" + "".join(content)
            + "</section>")


def para(content: str, css: str = "note") -> str:
    return f"<p class=\"{css}\">{escape(content)}</p>"


def figures(items: Sequence[tuple[str, str]]) -> str:
    """Key figures as boxes: (name, value)."""
    return "<div class=\"summary\">" + "".join(
        f"<div class=\"figure\"><div class=\"v\">{escape(value)}</div>"
        f"<div class=\"k\">{escape(name)}</div></div>" for name, value in items) + "</div>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[int] = (),
          row_classes: Sequence[str] | None = None, css: str = "") -> str:
    """A table; the columns with indexes in `numeric` right-aligned."""
    num = ' class="num"'
    head = "".join(f"<th{num if i in numeric else ''}>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = []
    for index, row in enumerate(rows):
        cls = row_classes[index] if row_classes and index < len(row_classes) else ""
        cells = "".join(f"<td{num if i in numeric else ''}>{escape(str(v))}</td>"
                        for i, v in enumerate(row))
        row_attr = f' class="{cls}"' if cls else ""
        body.append(f"<tr{row_attr}>{cells}</tr>")
    table_attr = f' class="{css}"' if css else ""
    return (f"<table{table_attr}><thead><tr>{head}</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def error_band_text(band: dict[str, Any] | None) -> tuple[str, bool]:
    """(wording, validated?) for a prediction's `error_band` ({"median_relative_error",
    "p90_relative_error", "source", "name"}), or the note that this regime has none yet."""
    if not band or not isinstance(band.get("median_relative_error"), (int, float)):
        reason = (band or {}).get("reason") or ("no measured runs of this kind of plan and "
                                                "system to compare with")
        return f"Error band: no validated band for this regime ({reason}).", False
    parts = []
    for key, name in (("median_relative_error", "median"), ("p90_relative_error", "p90")):
        value = band.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{name} ±{100 * value:.1f} %")
    source, name = band.get("source"), band.get("name")
    cited = ": ".join(str(part) for part in (name, source) if part)
    return ("Error band of this regime (predicted vs measured): " + ", ".join(parts)
            + (f" — {cited}" if cited else ""), True)


def band_html(band: dict[str, Any] | None) -> str:
    wording, validated = error_band_text(band)
    return f"<p class=\"band{'' if validated else ' none'}\" id=\"error-band\">{escape(wording)}</p>"
