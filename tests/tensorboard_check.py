"""tensorboard_check.py — reads the --tensorboard events files back with TensorBoard's own
reader (the `tensorboard` package from PyPI) and checks tags, steps and values.

    python tensorboard_check.py writer TB_WRITE TMPDIR
        random rows and parameter tensors (numpy, seeded) go through tests/tb_write (the
        sink itself); the file must hold exactly them: every record's masked CRC-32C
        (TensorBoard's masked_crc32c), the brain.Event:2 header, each scalar tag's steps and
        float32 values, NaN figures absent, and each histogram's min/max/num/sum/sum_squares
        and bucket counts against numpy over the same values; TensorBoard's server-side
        accumulator (the one its dashboards read through) lists the scalar and histogram
        tags under the scalars and histograms plugins.

    python tensorboard_check.py trainer EMBER_TRAIN TMPDIR ARGS...
        ember-train ARGS --tensorboard TMPDIR/tb --tensorboard-histograms --metrics-steps
        TMPDIR/steps.csv --metrics TMPDIR/epochs.csv, one epoch with --checkpoint, then the
        rest with --resume (and --save-weights TMPDIR/w.safetensors): over the two events
        files, every --metrics-steps row equals the train/* scalars at its step, every
        --metrics row the epoch/, val/ and test/ scalars, and the last epoch's weights/*
        histograms describe the saved weights.

Exit status 0 when everything matches, 1 with the mismatches listed.
"""
import csv
import glob
import json
import logging
import math
import os
import struct
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator as ea
from tensorboard.backend.event_processing import plugin_event_accumulator as pea
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

errors = []
# TensorBoard says when it drops a resumed run's superseded events: expected here
logging.getLogger("tensorboard").setLevel(logging.ERROR)


def check(cond, what):
    if not cond:
        errors.append(what)
    return cond


def records(path):
    """The payloads of a TFRecord file, each CRC checked here (the reader checks too)."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    p = 0
    while p < len(data):
        (n,) = struct.unpack_from("<Q", data, p)
        (hc,) = struct.unpack_from("<I", data, p + 8)
        check(hc == masked_crc32c(data[p:p + 8]), f"{path}: record at {p}: length CRC")
        payload = data[p + 12:p + 12 + n]
        (dc,) = struct.unpack_from("<I", data, p + 12 + n)
        check(dc == masked_crc32c(payload), f"{path}: record at {p}: data CRC")
        out.append(payload)
        p += 16 + n
    return out


def load(logdir):
    """Both of TensorBoard's accumulators over logdir, reloaded."""
    acc = ea.EventAccumulator(logdir, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0})
    acc.Reload()
    pacc = pea.EventAccumulator(logdir, size_guidance={"tensors": 0})
    pacc.Reload()
    return acc, pacc


def check_header(path):
    recs = records(path)
    if not check(recs, f"{path}: no records"):
        return
    ev = event_pb2.Event.FromString(recs[0])
    check(ev.file_version == "brain.Event:2", f"header file_version {ev.file_version!r}")
    check(ev.step == 0 and abs(ev.wall_time - __import__("time").time()) < 3600,
          f"header step {ev.step} wall_time {ev.wall_time}")
    for i, r in enumerate(recs[1:]):
        ev = event_pb2.Event.FromString(r)
        check(ev.HasField("summary") or (i == 0 and ev.HasField("session_log")),
              f"record {i + 1}: no summary")


def check_tags(acc, pacc, kind, expected):
    """The tags of kind ("scalars", "histograms") the reader found, checked against expected's
    and against those TensorBoard's dashboard of that name would list."""
    tags = set(acc.Tags()[kind])
    check(tags == set(expected), f"{kind} tags: extra {sorted(tags - set(expected))}, "
          f"missing {sorted(set(expected) - tags)}")
    plugin_tags = set(pacc.PluginTagToContent(kind))
    check(plugin_tags == set(expected), f"{kind} plugin tags differ: {sorted(plugin_tags ^ set(expected))}")
    return tags


def float32_equal(tag, got, want):
    return got == float(np.float32(want))


def check_scalars(acc, pacc, expected, same=float32_equal):
    """expected: tag -> [(step, value)] in order; same(tag, got, want): whether a value read
    back is the one expected (by default: exactly, once rounded to float32)."""
    tags = check_tags(acc, pacc, "scalars", expected)
    for tag, want in expected.items():
        if tag not in tags:
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        check([s for s, _ in got] == [s for s, _ in want], f"{tag}: steps {[s for s, _ in got]} "
              f"!= {[s for s, _ in want]}")
        for (s, v), (_, w) in zip(got, want):
            check(same(tag, v, w), f"{tag} at step {s}: {v!r} != {w!r}")


