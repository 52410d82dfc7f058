#!/usr/bin/env python3
"""Tables and a scaling chart from mha_bench's Google Benchmark JSON.

One table per case (kind and shape): per ISA and thread count the median
over repetitions of GFLOP/s (GB/s for decode), the spread of the
repetitions, the speedup over one thread, the parallel efficiency, the share
of the FMA peak measured in the same run (for decode also the share of the
read bandwidth measured in the same run), and the ratio to the OpenBLAS
baseline of the same shape and thread count.

Usage: bench_report.py RESULTS.json [--markdown FILE] [--png FILE]
                       [--command TEXT] [--load-end TEXT]
                       [--publish PAGE [--cpu-info FILE]]
--publish writes the project's benchmark page (docs/benchmarks.md): the
run's date, CPU, SIMD flags, thread counts and load, a summary, how to read
and regenerate it, and the same tables; the page's hand-written section
"Figures behind design choices" is carried over from the old page.
Exits non-zero when a case reported an error, nothing was measured or the
chart could not be drawn; the page is written unless a case failed.
"""

import argparse
import datetime
import json
import os
import re
import statistics
import sys

KIND_ORDER = ["attention", "causal", "decode", "layer", "blas_baseline"]
BASELINE_ISA = "openblas"
# The ISAs in the driver's order (its "isas" context: mha_isas(), best
# first), then the baseline; set by load(). No ISA name is spelled here, so
# a new ISA needs no change in this script.
ISA_ORDER = [BASELINE_ISA]
# Measured in the same run as the cases, against which they are read.
REFERENCE_KINDS = ["fma_peak", "membw"]


def isa_rank(isa):
    return ISA_ORDER.index(isa) if isa in ISA_ORDER else len(ISA_ORDER)


def parse_name(run_name):
    """'attention/B1_.../avx2/threads:2' -> (kind, shape, isa, threads);
    'fma_peak/avx2/threads:2' -> ('fma_peak', '', 'avx2', 2);
    'membw/read/threads:2' -> ('membw', '', 'read', 2)."""
    parts = run_name.split("/")
    if not parts[-1].startswith("threads:"):
        return None
    threads = int(parts[-1][len("threads:"):])
    if parts[0] in REFERENCE_KINDS and len(parts) == 3:
        return (parts[0], "", parts[1], threads)
    if len(parts) == 4:
        return (parts[0], parts[1], parts[2], threads)
    return None


