"""What changed between two traces: step time, breakdown, ops, modules, engines.

Totals are per analysed step (the steady state of each trace: no warm-up or compile
steps, see `analyses/steady_state.py`; 1 without steps), so a run of 10 steps
compares fairly with a run of 50, and a compiled run with an eager one; compile
time is compared on its own. Typical uses: eager against
torch.compile, trn1 against trn2, before and after a fix.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd
from neuron_explorer.analyses.engine_utilisation import engine_busy_totals
from neuron_explorer.analyses.levels import recorded_level, records_device
from neuron_explorer.analyses.steady_state import (
    StepSelection,
    analysed_steps,
    cut_short,
    select_steps,
)
from neuron_explorer.analyses.step_breakdown import counted_steps
from neuron_explorer.render import Section, fmt_ns, fmt_share, render, to_text
from neuron_explorer.report import mean_breakdown
from neuron_explorer.trace import Trace, load
from neuron_explorer.what_if.label import hardware_label

SUMMARY_METRICS = ("step_time_ns", "total_ns", "n_steps", "mfu", "hfu", "mbu",
                   "device_busy_share", "n_ops", "n_kernels", "compile_ns")


@dataclass
class TraceDiff:
    """Differences between trace a (before) and trace b (after); DataFrames per aspect."""

    a: str
    b: str
    summary: pd.DataFrame  # metric, a, b, delta, ratio
    breakdown: pd.DataFrame  # side, category, status, a_ns, b_ns, delta_ns
    ops: pd.DataFrame  # name, status, a_count, b_count, a_device_ns, b_device_ns, delta_ns
    modules: pd.DataFrame  # module, phase, status, a_ns, b_ns, delta_ns
    engines: pd.DataFrame  # device, engine, status, a_busy_ns, b_busy_ns, delta_ns
    hardware: tuple[str | None, str | None] = field(default=(None, None))
    # name, kind, status, a_count, b_count, a_ns, b_ns, a_mean_ns, b_mean_ns, delta_ns
    kernels: pd.DataFrame = field(default_factory=pd.DataFrame)
    steps: tuple[str, str] = field(default=("", ""))  # the steps each side analysed, in words
    # each side's recording was cut short (a killed run, a damaged file): its figures are of
    # the part it holds, no measure of the program against the other's
    cut_short: tuple[bool, bool] = field(default=(False, False))

    @property
    def comparable(self) -> bool:
        """Neither side is a recording cut short."""
        return not any(self.cut_short)

    @property
    def added_ops(self) -> list[str]:
        return self.ops.loc[self.ops["status"] == "added", "name"].tolist()

    @property
    def removed_ops(self) -> list[str]:
        return self.ops.loc[self.ops["status"] == "removed", "name"].tolist()

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict of every table."""
        def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
            return json.loads(frame.to_json(orient="records"))

        return {"a": self.a, "b": self.b, "hardware": list(self.hardware),
                "steps_analysed": list(self.steps), "cut_short": list(self.cut_short),
                "summary": records(self.summary), "breakdown": records(self.breakdown),
                "ops": records(self.ops), "modules": records(self.modules),
                "engines": records(self.engines), "kernels": records(self.kernels),
                "added_ops": self.added_ops, "removed_ops": self.removed_ops}

    def sections(self, top: int = 15) -> list[Section]:
        """Titled sections for the renderers."""
        s = self.summary
        summary = {"a": f"{self.a} ({self.hardware[0] or '-'})",
                   "b": f"{self.b} ({self.hardware[1] or '-'})",
                   "steps analysed": f"{self.steps[0] or '-'} -> {self.steps[1] or '-'}"}
        for r in s.itertuples():
            if r.metric == "step_time_ns":
                summary["step time"] = (f"{fmt_ns(r.a)} -> {fmt_ns(r.b)} "
                                        f"({_ratio_text(r.ratio)}{self._cut_short_note()})")
            elif r.metric == "total_ns":
                # a fix that does the same work in fewer steps (requests batched) leaves
                # the step time as it was: the steps' total says what it saved
                summary["analysed steps' total"] = (f"{fmt_ns(r.a)} -> {fmt_ns(r.b)} "
                                                    f"({_ratio_text(r.ratio)})")
            elif r.metric == "compile_ns":
                summary["compile (on its own)"] = f"{fmt_ns(r.a)} -> {fmt_ns(r.b)}"
            elif r.metric in ("mfu", "hfu", "mbu", "device_busy_share"):
                summary[r.metric] = f"{fmt_share(r.a)} -> {fmt_share(r.b)}"
            else:
                summary[r.metric] = f"{_plain(r.a)} -> {_plain(r.b)}"
        bd = pd.DataFrame({"side": self.breakdown["side"], "category": self.breakdown["category"],
                           "a": [fmt_ns(v) for v in self.breakdown["a_ns"]],
                           "b": [fmt_ns(v) for v in self.breakdown["b_ns"]],
                           "change": [fmt_ns(v) for v in self.breakdown["delta_ns"]]})
        changed = self.ops.reindex(_largest_first(self.ops, "device_ns"))
        ops = pd.DataFrame({"op": changed["name"], "status": changed["status"],
                            "a": [fmt_ns(v) for v in changed["a_device_ns"]],
                            "b": [fmt_ns(v) for v in changed["b_device_ns"]],
                            "change": [fmt_ns(v) for v in changed["delta_ns"]]}).head(top)
        mods = self.modules.reindex(
            self.modules["delta_ns"].abs().sort_values(ascending=False).index).head(top)
        mods_t = pd.DataFrame({"module": mods["module"], "phase": mods["phase"],
                               "status": mods["status"], "a": [fmt_ns(v) for v in mods["a_ns"]],
                               "b": [fmt_ns(v) for v in mods["b_ns"]],
                               "change": [fmt_ns(v) for v in mods["delta_ns"]]})
        eng = pd.DataFrame({"device": self.engines["device"], "engine": self.engines["engine"],
                            "a": [fmt_ns(v) for v in self.engines["a_busy_ns"]],
                            "b": [fmt_ns(v) for v in self.engines["b_busy_ns"]],
                            "change": [fmt_ns(v) for v in self.engines["delta_ns"]]})
        k = self.kernels
        k = k.reindex(_largest_first(k, "ns")).head(top) \
            if len(k) else k
        kernels = pd.DataFrame({"kernel": k.get("name", []), "status": k.get("status", []),
                                "a": [fmt_ns(v) for v in k.get("a_ns", [])],
                                "b": [fmt_ns(v) for v in k.get("b_ns", [])],
                                "change": [fmt_ns(v) for v in k.get("delta_ns", [])]})
        note = self._stepless_note()
        return [Section("Summary (per step)" + note, summary),
                Section("Breakdown per step" + note, bd),
                Section("Ops that changed most (device time per step)" + note, ops),
                Section("Kernels that changed most (device time per step)" + note, kernels),
                Section("Modules that changed most (time per step)" + note, mods_t),
                Section("Engine busy time per step" + note, eng),
                Section("Ops added / removed",
                        [f"added: {', '.join(self.added_ops) or 'none'}",
                         f"removed: {', '.join(self.removed_ops) or 'none'}"])]

    def _cut_short_note(self) -> str:
        cut = [side for side, short in zip("ab", self.cut_short, strict=True) if short]
        if not cut:
            return ""
        return (f"; {' and '.join(cut)} {'is' if len(cut) == 1 else 'are'} a recording cut "
                "short: not a like-for-like comparison")

    def _stepless_note(self) -> str:
        """A side without step marks is compared whole: its figures are not per step."""
        stepless = [side for side, steps in zip("ab", self.steps, strict=True)
                    if steps == StepSelection((), (), "").describe()]
        if not stepless:
            return ""
        have = "it has" if len(stepless) == 1 else "they have"
        return f" ({' and '.join(stepless)}: the whole trace, {have} no steps)"

    def _repr_html_(self) -> str:
        from neuron_explorer.plot.cards import diff_tables

        return diff_tables(self)

    def to_text(self) -> str:
        """A plain-text comparison."""
        return to_text(f"Neuron Explorer diff: {self.a} vs {self.b}", self.sections())

    def render(self, fmt: str) -> str:
        """text, json, md or html."""
        if fmt == "json":
            return json.dumps(self.to_dict(), indent=2)
        return render(f"Neuron Explorer diff: {self.a} vs {self.b}", self.sections(), fmt)