def check_histograms(acc, pacc, expected):
    """expected: tag -> [(step, finite values as float64)]."""
    tags = check_tags(acc, pacc, "histograms", expected)
    for tag, want in expected.items():
        if tag not in tags:
            continue
        got = acc.Histograms(tag)
        check([e.step for e in got] == [s for s, _ in want], f"{tag}: steps")
        for e, (s, v) in zip(got, want):
            h = e.histogram_value
            where = f"{tag} at step {s}"
            check(h.min == v.min() and h.max == v.max(), f"{where}: min/max {h.min} {h.max} != "
                  f"{v.min()} {v.max()}")
            check(h.num == v.size, f"{where}: num {h.num} != {v.size}")
            check(math.isclose(h.sum, math.fsum(v), rel_tol=1e-12, abs_tol=1e-12 * np.abs(v).sum()),
                  f"{where}: sum {h.sum} != {math.fsum(v)}")
            check(math.isclose(h.sum_squares, math.fsum(v * v), rel_tol=1e-12),
                  f"{where}: sum_squares {h.sum_squares} != {math.fsum(v * v)}")
            lim = np.array(h.bucket_limit)
            nb = 30 if v.max() > v.min() else 1
            edges = np.linspace(v.min(), v.max(), nb + 1)
            check(lim.size == nb and np.allclose(lim, edges[1:], rtol=0, atol=1e-12 * np.abs(v).max())
                  and lim[-1] == v.max(), f"{where}: bucket limits {lim} != {edges[1:]}")
            if lim.size != nb:
                continue
            # bucket i: limit[i-1] <= v < limit[i]; the last one holds max too
            idx = np.minimum(np.searchsorted(lim, v, side="right"), nb - 1)
            counts = np.bincount(idx, minlength=nb)
            check(list(h.bucket) == counts.tolist(), f"{where}: buckets {list(h.bucket)} != "
                  f"{counts.tolist()}")
            # numpy's own binning over the same edges agrees but for values on an edge
            ref, _ = np.histogram(v, bins=edges)
            check(np.abs(ref - counts).sum() <= 2 * np.isin(v, lim).sum(), f"{where}: np.histogram "
                  f"{ref.tolist()}")
        # what the histograms dashboard reads: (left, right, count) per bucket
        t = pacc.Tensors(tag)[-1]
        from tensorboard.util import tensor_util
        arr = tensor_util.make_ndarray(t.tensor_proto)
        check(arr.shape[1] == 3 and arr[:, 2].sum() == want[-1][1].size,
              f"{tag}: the histograms plugin's tensor {arr.shape}")


# ---- writer: known figures through tests/tb_write --------------------------------------------


def fmt(x):
    return repr(float(x))


