"""Renders the example notebooks' outputs as a picture for the README (docs/notebooks.png).

Runs each notebook on a headless kernel (static figures: a widget cannot be drawn outside
Jupyter), writes the cells and their outputs as one HTML page (plotly.js from the plotly
package, nothing fetched), and screenshots it with headless Chromium through selenium.

    .venv/bin/python scripts/notebook_picture.py [--out docs/notebooks.png] [--html page.html]
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
PLOTLY = "application/vnd.plotly.v1+json"
# (notebook, the cells shown: their first line starts so); the picture keeps to what reads
# at a glance
SHOWN = [
    ("analysis.ipynb", ("trace.plot.breakdown()", "findings = ", "step = trace.steps",
                        "trace.plot.op_stats")),
    ("compare.ipynb", ("compare_breakdowns(", "run.plot.step_times()")),
]
STATIC = "import neuron_explorer.plot\nneuron_explorer.plot.options.interactive = False"
WIDTH_PX = 1100


def executed(name: str):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(EXAMPLES / name, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(STATIC))
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    return nb.cells[1:]


def inline_markdown(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", text)


def output_html(output: dict, figure_number: list[int]) -> str:
    data = output.get("data", {})
    if PLOTLY in data:
        figure_number[0] += 1
        div = f"figure-{figure_number[0]}"
        spec = json.dumps(data[PLOTLY])
        return (f"<div id='{div}' class='figure'></div><script>(function(){{var f={spec};"
                f"f.layout.width={WIDTH_PX - 60};Plotly.newPlot('{div}',f.data,f.layout,"
                "{staticPlot:true});})();</script>")
    if "text/html" in data:
        return f"<div class='html'>{data['text/html']}</div>"
    if "image/png" in data:
        return f"<img src='data:image/png;base64,{data['image/png']}'>"
    text = output.get("text") or data.get("text/plain", "")
    return f"<pre class='out'>{html.escape(text)}</pre>" if text else ""


def page(notebooks: list[tuple[str, list]]) -> str:
    from plotly.offline import get_plotlyjs

    figure_number = [0]
    parts = []
    for name, cells in notebooks:
        parts.append(f"<h1>examples/{html.escape(name)}</h1>")
        for cell in cells:
            parts.append(f"<pre class='code'>{html.escape(cell.source)}</pre>")
            parts += [output_html(o, figure_number) for o in cell.get("outputs", [])]
    style = (f"body{{font-family:system-ui,sans-serif;width:{WIDTH_PX}px;margin:16px;"
             "color:#1f2933}"
             "h1{font-size:18px;margin:18px 0 6px;border-bottom:1px solid #d5dae0}"
             "pre.code{background:#f5f7fa;border-left:3px solid #2f6db5;padding:6px 10px;"
             "font-size:12px;margin:10px 0 4px}pre.out{font-size:12px}.figure{margin:2px 0}"
             ".html table{border-collapse:collapse;font-size:12px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style>"
            f"<script>{get_plotlyjs()}</script></head><body>{''.join(parts)}</body></html>")


def shown_cells(cells: list, starts: tuple[str, ...]) -> list:
    return [c for c in cells if c.cell_type == "code" and c.source.startswith(starts)]


def screenshot(html_path: Path, out: Path) -> None:
    sys.path.insert(0, str(REPO / "tests" / "webapp"))
    from browser import chromium

    with chromium() as driver:
        driver.set_window_size(WIDTH_PX + 40, 1000)
        driver.get(html_path.resolve().as_uri())
        time.sleep(2)  # plotly draws after load
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(WIDTH_PX + 40, height + 40)
        time.sleep(1)
        png = driver.execute_cdp_cmd("Page.captureScreenshot",
                                     {"captureBeyondViewport": True})["data"]
    out.write_bytes(base64.b64decode(png))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "notebooks.png")
    parser.add_argument("--html", type=Path, default=None, help="also keep the HTML page here")
    args = parser.parse_args()
    notebooks = [(name, shown_cells(executed(name), starts)) for name, starts in SHOWN]
    html_path = args.html or args.out.with_suffix(".html")
    html_path.write_text(page(notebooks))
    try:
        screenshot(html_path, args.out)
    finally:
        if args.html is None:
            html_path.unlink()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