def _largest_first(frame: pd.DataFrame, value: str) -> pd.Index:
    """Rows by the size of their change; where one side was not recorded (no change to
    measure), by the other side's value."""
    size = frame["delta_ns"].abs().fillna(frame[f"a_{value}"].fillna(frame[f"b_{value}"]).abs())
    return size.sort_values(ascending=False).index


def _plain(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.4g}"


def _ratio_text(ratio: float) -> str:
    if ratio is None or np.isnan(ratio) or ratio <= 0:  # no figure, or none after
        return "-"
    if ratio == 1:  # "1.00x slower" would say it changed
        return "unchanged"
    return f"{1 / ratio:.2f}x faster" if ratio < 1 else f"{ratio:.2f}x slower"


def _per_step(trace: Trace) -> int:
    """The number of steps the per-step figures divide by: the analysed ones."""
    return max(counted_steps(trace), 1)


def _outer(a: pd.DataFrame, b: pd.DataFrame, keys: list[str], value_cols: dict[str, str]
           ) -> pd.DataFrame:
    """Outer join on keys, with a_/b_ value columns, zero-filled, and a status column."""
    ja = a.set_index(keys)[list(value_cols)].rename(columns=lambda c: "a_" + value_cols[c])
    jb = b.set_index(keys)[list(value_cols)].rename(columns=lambda c: "b_" + value_cols[c])
    j = ja.join(jb, how="outer")
    in_a = j.index.isin(ja.index)
    in_b = j.index.isin(jb.index)
    j = j.fillna(0)
    j["status"] = np.select([in_a & ~in_b, ~in_a & in_b], ["removed", "added"], "common")
    return j.reset_index()


