"""Render a report (a list of titled sections) as text, Markdown or HTML.

A section holds key/value pairs (dict), a table (DataFrame) or bullet lines
(list of str). Reports and diffs build sections; this module only formats them.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd
from neuron_explorer.units import duration

FORMATS = ("text", "json", "md", "html")


@dataclass
class Section:
    """One titled block of a report."""

    title: str
    content: dict[str, Any] | pd.DataFrame | list[str]


def fmt_value(value: Any) -> str:
    """Numbers short and readable; None and NaN as '-'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def fmt_ns(ns: Any) -> str:
    """A duration in ns for the report's tables (4 significant digits)."""
    return duration(ns, digits=4)


def fmt_share(x: Any) -> str:
    """A 0..1 share as a percentage."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * float(x):.1f}%"


def _cells(frame: pd.DataFrame) -> list[list[str]]:
    return [[fmt_value(v) for v in row] for row in frame.itertuples(index=False)]


def to_text(title: str, sections: list[Section]) -> str:
    lines = [title, "=" * len(title), ""]
    for s in sections:
        lines += [s.title, "-" * len(s.title)]
        if isinstance(s.content, dict):
            width = max((len(k) for k in s.content), default=0)
            lines += [f"{k.ljust(width)}  {fmt_value(v)}" for k, v in s.content.items()]
        elif isinstance(s.content, pd.DataFrame):
            if not len(s.content):
                lines.append("(none)")
            else:
                head = [str(c) for c in s.content.columns]
                rows = _cells(s.content)
                widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
                widths = [min(w, 60) for w in widths]
                lines.append("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)))
                for r in rows:
                    lines.append("  ".join(c[:w].ljust(w) for c, w in zip(r, widths,
                                                                            strict=True)))
        else:
            lines += [f"- {line}" for line in s.content] or ["(none)"]
        lines.append("")
    return "\n".join(lines)


def to_markdown(title: str, sections: list[Section]) -> str:
    lines = [f"# {_md(title)}", ""]
    for s in sections:
        lines += [f"## {_md(s.title)}", ""]
        if isinstance(s.content, dict):
            lines += ["| | |", "| --- | --- |"]
            lines += [f"| {_md(k)} | {_md(fmt_value(v))} |" for k, v in s.content.items()]
        elif isinstance(s.content, pd.DataFrame):
            if not len(s.content):
                lines.append("(none)")
            else:
                cols = [_md(str(c)) for c in s.content.columns]
                lines.append("| " + " | ".join(cols) + " |")
                lines.append("| " + " | ".join("---" for _ in cols) + " |")
                lines += ["| " + " | ".join(_md(c) for c in r) + " |" for r in _cells(s.content)]
        else:
            lines += [f"- {_md(line)}" for line in s.content] or ["(none)"]
        lines.append("")
    return "\n".join(lines)


_MD_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def _md(text: str) -> str:
    """Text from the trace (names, paths) as literal Markdown: HTML tags, links, emphasis
    and table pipes shown as written, never interpreted; one line."""
    text = html.escape(str(text), quote=False)
    return _MD_SPECIAL.sub(r"\\\1", text).replace("\r", " ").replace("\n", " ")


def to_html(title: str, sections: list[Section]) -> str:
    e = html.escape
    body = [f"<h1>{e(title)}</h1>"]
    for s in sections:
        body.append(f"<h2>{e(s.title)}</h2>")
        if isinstance(s.content, dict):
            body.append("<table>" + "".join(
                f"<tr><th>{e(k)}</th><td>{e(fmt_value(v))}</td></tr>"
                for k, v in s.content.items()) + "</table>")
        elif isinstance(s.content, pd.DataFrame):
            if not len(s.content):
                body.append("<p>(none)</p>")
            else:
                head = "".join(f"<th>{e(str(c))}</th>" for c in s.content.columns)
                rows = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                               for r in _cells(s.content))
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        else:
            body.append("<ul>" + "".join(f"<li>{e(line)}</li>" for line in s.content) + "</ul>")
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}"
             "table{border-collapse:collapse;margin:.5em 0}"
             "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
             "th{background:#f4f4f4}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>")


def render(title: str, sections: list[Section], fmt: str) -> str:
    """Text, Markdown or HTML (JSON is built from the report's dict, not from sections)."""
    if fmt == "text":
        return to_text(title, sections)
    if fmt == "md":
        return to_markdown(title, sections)
    if fmt == "html":
        return to_html(title, sections)
    raise ValueError(f"unknown format {fmt!r}")