def writer(tb_write, tmp):
    rng = np.random.default_rng(23)
    logdir = os.path.join(tmp, "writer")
    lines = [f"open {logdir} 1 accuracy -1"]
    sc = {}

    def add(tag, step, v):
        if not math.isnan(v):
            sc.setdefault(tag, []).append((step, v))

    groups = 2
    for k in range(12):
        step = 3 * (k + 1)
        epoch = 1 + step // 19
        loss = float(rng.uniform(0.1, 3))
        lr = rng.uniform(1e-4, 1e-1, groups)
        gn = math.nan if k == 4 else float(rng.uniform(0, 10))
        sps, wait = float(rng.uniform(100, 1e5)), float(rng.uniform(0, 1))
        skipped, scale = k // 3, float(2.0 ** (16 - k // 4))
        lines.append(f"step {step} {epoch} {fmt(loss)} {groups} {' '.join(map(fmt, lr))} {fmt(gn)} "
                     f"{fmt(sps)} {fmt(wait)} 1 {skipped} {fmt(scale)}")
        add("train/loss", step, loss)
        for g in range(groups):
            add(f"train/lr/group{g}", step, lr[g])
        add("train/grad_norm", step, gn)
        add("train/samples_per_s", step, sps)
        add("train/data_wait_s", step, wait)
        add("train/skipped_steps", step, skipped)
        add("train/loss_scale", step, scale)
    hist = {}
    params = [("0.weight", "float32", (64,), True), ("0.bias", "float64", (8,), False),
              ("3.weight", "float16", (40,), True), ("4.running_var", "float32", (5,), False),
              ("5.weight", "float64", (31,), False)]
    for epoch, step in ((1, 18), (2, 36)):
        r = rng.uniform(0, 1, 12)
        test = epoch == 2  # the test set only at the end
        row = {"epoch": epoch, "step": step, "lr": r[0], "train_loss": r[1], "grad_norm": r[2],
               "val_loss": r[3], "val_accuracy": r[4], "samples_per_s": 1e4 * r[5],
               "data_wait_pct": 100 * r[6], "peak_memory": int(1e9 * r[7]), "train_accuracy": r[8],
               "test_loss": r[9] if test else math.nan, "test_accuracy": r[10] if test else math.nan,
               "skipped_steps": 3, "loss_scale": math.nan if epoch == 1 else 1024.0}
        lines.append("epoch " + " ".join(fmt(row[c]) if isinstance(row[c], float) else str(row[c]) for c in
                     ("epoch", "step", "lr", "train_loss", "grad_norm", "val_loss", "val_accuracy",
                      "samples_per_s", "data_wait_pct", "peak_memory", "train_accuracy", "test_loss",
                      "test_accuracy", "skipped_steps", "loss_scale")))
        add("epoch/epoch", step, epoch)
        for c in ("train_loss", "train_accuracy", "lr", "grad_norm", "samples_per_s", "data_wait_pct",
                  "peak_memory"):
            add("epoch/" + c, step, row[c])
        for c in ("val_loss", "val_accuracy", "test_loss", "test_accuracy"):
            add(c.replace("_", "/"), step, row[c])
        if not math.isnan(row["loss_scale"]):
            add("epoch/skipped_steps", step, row["skipped_steps"])
            add("epoch/loss_scale", step, row["loss_scale"])
        for name, dt, shape, grad in params:
            n = int(np.prod(shape))
            npdt = np.dtype(dt)
            w = rng.normal(0, 1, n).astype(npdt)
            if name == "4.running_var":
                w[:] = 1  # all equal: one bucket
            if name == "5.weight":
                w = np.arange(31.0) * epoch  # every value but the ends on a bucket edge
            if name == "3.weight":
                w[[3, 7]] = [np.inf, np.nan]  # left out of the histogram
            line = f"param {name} {dt} {n} " + " ".join(fmt(x) for x in w)
            hist.setdefault("weights/" + name, []).append((step, w[np.isfinite(w)].astype(np.float64)))
            if grad:
                g = (rng.normal(0, 1e-3, n) * epoch).astype(npdt)
                line += f" 1 " + " ".join(fmt(x) for x in g)
                hist.setdefault("gradients/" + name, []).append((step, g.astype(np.float64)))
            else:
                line += " 0"
            lines.append(line)
        lines.append(f"params {epoch} {step}")
        lines.append("flush")
    lines.append("close")
    # a run resumed after step 20 (the first wrote up to 36): TensorBoard keeps the first
    # file's events before step 21 and the second file's
    resumed_at = 20
    lines.append(f"open {logdir} 1 accuracy {resumed_at}")
    for tag in sc:
        sc[tag] = [(s, v) for s, v in sc[tag] if s <= resumed_at]
    for tag in hist:
        hist[tag] = [(s, v) for s, v in hist[tag] if s <= resumed_at]
    for step in (24, 27, 30):
        loss, lr, gn = (float(x) for x in rng.uniform(0, 1, 3))
        lines.append(f"step {step} 2 {fmt(loss)} 1 {fmt(lr)} {fmt(gn)} 100.0 0.5 0 0 nan")
        for tag, v in (("train/loss", loss), ("train/lr/group0", lr), ("train/grad_norm", gn),
                       ("train/samples_per_s", 100.0), ("train/data_wait_s", 0.5)):
            add(tag, step, v)
    w = rng.normal(0, 1, 16).astype(np.float32)
    lines += ["param 0.weight float32 16 " + " ".join(fmt(x) for x in w) + " 0", "params 2 30", "close"]
    hist["weights/0.weight"].append((30, w.astype(np.float64)))
    res = subprocess.run([tb_write], input="\n".join(lines) + "\n", capture_output=True, text=True)
    if not check(res.returncode == 0, f"tb_write exited {res.returncode}: {res.stderr}"):
        return
    paths = res.stdout.split()
    check(sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))) == paths,
          f"events files {sorted(glob.glob(os.path.join(logdir, '*')))}: not {paths} in this order")
    for path in paths:
        check_header(path)
    second = [event_pb2.Event.FromString(r) for r in records(paths[1])]
    check(len(second) > 1 and second[1].session_log.status == event_pb2.SessionLog.START and
          second[1].step == resumed_at + 1, f"{paths[1]}: no SessionLog START at step {resumed_at + 1}")
    acc, pacc = load(logdir)
    check(acc.file_version == 2.0, f"EventAccumulator file_version {acc.file_version}")
    check_scalars(acc, pacc, sc)
    check_histograms(acc, pacc, hist)
    print(f"writer: {sum(len(v) for v in sc.values())} scalars under {len(sc)} tags, "
          f"{sum(len(v) for v in hist.values())} histograms under {len(hist)} tags read back")


# ---- trainer: ember-train's files against its own metrics files ---------------------------------


def safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    out = {}
    kinds = {"F32": np.float32, "F64": np.float64, "F16": np.float16}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=kinds[v["dtype"]])
    return out


