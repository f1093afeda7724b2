"""Generation: the prefill and decode steps of a model generating tokens, each token's time,
what bounds each part (MFU for the prompt, MBU for the decode steps) and the KV cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import dash
import pandas as pd
from dash import html
from neuron_explorer.analyses.phases import without_cache
from neuron_explorer.plot.generation import NO_GENERATION, kv_cache_figure, token_figure
from neuron_explorer.webapp import formatting as fmt
from neuron_explorer.webapp.components import data_table, graph, metric, notice, page_title, section
from neuron_explorer.webapp.page_data import fetch

if TYPE_CHECKING:
    from neuron_explorer.trace import Trace
    from neuron_explorer.webapp.context import AppContext

PATH = "/generation"
TITLE = "Generation"


def layout(trace: Trace, name: str, params: dict[str, str], ctx: AppContext) -> html.Div:
    parts: list = [page_title(TITLE, name)]
    serving = fetch(trace.serving, "generation figures")
    if serving.empty:
        return html.Div([*parts, section("Tokens", notice(
            f"{NO_GENERATION[0].upper()}{NO_GENERATION[1:]}: a model called once for a "
            "prompt and then once per new token (a KV cache or a growing input) shows here, "
            "or calls marked with neuron_explorer.phase('prefill') and phase('decode')."))])
    if serving.value is None:
        return html.Div([*parts, section("Tokens", notice(str(serving.missing)))])
    parts.append(_metrics(serving.value))
    tokens = fetch(trace.token_times, "token times")
    parts.append(section(
        "Tokens", graph(token_figure(tokens.value), "generation-tokens")
        if tokens.value is not None else notice(str(tokens.missing)),
        subtitle="The first bar of a generation is its time to first token (the prefill); "
                 "each later one the time per output token (a decode step)"))
    held = fetch(trace.kv_cache, "KV cache from the allocator")
    if all(without_cache(c) for c in serving.value["kv_cache"]):
        shown = notice("No KV cache: each call feeds the whole sequence so far, so every step "
                       "computes the keys and values of every position again.")
    elif held.value is not None:
        shown = graph(kv_cache_figure(held.value), "generation-kv-cache")
    else:
        shown = notice(str(held.missing))
    parts.append(section(
        "KV cache", shown,
        subtitle="Device memory held through each step over what its prefill held"))
    parts.append(section("Per generation", data_table(
        _readable(serving.value), "generation-table", page_size=10)))
    return html.Div(parts)


def _metrics(serving: pd.DataFrame) -> html.Div:
    """The first generation's figures (the table below lists every one)."""
    g = serving.iloc[0]
    more = f" (generation 0 of {len(serving)})" if len(serving) > 1 else ""
    return html.Div([
        metric("time to first token", fmt.duration(g["ttft_ns"]), f"the prefill{more}"),
        metric("per output token", fmt.duration(g["tpot_median_ns"]),
               f"median; p90 {fmt.duration(g['tpot_p90_ns'])}"),
        metric("tokens/s", "–" if pd.isna(g["tokens_per_s"]) else f"{g['tokens_per_s']:.0f}"),
        metric("prefill MFU", fmt.share(g["prefill_mfu"]), "compute-bound: the whole prompt"),
        metric("decode MBU", fmt.share(g["decode_mbu"]), "memory-bound: weights and cache"),
        metric("KV cache per token", fmt.size(g["kv_bytes_per_token"]),
               f"per sequence; {fmt.size(g['kv_bytes'])} held at the end")
        if not without_cache(g["kv_cache"]) else
        metric("KV cache", "none", "each call feeds the whole sequence so far"),
    ], className="metrics")


def _readable(serving: pd.DataFrame) -> pd.DataFrame:
    """The serving table with its byte and share columns as they read."""
    return serving.assign(
        prefill_mfu=[fmt.share(v) for v in serving["prefill_mfu"]],
        decode_mbu=[fmt.share(v) for v in serving["decode_mbu"]],
        kv_bytes=[fmt.size(v) for v in serving["kv_bytes"]],
        kv_bytes_per_token=[fmt.size(v) for v in serving["kv_bytes_per_token"]])


def register(app: dash.Dash, ctx: AppContext) -> None:
    """No callbacks: the page is static for a trace."""