def load(path):
    """Medians per (kind, shape, isa, threads) from the per-repetition
    entries (the same median Google Benchmark's aggregate reports, and it
    also works for a single repetition)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    samples = {}
    errors = []
    for b in data.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration":
            continue
        name = b.get("run_name", b["name"])
        if b.get("error_occurred"):
            errors.append(f"{name}: {b.get('error_message', 'error')}")
            continue
        key = parse_name(name)
        if key is None or ("GFLOPS" not in b and "GBPS" not in b):
            continue
        entry = samples.setdefault(key, {"GFLOPS": [], "GBPS": []})
        for metric in ("GFLOPS", "GBPS"):
            if metric in b:
                entry[metric].append(b[metric])
    results = {}  # in the order of the run, which is the driver's order
    for key, s in samples.items():
        metric = "GBPS" if s["GBPS"] else "GFLOPS"
        values = s[metric]
        med = statistics.median(values)
        results[key] = {
            "GFLOPS": statistics.median(s["GFLOPS"]) if s["GFLOPS"] else None,
            "GBPS": statistics.median(s["GBPS"]) if s["GBPS"] else None,
            "metric": metric,
            "value": med,
            "spread": (max(values) - min(values)) / med if med > 0 else 0.0,
            "reps": len(values),
        }
    context = data.get("context", {})
    ISA_ORDER[:] = [i for i in str(context.get("isas", "")).split(",") if i]
    ISA_ORDER.append(BASELINE_ISA)
    return context, results, errors


def fmt(x, pattern):
    return "—" if x is None else pattern.format(x)


def table(headers, rows):
    """A markdown pipe table, padded so that it also reads in a terminal."""
    cells = [headers] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|"
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def best_peak(results, threads):
    """The widest measured peak at a thread count (for the BLAS rows,
    whose kernels are not tied to one of libmha's ISAs)."""
    peaks = [v["GFLOPS"] for (k, _, _, t), v in results.items()
             if k == "fma_peak" and t == threads]
    return max(peaks) if peaks else None


HALF_SUFFIXES = ("_F16", "_BF16", "_I8", "_FP8_E4M3", "_FP8_E5M2")
# A serving case and the case of the same shape and work it is read
# against: the paged cache beside the contiguous one, one varlen call
# beside one call per sequence.
PAIRED = {"paged": ("decode", "× contiguous"),
          "alibi": ("causal", "× causal"),
          "varlen": ("varlen_seq", "× one call each")}


def fp32_twin(shape):
    """'B1_..._D128_F16' -> 'B1_..._D128' (half-precision or 8-bit K/V), else
    None; a _BHSD shape's twin is _BHSD too."""
    if shape.endswith("_BHSD"):
        twin = fp32_twin(shape[:-len("_BHSD")])
        return twin + "_BHSD" if twin else None
    for suffix in HALF_SUFFIXES:
        if shape.endswith(suffix):
            return shape[:-len(suffix)]
    return None


def compute_base(kind):
    """'attention_bf16' -> 'attention' (a half compute dtype), else None."""
    for suffix in ("_bf16", "_f16"):
        if kind.endswith(suffix):
            return kind[:-len(suffix)]
    return None


def case_table(results, kind, shape):
    keys = sorted((k for k in results if k[0] == kind and k[1] == shape),
                  key=lambda k: (isa_rank(k[2]), k[3]))
    decode = any(results[k]["GBPS"] is not None for k in keys)
    # × fp32: against fp32 K/V of the shape, and for a half compute dtype
    # against the fp32 kind (fp32 q, out and K/V).
    base = compute_base(kind)
    twin = fp32_twin(shape) or (shape if base else None)
    headers = ["ISA", "threads"]
    headers += ["GB/s", "GFLOP/s"] if decode else ["GFLOP/s"]
    headers += ["spread", "speedup", "efficiency", "% of peak"]
    headers += ["% of bandwidth"] if decode else []
    headers += ["× fp32"] if twin else []
    pair = PAIRED.get(kind)
    headers += [pair[1]] if pair else []
    # A [B, L, H, D] decode row against the same shape from [B, H, L, D].
    bhsd = shape + "_BHSD"
    has_bhsd = any(k[0] == kind and k[1] == bhsd for k in results)
    headers += ["× BHSD"] if has_bhsd else []
    headers += ["× blas"]
    rows = []
    for key in keys:
        _, _, isa, threads = key
        r = results[key]
        one = results.get((kind, shape, isa, 1))
        speedup = r["value"] / one["value"] if one and one["value"] > 0 else None
        peak = results.get(("fma_peak", "", isa, threads))
        peak_gflops = peak["GFLOPS"] if peak else (
            best_peak(results, threads) if isa == BASELINE_ISA else None)
        pct = 100.0 * r["GFLOPS"] / peak_gflops if peak_gflops else None
        blas = results.get(("blas_baseline", shape, BASELINE_ISA, threads))
        # The layer adds projections the baseline does not compute.
        ratio = (r["value"] / blas["value"]
                 if blas and blas["value"] > 0 and kind in ("attention",
                                                             "causal",
                                                             "decode")
                 else None)
        row = [isa, str(threads)]
        row += [fmt(r["GBPS"], "{:.1f}"), fmt(r["GFLOPS"], "{:.2f}")] if decode \
            else [fmt(r["GFLOPS"], "{:.1f}")]
        row += [fmt(100.0 * r["spread"], "{:.0f}%"), fmt(speedup, "{:.2f}"),
                fmt(speedup / threads if speedup else None, "{:.0%}"),
                fmt(pct, "{:.0f}%")]
        if decode:
            bw = results.get(("membw", "", "read", threads))
            row += [fmt(100.0 * r["GBPS"] / bw["GBPS"]
                        if bw and bw["GBPS"] and r["GBPS"] is not None
                        else None, "{:.0f}%")]
        if twin:
            # Same FLOPs, so the GFLOP/s ratio is the speedup over fp32 K/V.
            f32 = results.get((base or kind, twin, isa, threads))
            row += [fmt(r["GFLOPS"] / f32["GFLOPS"]
                        if f32 and f32["GFLOPS"] and r["GFLOPS"] else None,
                        "{:.2f}")]
        if pair:
            # Same FLOP count, so the GFLOP/s ratio is the speed ratio.
            other = results.get((pair[0], shape, isa, threads))
            row += [fmt(r["GFLOPS"] / other["GFLOPS"]
                        if other and other["GFLOPS"] and r["GFLOPS"] else None,
                        "{:.2f}")]
        if has_bhsd:
            other = results.get((kind, bhsd, isa, threads))
            row += [fmt(r["value"] / other["value"]
                        if other and other["value"] else None, "{:.2f}")]
        row += [fmt(ratio, "{:.2f}")]
        rows.append(row)
    return table(headers, rows)


def reference_table(results, kind, first, unit):
    """fma_peak (first column the ISA, GFLOP/s) or membw (the loop, GB/s)
    per thread count, with its scaling."""
    keys = sorted((k for k in results if k[0] == kind),
                  key=lambda k: (isa_rank(k[2]), k[3]))
    rows = []
    for key in keys:
        r = results[key]
        one = results.get((kind, "", key[2], 1))
        speedup = r["value"] / one["value"] if one and one["value"] > 0 \
            else None
        rows.append([key[2], str(key[3]), f"{r['value']:.1f}",
                     fmt(100.0 * r["spread"], "{:.0f}%"),
                     fmt(speedup, "{:.2f}"),
                     fmt(speedup / key[3] if speedup else None, "{:.0%}")])
    return table([first, "threads", unit, "spread", "speedup",
                  "efficiency"], rows)


def cases(context, results):
    """(kind, shape) pairs in the driver's order (its case_order context),
    then any others in the order they ran."""
    order = [tuple(c.split("/", 1)) for c in
             context.get("case_order", "").split(",") if "/" in c]
    for k in results:
        if k[0] not in REFERENCE_KINDS and (k[0], k[1]) not in order:
            order.append((k[0], k[1]))
    return [c for c in order if any(k[:2] == c for k in results)]


def busy_warning(context, load_end):
    """A line when other processes competed for the cores: the one-minute
    load average above half the core count at the start or the end."""
    cores = context.get("num_cpus") or 0
    loads = list(context.get("load_avg", [])[:1])
    if load_end:
        loads.append(float(load_end.split()[0]))
    if not cores or not loads or max(loads) <= 0.5 * cores:
        return []
    return [f"- **Busy machine**: load average up to {max(loads):.1f} on "
            f"{cores} cores. Other processes took CPU time, mostly from the "
            "multi-thread cases (a team waits for its slowest thread); trust "
            "rows with a small spread, rerun when the machine is idle."]


def repetitions(results):
    return max((r["reps"] for r in results.values()), default=0)


def load_start(context):
    return " ".join(f"{x:.2f}" for x in context.get("load_avg", [])) or "?"


def report(context, results, command, load_end=None):
    reps = repetitions(results)
    load = load_start(context)
    out = [
        "### Benchmark results",
        "",
        f"- CPU: {context.get('cpu_model', 'unknown')}, "
        f"{context.get('num_cpus', '?')} cores; "
        f"ISAs: {context.get('isas', '?')}; "
        f"BLAS baseline: {context.get('blas_baseline', '?')}",
        f"- Date: {context.get('date', '?')}; libmha "
        f"{context.get('libmha_version', '?')} "
        f"({context.get('libmha_buildtype', '?')}); command: `{command}`; "
        f"load average at start: {load}"
        + (f", at end: {load_end}" if load_end else ""),
        f"- Medians of {reps} repetition(s); spread = (max - min) / median "
        "over them. FLOPs: 4·B·H·Lq·Lk·d (causal: dense-equivalent; the "
        "layer adds its projections). % of peak is against the FMA "
        "microkernel of the same ISA and thread count, measured in the same "
        "run (OpenBLAS rows: the widest ISA's). × blas = this row over the "
        "OpenBLAS baseline of the same shape and thread count. % of "
        "bandwidth (decode) = GB/s of K and V over the membw read bandwidth "
        "at the same thread count, measured in the same run; × fp32 "
        "(half-precision K/V) = this row's speed over the fp32 case of the "
        "same shape, ISA and thread count.",
    ] + busy_warning(context, load_end) + [""] + tables(context, results)
    out += inproc_tables(INPROC_ROWS, "####")
    return "\n".join(out) + "\n"


def tables(context, results):
    """The reference tables, then one table per case, as markdown lines."""
    out = [
        "#### fma_peak",
        "",
        reference_table(results, "fma_peak", "ISA", "GFLOP/s"),
    ]
    if any(k[0] == "membw" for k in results):
        out += ["", "#### membw — GB/s read by a summing loop over "
                "1 GiB (more than the last-level cache)", "",
                reference_table(results, "membw", "loop", "GB/s")]
    for kind, shape in cases(context, results):
        label = (" (dense-equivalent)"
                 if kind in ("causal", "varlen", "varlen_seq") else "")
        unit = " — GB/s of K and V read" if kind in ("decode", "paged") \
            else ""
        out += ["", f"#### {kind}/{shape}{label}{unit}", "",
                case_table(results, kind, shape)]
    return out + mpi_tables(MPI_ROWS)


# The tensor-parallel layer's runs (bench/mpi_layer under mpirun, one JSON
# object a line), set by --mpi.
MPI_ROWS = []


def mpi_tables(rows):
    """layer_mpi: per ranks x threads the median over rounds of each
    round's median, beside 1 rank x the same number of cores."""
    if not rows:
        return []
    by = {}
    for r in rows:
        by.setdefault(r["name"], []).append(r)
    shapes = {}
    for name, runs in by.items():
        kind, shape, isa, layout = name.split("/")
        t = statistics.median(x["median_s"] for x in runs)
        g = statistics.median(x["gflops"] for x in runs)
        shapes.setdefault((kind, shape, isa), []).append(
            (runs[0]["ranks"], runs[0]["threads"], t, g, len(runs)))
    out = []
    for (kind, shape, isa), entries in shapes.items():
        one = {r * th: t for r, th, t, _, _ in entries if r == 1}
        body = []
        for ranks, th, t, g, n in sorted(entries):
            base = one.get(ranks * th)
            body.append([f"{ranks} × {th}", fmt(t * 1e3, "{:.1f}"),
                         fmt(g, "{:.1f}"),
                         fmt(base / t if base else None, "{:.2f}"), str(n)])
        out += ["", f"#### {kind}/{shape}/{isa} — the tensor-parallel layer "
                "over MPI (ranks × threads on this machine; × 1 rank = "
                "1 rank × the same cores' time over this row's)", "",
                table(["ranks × threads", "ms", "GFLOP/s", "× 1 rank",
                       "rounds"], body)]
    return out


# Issue 19's ratios measured in one process (bench/ratios, bench/layouts;
# one JSON object a run), set by --inproc.
INPROC_ROWS = []


def quartiles(ratios, key):
    """A ratio's median with its quartiles, as a cell."""
    q = ratios.get(key)
    return "—" if not q else f"{q[1]:.3f} ({q[0]:.3f}-{q[2]:.3f})"


def ratio_rows(runs, lead, keys):
    """Table rows: lead(run)'s cells, the ratios' cells, the rounds."""
    return [lead(r) + [quartiles(r["ratios"], k) for k in keys] +
            [str(r["rounds"])] for r in runs]


def inproc_tables(rows, level):
    """The in-process ratios as markdown lines: prefill and the layer
    (bench/ratios), then decode's layouts (bench/layouts), each heading at
    the given level."""
    if not rows:
        return []
    out = []
    pre = [r for r in rows if r.get("tool") == "ratios"]
    if pre:
        n = pre[0]["threads"]
        body = ratio_rows(pre, lambda r: [f"{r['kind']}/{r['shape']}",
                                          r["isa"]],
                          ["peak", "threads", "peak_threads", "bf16", "f16"])
        out += ["", f"{level} Prefill and the layer in one process "
                "(bench/ratios)", "",
                "Each round times a batch of every variant in rotating "
                "order; medians of the per-round ratios, quartiles in "
                "brackets. The half dtypes run on 1 thread, K/V of the "
                "same dtype.", "",
                table(["case", "ISA", "fp32 1 thread / fma_peak",
                       f"fp32 {n} / 1 threads", f"fma_peak {n} / 1 threads",
                       "bf16 / fp32", "fp16 / fp32", "rounds"], body)]
    dec = [r for r in rows if r.get("tool") == "layouts"]
    if dec:
        body = ratio_rows(dec, lambda r: [f"decode/{r['shape']}",
                                          r["dtype"], r["isa"],
                                          str(r["threads"])],
                          ["blhd_bhsd", "blhd_membw", "bhsd_membw"])
        out += ["", f"{level} Decode from both layouts in one process "
                "(bench/layouts)", "",
                "One K and one V buffer read as [B, L, H, D] and as "
                "[B, H, L, D], alternating with the membw loop; medians of "
                "the per-round ratios, quartiles in brackets.", "",
                table(["case", "K/V", "ISA", "threads", "BLHD / BHSD",
                       "BLHD / membw", "BHSD / membw", "rounds"], body)]
    return out


# ---- The published page (docs/benchmarks.md) -----------------------------

# The hand-written part of the page: from this heading to the end, carried
# over unchanged when the page is published again.
KEPT_HEADING = "## Figures behind design choices"
# The flags the kernels and the build care about (x86 names from
# /proc/cpuinfo, AArch64 feature names), in the order the CPU lists them.
SIMD_FLAG = re.compile(r"^(sse4_[12]|avx\w*|fma|f16c|amx\w*|asimd\w*|fphp|"
                       r"sve\w*|sme\d*|sme[bfi]\w+|bf16|i8mm)$")


def cpu_info(path):
    """(model name, SIMD flags) from `lscpu` and /proc/cpuinfo lines saved by
    scripts/bench when it ran the sweep, or from this machine when path is
    missing (then the third value says so)."""
    lines, recorded = [], True
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, TypeError):
        recorded = False
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                lines = f.read().splitlines()
        except OSError:
            pass
    model, flags = None, None
    for line in lines:
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if model is None and key == "model name" and value:
            model = value
        if flags is None and key in ("flags", "features") and value:
            flags = [f for f in value.split() if SIMD_FLAG.match(f)]
    return model, flags, recorded