def trainer(ember_train, tmp, args):
    logdir = os.path.join(tmp, "tb")
    files = {"steps": os.path.join(tmp, "steps.csv"), "epochs": os.path.join(tmp, "epochs.csv"),
             "weights": os.path.join(tmp, "w.safetensors")}
    ck = os.path.join(tmp, "ck.safetensors")
    cmd = [ember_train] + args + ["--tensorboard", logdir, "--tensorboard-histograms",
                                  "--metrics-steps", files["steps"], "--metrics", files["epochs"]]
    # the first epoch, then the rest resumed from its checkpoint: one file each, and the
    # metrics files appended to
    for extra in (["--epochs", "1", "--checkpoint", ck], ["--resume", ck, "--save-weights", files["weights"]]):
        res = subprocess.run(cmd + extra, capture_output=True, text=True)
        if not check(res.returncode == 0, f"{' '.join(cmd + extra)} exited {res.returncode}: {res.stderr}"):
            return
    paths = sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*")))
    if not check(len(paths) == 2, f"events files {paths}"):
        return
    for path in paths:
        check_header(path)
    acc, pacc = load(logdir)
    sc = {}

    def add(tag, step, v):
        v = float(v) if v not in ("", "null") else math.nan
        if not math.isnan(v):
            sc.setdefault(tag, []).append((step, v))

    with open(files["steps"]) as f:
        rows = list(csv.DictReader(f))
    check(len(rows) >= 3, f"{files['steps']}: {len(rows)} rows")
    for r in rows:
        step = int(r["step"])
        add("train/loss", step, r["loss"])
        for c in r:
            if c.startswith("lr"):
                g = c[2:].lstrip("_") or "0"
                add(f"train/lr/group{g.replace('group', '')}", step, r[c])
        add("train/grad_norm", step, r["grad_norm"])
        add("train/samples_per_s", step, r["samples_per_s"])
        add("train/data_wait_s", step, r["data_wait_s"])
        if "loss_scale" in r:
            add("train/skipped_steps", step, r["skipped_steps"])
            add("train/loss_scale", step, r["loss_scale"])
    with open(files["epochs"]) as f:
        erows = list(csv.DictReader(f))
    metric = "accuracy" if "val_accuracy" in erows[0] else "mae"
    for r in erows:
        step = int(r["step"])
        add("epoch/epoch", step, r["epoch"])
        for c in ("train_loss", f"train_{metric}", "lr", "grad_norm", "samples_per_s",
                  "data_wait_pct", "peak_memory"):
            add("epoch/" + c, step, r[c])
        for c in ("val_loss", f"val_{metric}", "test_loss", f"test_{metric}"):
            add(c.replace("_", "/", 1), step, r[c])
        if r.get("loss_scale") and not math.isnan(float(r["loss_scale"])):
            add("epoch/skipped_steps", step, r["skipped_steps"])
            add("epoch/loss_scale", step, r["loss_scale"])
    # the files print %.9g (%.6g, %.4g for samples/s and the wait): compare at their precision
    def printed_equal(tag, got, want):
        rel = 1e-3 if tag.endswith(("samples_per_s", "data_wait_pct", "data_wait_s")) else 1e-6
        return math.isclose(got, want, rel_tol=rel, abs_tol=1e-30)

    check_scalars(acc, pacc, sc, printed_equal)
    # the last epoch's weight histograms: the weights saved at the end
    weights = safetensors(files["weights"])
    htags = set(acc.Tags()["histograms"])
    last = int(erows[-1]["step"])
    for name, w in weights.items():
        tag = "weights/" + name
        if not check(tag in htags, f"no histogram {tag}"):
            continue
        h = acc.Histograms(tag)[-1]
        check(h.step == last, f"{tag}: last step {h.step} != {last}")
        v = w.astype(np.float64)
        hv = h.histogram_value
        check(hv.num == v.size and hv.min == v.min() and hv.max == v.max()
              and math.isclose(hv.sum, math.fsum(v), rel_tol=1e-9, abs_tol=1e-9 * np.abs(v).sum()),
              f"{tag}: num/min/max/sum {hv.num} {hv.min} {hv.max} {hv.sum} != {v.size} {v.min()} "
              f"{v.max()} {math.fsum(v)}")
        check(("gradients/" + name) in htags, f"no histogram gradients/{name}")
    print(f"trainer: {len(rows)} step rows and {len(erows)} epoch rows equal "
          f"{sum(len(v) for v in sc.values())} scalars; {len(weights)} weight histograms match the "
          f"saved weights")


def main():
    mode = sys.argv[1]
    if mode == "writer":
        writer(sys.argv[2], sys.argv[3])
    elif mode == "trainer":
        trainer(sys.argv[2], sys.argv[3], sys.argv[4:])
    else:
        sys.exit(f"unknown mode {mode}")
    for e in errors[:40]:
        print("FAIL:", e)
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