def _unrecorded(frame: pd.DataFrame, side: str, trace: Trace, rows: Any = None) -> pd.DataFrame:
    """Mark `side`'s ("a" or "b") values of `rows` (all by default) as not recorded: a trace
    recorded at --level framework has no ops, kernels or device time, so they are neither 0
    nor "added"/"removed" by the other trace."""
    rows = slice(None) if rows is None else rows
    frame = frame.copy()
    value_cols = [c for c in frame.columns if c.startswith(f"{side}_")]
    delta_cols = [c for c in frame.columns if c.startswith("delta")]
    frame[value_cols + delta_cols] = frame[value_cols + delta_cols].astype(float)
    frame.loc[rows, value_cols + delta_cols] = np.nan
    frame.loc[rows, "status"] = f"not recorded in {side} (--level {recorded_level(trace)})"
    return frame


def _mark_unrecorded(d: TraceDiff, ta: Trace, tb: Trace) -> TraceDiff:
    """What one side's level did not record, marked so on every table of the diff."""
    for side, trace in (("a", ta), ("b", tb)):
        if records_device(trace):
            continue
        bd = d.breakdown
        # the host split into op dispatch and Python needs the ops too
        needs_ops = (bd["side"] == "device") | bd["category"].isin(["op_dispatch", "python"])
        d.breakdown = _unrecorded(bd, side, trace, needs_ops)
        d.ops = _unrecorded(d.ops, side, trace)
        d.engines = _unrecorded(d.engines, side, trace)
        if len(d.kernels):
            d.kernels = _unrecorded(d.kernels, side, trace)
        s = d.summary
        s.loc[s["metric"].isin(["n_ops", "n_kernels"]), [side, "delta", "ratio"]] = np.nan
    return d


def _all_op_counts(trace: Trace) -> pd.Series:
    """How often each op name runs per step at any depth (the ops table holds only the
    outermost ops of a PyTorch-profiler trace)."""
    from neuron_explorer.tables import of_kind

    names = of_kind(trace, "op")["name"]
    counts = names.value_counts()  # a categorical counts its every category: those run
    return counts[counts > 0] / _per_step(trace)