def utc(date):
    try:
        d = datetime.datetime.fromisoformat(date)
    except (TypeError, ValueError):
        return date or "?"
    if d.tzinfo is not None:
        d = d.astimezone(datetime.timezone.utc)
    return d.strftime("%Y-%m-%d %H:%M UTC")


def summary_table(context, results):
    """Per case, the table MHA_ISA_AUTO picks, on one thread and on the most
    threads measured, against its same-run references."""
    isas = {k[2] for k in results}
    # The ISAs come best first (mha_isas' order): the first one measured is
    # the table MHA_ISA_AUTO picks.
    isa = next((i for i in ISA_ORDER if i in isas and i != BASELINE_ISA),
               None)
    if isa is None:
        return None
    most = max(k[3] for k in results if k[2] == isa)
    rows = []
    for kind, shape in cases(context, results):
        if kind == "blas_baseline":
            continue
        one = results.get((kind, shape, isa, 1))
        top = results.get((kind, shape, isa, most))
        if not top:
            continue
        decode = top["GBPS"] is not None
        unit = "GB/s" if decode else "GFLOP/s"
        if decode:
            bw = results.get(("membw", "", "read", most))
            ref = (100.0 * top["GBPS"] / bw["GBPS"]
                   if bw and bw["GBPS"] else None)
            ref_text = fmt(ref, "{:.0f}% of bandwidth")
        else:
            peak = results.get(("fma_peak", "", isa, most))
            ref = (100.0 * top["GFLOPS"] / peak["GFLOPS"]
                   if peak and peak["GFLOPS"] else None)
            ref_text = fmt(ref, "{:.0f}% of peak")
        blas = results.get(("blas_baseline", shape, BASELINE_ISA, most))
        ratio = (top["value"] / blas["value"]
                 if blas and blas["value"] > 0 and kind != "layer" else None)
        rows.append([f"{kind}/{shape}", unit,
                     fmt(one["value"] if one else None, "{:.1f}"),
                     fmt(top["value"], "{:.1f}"), ref_text,
                     fmt(ratio, "{:.2f}")])
    headers = ["case", "unit", "1 thread", f"{most} threads",
               f"{most} threads vs reference", "× blas"]
    return isa, most, table(headers, rows)