def _nesting_status(ops: pd.DataFrame, ta: Trace, tb: Trace) -> pd.DataFrame:
    """An op that is no longer outermost but still runs nested is `nested`, not removed (or
    added); an op that only ever ran nested and is gone (or new) is listed too."""
    all_a, all_b = _all_op_counts(ta), _all_op_counts(tb)
    still = ops["name"].isin(all_b.index) & ops["status"].eq("removed")
    before = ops["name"].isin(all_a.index) & ops["status"].eq("added")
    ops.loc[still | before, "status"] = "nested"
    listed = set(ops["name"])
    extra = [(name, "removed", all_a[name], 0.0) for name in all_a.index
             if name not in listed and name not in all_b.index]
    extra += [(name, "added", 0.0, all_b[name]) for name in all_b.index
              if name not in listed and name not in all_a.index]
    if not extra:
        return ops
    rows = pd.DataFrame(extra, columns=["name", "status", "a_count", "b_count"])
    rows["a_device_ns"] = rows["b_device_ns"] = rows["delta_ns"] = 0.0
    return pd.concat([ops, rows[ops.columns]], ignore_index=True)


def _kernels(ta: Trace, tb: Trace, na: int, nb: int) -> pd.DataFrame:
    """Kernels by name and kind, per step: added, removed, changed (time or count), common."""
    columns = ["name", "kind", "status", "a_count", "b_count", "a_ns", "b_ns", "a_mean_ns",
               "b_mean_ns", "delta_ns"]

    def per_step(trace: Trace, n: int) -> pd.DataFrame:
        stats = trace.kernel_stats()
        if not len(stats):
            return pd.DataFrame(columns=["name", "kind", "count", "ns", "mean_ns"])
        return pd.DataFrame({"name": stats["name"], "kind": stats["kind"],
                             "count": stats["count"] / n, "ns": stats["total_ns"] / n,
                             "mean_ns": stats["mean_ns"]})

    k = _outer(per_step(ta, na), per_step(tb, nb), ["name", "kind"],
               {"count": "count", "ns": "ns", "mean_ns": "mean_ns"})
    k["delta_ns"] = k["b_ns"] - k["a_ns"]
    changed = (k["status"] == "common") & ((k["delta_ns"] != 0) | (k["a_count"] != k["b_count"]))
    k.loc[changed, "status"] = "changed"
    return k[columns]


def _align_devices(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """B's devices renumbered onto A's in order when the two traces use different device
    indices for the same setup (rank 0 on GPU 0 against rank 1 on GPU 1)."""
    da, db = sorted(set(a["device"])), sorted(set(b["device"]))
    if da == db or len(da) != len(db):
        return b
    return b.assign(device=b["device"].map(dict(zip(db, da, strict=True))))


def _summary(ta: Trace, tb: Trace) -> pd.DataFrame:
    sa, sb = ta.summary(), tb.summary()
    rows = []
    for m in SUMMARY_METRICS:
        va, vb = sa.get(m), sb.get(m)
        fa = float(va) if va is not None else np.nan
        fb = float(vb) if vb is not None else np.nan
        ratio = fb / fa if fa and not np.isnan(fa) else np.nan
        rows.append((m, fa, fb, fb - fa, ratio))
    return pd.DataFrame(rows, columns=["metric", "a", "b", "delta", "ratio"])


def diff_traces(ta: Trace, tb: Trace) -> TraceDiff:
    """Compare two loaded traces."""
    ta, tb = _same_warm_up(ta, tb)
    na, nb = _per_step(ta), _per_step(tb)
    bda, bdb = mean_breakdown(ta), mean_breakdown(tb)
    bd = _outer(bda, bdb, ["side", "category"], {"ns": "ns"})
    bd["delta_ns"] = bd["b_ns"] - bd["a_ns"]
    oa = (ta.op_stats().assign(device_ns=lambda f: f["device_ns"] / na,
                               count=lambda f: f["count"] / na)
          if len(ta.ops) else pd.DataFrame(columns=["name", "count", "device_ns"]))
    ob = (tb.op_stats().assign(device_ns=lambda f: f["device_ns"] / nb,
                               count=lambda f: f["count"] / nb)
          if len(tb.ops) else pd.DataFrame(columns=["name", "count", "device_ns"]))
    ops = _outer(oa, ob, ["name"], {"count": "count", "device_ns": "device_ns"})
    ops["delta_ns"] = ops["b_device_ns"] - ops["a_device_ns"]
    ops.loc[(ops["status"] == "common") & (ops["delta_ns"] != 0), "status"] = "changed"
    ops = ops[["name", "status", "a_count", "b_count", "a_device_ns", "b_device_ns", "delta_ns"]]
    ops = _nesting_status(ops, ta, tb)
    ma = ta.module_stats().assign(ns=lambda f: f["total_ns"] / na) if len(ta.modules) else \
        pd.DataFrame(columns=["module", "phase", "ns"])
    mb = tb.module_stats().assign(ns=lambda f: f["total_ns"] / nb) if len(tb.modules) else \
        pd.DataFrame(columns=["module", "phase", "ns"])
    mods = _outer(ma, mb, ["module", "phase"], {"ns": "ns"})
    mods["delta_ns"] = mods["b_ns"] - mods["a_ns"]
    ea = engine_busy_totals(ta, analysed=True).assign(busy_ns=lambda f: f["busy_ns"] / na)
    eb = _align_devices(ea, engine_busy_totals(tb, analysed=True).assign(
        busy_ns=lambda f: f["busy_ns"] / nb))
    eng = _outer(ea, eb, ["device", "engine"], {"busy_ns": "busy_ns"})
    eng["delta_ns"] = eng["b_busy_ns"] - eng["a_busy_ns"]
    a_name, b_name = _names(ta.path, tb.path)
    d = TraceDiff(a=a_name, b=b_name,
                  summary=_summary(ta, tb), breakdown=bd, ops=ops,
                  modules=mods[["module", "phase", "status", "a_ns", "b_ns", "delta_ns"]],
                  engines=eng[["device", "engine", "status", "a_busy_ns", "b_busy_ns", "delta_ns"]],
                  hardware=(hardware_label(ta), hardware_label(tb)),
                  kernels=_kernels(ta, tb, na, nb),
                  steps=(analysed_steps(ta).describe(), analysed_steps(tb).describe()),
                  cut_short=(cut_short(ta), cut_short(tb)))
    return _mark_unrecorded(d, ta, tb)


def _same_warm_up(ta: Trace, tb: Trace) -> tuple[Trace, Trace]:
    """The two traces with as many leading steps left out as an eager warm-up, where that
    rule chose their steps: it cuts a first step over 1.5x the others' median, so two runs
    of one script, their first steps 1.46x and 1.66x, were compared over different steps
    (the warm-up step averaged into one side alone)."""
    sa, sb = analysed_steps(ta), analysed_steps(tb)
    if sa.warm_up is None or sb.warm_up is None or sa.warm_up == sb.warm_up:
        return ta, tb
    n = max(sa.warm_up, sb.warm_up)
    return _with_warm_up(ta, n), _with_warm_up(tb, n)


def _with_warm_up(trace: Trace, n: int) -> Trace:
    """`trace` analysed after `n` warm-up steps: a view sharing its tables, with analyses
    of its own (`trace` itself is left as it was; too few steps: `trace`)."""
    selection = select_steps(trace, warm_up=n)
    if analysed_steps(trace).warm_up == n or selection.warm_up != n:
        return trace
    view = copy.copy(trace)
    view.__dict__["_memo"] = {"steady_steps": selection}
    return view


def _names(a: str, b: str) -> tuple[str, str]:
    """The two traces' file names, with their folders where the names alone are the same
    (rank1.pftrace of two runs)."""
    def folder(path: str) -> str:
        return os.path.basename(os.path.dirname(os.path.abspath(path)))

    if os.path.basename(a) != os.path.basename(b):
        return os.path.basename(a), os.path.basename(b)
    return (os.path.join(folder(a), os.path.basename(a)),
            os.path.join(folder(b), os.path.basename(b)))


def diff(a: Trace | str | os.PathLike, b: Trace | str | os.PathLike) -> TraceDiff:
    """Compare two traces (loaded, or paths to load): what changed from a to b."""
    ta = a if isinstance(a, Trace) else cast(Trace, load(a))  # one file: a Trace
    tb = b if isinstance(b, Trace) else cast(Trace, load(b))
    return diff_traces(ta, tb)