def kept_section(page):
    """The hand-written tail of the existing page, from KEPT_HEADING on."""
    try:
        with open(page, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None
    at = text.find("\n" + KEPT_HEADING + "\n")
    return text[at + 1:].rstrip("\n") + "\n" if at >= 0 else None


def publish(context, results, command, load_end, cpu_path, page):
    model, flags, recorded = cpu_info(cpu_path)
    model = model or context.get("cpu_model", "unknown")
    reps = repetitions(results)
    threads = context.get("threads") or ",".join(
        str(t) for t in sorted({k[3] for k in results}))
    where = "" if recorded else (" (read when the page was written: the run "
                                 "recorded no CPU details)")
    out = [
        "# Benchmarks",
        "",
        f"*Written by `./scripts/bench --publish` from the run of "
        f"{utc(context.get('date'))}. Everything above \"Figures behind "
        "design choices\" is rewritten by the next `--publish`; edit only "
        "that section by hand. How to regenerate: see the end of "
        "\"How to read the tables\".*",
        "",
        "## The run",
        "",
        f"- Date: {utc(context.get('date'))}",
        f"- CPU: {model}, {context.get('num_cpus', '?')} cores{where}",
        "- SIMD flags: " + (" ".join(flags) if flags else "unknown"),
        f"- ISAs measured: {context.get('isas', '?')}; BLAS baseline: "
        f"{context.get('blas_baseline', '?')}",
        f"- Thread counts: {threads}",
        f"- libmha {context.get('libmha_version', '?')} "
        f"({context.get('libmha_buildtype', '?')} build)",
        f"- Command: `{command}`",
        f"- Load average (1, 5, 15 min) at start: {load_start(context)}; "
        f"at end: {load_end or 'not recorded'}",
        f"- Medians of {reps} repetition(s) per row",
    ]
    if reps <= 1:
        out += ["", "**A smoke run (one repetition per case): its times "
                "mean nothing. Publish a full `./scripts/bench` run.**"]
    out += busy_warning(context, load_end)
    summary = summary_table(context, results)
    if summary:
        isa, most, text = summary
        out += ["", "## Summary", "",
                f"The table `MHA_ISA_AUTO` picks here ({isa}), on 1 and on "
                f"{most} threads. The reference is the same run's FMA peak "
                "of that ISA (prefill, layer) or its read bandwidth "
                "(decode); × blas compares with the OpenBLAS baseline on "
                f"{most} threads. Every ISA and thread count is in the "
                "tables below.", "", text]
    if INPROC_ROWS:
        out += ["", "## Ratios in one process", "",
                "On a shared host the rows of the tables run minutes apart, "
                "each in a process of its own, and carry the load of their "
                "moment. The ratios issue 19 sets are measured here with "
                "every side in one process, alternating."]
        out += inproc_tables(INPROC_ROWS, "###")
    out += ["", "## How to read the tables", "",
            "Every figure has a reference measured in the same run:",
            "",
            "- **% of peak** divides by an FMA microkernel of the same ISA "
            "on the same number of threads (generic: 128-bit multiply + "
            "add, as the generic build has no FMA). FLOPs are "
            "4·B·H·Lq·Lk·d; causal rows count dense-equivalent FLOPs, so "
            "they exceed 100% when hidden key blocks are skipped; the layer "
            "adds its projections.",
            "- **% of bandwidth** (decode) divides the K/V bytes read per "
            "second by a summing loop over 1 GiB. Above 100% means some "
            "K/V came from cache.",
            "- **× blas** divides by the attention a C user writes with "
            "OpenBLAS (per head `cblas_sgemm`, row softmax, `cblas_sgemm`; "
            "OpenMP over heads, OpenBLAS on one thread), same shape, same "
            "threads. **× fp32** (half-precision K/V) divides by the fp32 "
            "case of the same shape, ISA and threads.",
            "- **spread** is (max - min) / median over the repetitions. "
            "Repetitions run interleaved in random order, so load from "
            "other processes falls on cases and references alike: on a "
            "shared machine read the ratios, not the absolute numbers, and "
            "distrust rows with a spread above ~20%. Multi-thread rows "
            "suffer most (a team waits for its slowest thread).",
            "",
            "Shapes are named `B_H_KV_Lq_Lk_D`: batch, query heads, "
            "key/value heads, query and key lengths, head dimension.",
            "",
            "To regenerate this page, as root on a fresh Debian 12 machine "
            "(the sweep takes minutes; run it when the machine is quiet, "
            "e.g. under `flock /tmp/libmha-bench.lock`):",
            "",
            "    ./scripts/bench --publish",
            "",
            "`./scripts/bench --report-only --publish` rewrites it from "
            "the last run's `build/bench/results.json` without measuring "
            "again. Commit the page with the code it measured.",
            "",
            "## Tables",
            ""]
    # One heading level up from results.md: the tables sit under "Tables".
    out += [line[1:] if line.startswith("#### ") else line
            for line in tables(context, results)]
    kept = kept_section(page)
    text = "\n".join(out) + "\n"
    if kept:
        text += "\n" + kept
    with open(page, "w", encoding="utf-8") as f:
        f.write(text)


def plot(context, results, path):
    """One panel per kind; colour = shape, line style = ISA. The OpenBLAS
    baseline of a shape is drawn (dotted) in the panels of that shape."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ["attention", "causal", "decode", "layer",
                          "fma_peak"] if any(key[0] == k for key in results)]
    lines = {kind: [] for kind in panels}  # (source kind, shape, isa)
    order = cases(context, results)
    for k in sorted(results, key=lambda k: (
            order.index(k[:2]) if k[:2] in order else -1, isa_rank(k[2]))):
        for kind in panels:
            if (k[0] == kind or (k[0] == "blas_baseline" and kind != "layer"
                                 and any(o[0] == kind and o[1] == k[1]
                                         for o in results))) \
                    and (k[0], k[1], k[2]) not in lines[kind]:
                lines[kind].append((k[0], k[1], k[2]))
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows),
                             squeeze=False)
    styles = {isa: ["-", "-.", "--", (0, (3, 1, 1, 1))][i % 4]
              for i, isa in enumerate(ISA_ORDER)}
    markers = {isa: "osD^vP*"[i % 7] for i, isa in enumerate(ISA_ORDER)}
    styles[BASELINE_ISA], markers[BASELINE_ISA] = ":", "x"
    for ax, kind in zip(axes.flat, panels):
        shapes = []
        for _, shape, _ in lines[kind]:
            if shape not in shapes:
                shapes.append(shape)
        unit = "GFLOP/s"
        for source, shape, isa in lines[kind]:
            pts = sorted((k[3], v) for k, v in results.items()
                         if k[:3] == (source, shape, isa))
            unit = "GB/s" if pts[0][1]["metric"] == "GBPS" else "GFLOP/s"
            ax.plot([t for t, _ in pts], [v["value"] for _, v in pts],
                    color=f"C{shapes.index(shape) % 10}",
                    linestyle=styles.get(isa, "-"),
                    marker=markers.get(isa, "o"),
                    label=f"{shape} {isa}" if shape else isa)
        ax.set_xticks(sorted({k[3] for k in results if k[0] == kind}))
        ax.set_xlabel("threads")
        ax.set_ylabel(unit + (" (dense-equivalent)" if kind == "causal"
                              else ""))
        ax.set_title(kind)
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6.5)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle("libmha: median throughput against thread count "
                 "(dotted: OpenBLAS baseline of the same shape)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json")
    ap.add_argument("--markdown", help="also write the report to this file")
    ap.add_argument("--png", help="draw the scaling chart into this file")
    ap.add_argument("--command", default="./scripts/bench",
                    help="the command to name in the report")
    ap.add_argument("--load-end", help="the load average after the run")
    ap.add_argument("--publish", metavar="PAGE",
                    help="write the benchmark page (docs/benchmarks.md)")
    ap.add_argument("--cpu-info", metavar="FILE",
                    help="lscpu and /proc/cpuinfo lines saved at the run "
                    "(default: this machine's /proc/cpuinfo)")
    ap.add_argument("--mpi", metavar="JSONL",
                    help="bench/mpi_layer's runs, one JSON object a line")
    ap.add_argument("--inproc", metavar="JSONL",
                    help="bench/ratios' and bench/layouts' runs, one JSON "
                    "object a line")
    args = ap.parse_args()

    if args.mpi and os.path.exists(args.mpi):
        with open(args.mpi, encoding="utf-8") as f:
            MPI_ROWS.extend(json.loads(line) for line in f if line.strip())
    if args.inproc and os.path.exists(args.inproc):
        with open(args.inproc, encoding="utf-8") as f:
            INPROC_ROWS.extend(json.loads(line) for line in f if line.strip())
    context, results, errors = load(args.json)
    text = report(context, results, args.command, args.load_end)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.publish:
        if errors or not results:
            print(f"bench_report: {args.publish} not written: the run is "
                  "incomplete", file=sys.stderr)
        else:
            publish(context, results, args.command, args.load_end,
                    args.cpu_info, args.publish)
            print(f"bench_report: wrote {args.publish}", file=sys.stderr)
    if args.png and results:
        try:
            plot(context, results, args.png)
        except ImportError:
            errors.append("no matplotlib for the chart: install "
                          "python3-matplotlib (Debian) and rerun with "
                          "--report-only")
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if errors or not results:
        print("bench_report: " + ("failed" if errors else
                                  "no measurements in " + args.json),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
