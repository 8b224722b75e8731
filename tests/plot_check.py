#!/usr/bin/env python3
"""tests/plot_check.py — checks on the pictures ember-plot and ember-train --plot draw.

  plot_check.py metrics OUT.csv          write the known metrics file: 8 epochs, train loss
                                         falling steadily, validation loss falling to epoch 3
                                         and rising after it
  plot_check.py falling OUT.csv          the same with the validation loss falling throughout
                                         (the check must refuse its picture)
  plot_check.py decode PNG WxH           the PNG decodes at WxH, is not blank, and has the
                                         train-loss colour (a real run's picture)
  plot_check.py check PNG WxH [TURN [START]]
                                         the PNG decodes at WxH and, inside the top panel's
                                         plot area, the train-loss colour is in most columns
                                         with its mean row moving down from left to right,
                                         and the validation-loss colour goes down, then up,
                                         its lowest point at x fraction TURN (+-0.08) of the
                                         plot area when given, and the train loss's first
                                         column at x fraction START (+-0.03) when given (where
                                         the first row sits on an axis from 0); exit 1 saying
                                         what failed
  plot_check.py blank PNG WxH            write a white PNG (the checker must refuse it)
  plot_check.py svg SVG WxH              the SVG parses as XML with an <svg> root of that size

The PNG decoder is written here with zlib (the standard library has no PNG reader): 8-bit RGB
or RGBA, not interlaced — what cairo writes. Colours are plot.h's.
"""
import math
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

TRAIN_LOSS = (0x1F, 0x77, 0xB4)
VAL_LOSS = (0xFF, 0x7F, 0x0E)


def fail(msg):
    print("plot_check: " + msg)
    sys.exit(1)


def decode_png(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path}: not a PNG")
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if zlib.crc32(kind + body) != struct.unpack(">I", data[pos + 8 + n:pos + 12 + n])[0]:
            fail(f"{path}: bad CRC in a {kind!r} chunk")
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + n
    if not hdr:
        fail(f"{path}: no IHDR")
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail(f"{path}: unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})")
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                fail(f"{path}: bad filter {f} on row {y}")
        prev = line
        px = []
        for x in range(w):
            r, g, b_ = line[x * bpp:x * bpp + 3]
            if bpp == 4:  # over white, as a viewer shows it
                al = line[x * bpp + 3]
                r, g, b_ = [(v * al + 255 * (255 - al)) // 255 for v in (r, g, b_)]
            px.append((r, g, b_))
        rows.append(px)
    return w, h, rows


def near(p, c, tol=40):
    return max(abs(p[0] - c[0]), abs(p[1] - c[1]), abs(p[2] - c[2])) <= tol


def dark(p):
    return max(p) < 160  # the frame: black, antialiased over two pixels


def decode(path, size):
    w, h, px = decode_png(path)
    ww, hh = (int(v) for v in size.split("x"))
    if (w, h) != (ww, hh):
        fail(f"{path}: {w}x{h}, expected {ww}x{hh}")
    colours = {c for row in px[::4] for c in row[::4]}
    if len(colours) < 8:
        fail(f"{path}: {len(colours)} colours: a blank or single-colour image")
    cols = sum(any(near(px[y][x], TRAIN_LOSS) for y in range(h)) for x in range(w))
    if cols < 0.3 * w:
        fail(f"{path}: the train-loss colour is in only {cols} of {w} columns")
    return w, h, px


def check(path, size, turn, start=None):
    w, h, px = decode(path, size)
    # The plot area: the frames' left and right edges are the columns that are dark over half
    # the image's height; the panels' top and bottom edges the rows dark across that width.
    col_dark = [sum(dark(px[y][x]) for y in range(h)) for x in range(w)]
    edges = [x for x in range(w) if col_dark[x] > 0.4 * h]
    if len(edges) < 2:
        fail(f"{path}: no plot frame found (no column dark over 40% of the height)")
    x0, x1 = min(edges), max(edges)
    if x1 - x0 < 0.3 * w:
        fail(f"{path}: the plot area is only columns {x0}..{x1}")
    span = x1 - x0
    hrows = [y for y in range(h) if sum(dark(px[y][x]) for x in range(x0, x1 + 1)) > 0.8 * span]
    groups = []
    for y in hrows:
        if groups and y - groups[-1][-1] <= 2:
            groups[-1].append(y)
        else:
            groups.append([y])
    if len(groups) < 2:
        fail(f"{path}: no panel frame (rows dark across the plot area: {hrows[:10]})")
    top, bottom = groups[0][-1] + 1, groups[1][0] - 1
    height = bottom - top

    def rows_of(colour):
        out = {}
        for x in range(x0 + 2, x1 - 1):
            ys = [y for y in range(top + 1, bottom) if near(px[y][x], colour)]
            if ys:
                out[x] = sum(ys) / len(ys)
        return out

    tr, va = rows_of(TRAIN_LOSS), rows_of(VAL_LOSS)
    inner = x1 - x0 - 3
    if len(tr) < 0.6 * inner:
        fail(f"{path}: the train-loss colour is in {len(tr)} of the top panel's {inner} columns")
    xs = sorted(tr)
    thirds = [xs[:len(xs) // 3], xs[len(xs) // 3:2 * len(xs) // 3], xs[2 * len(xs) // 3:]]
    means = [sum(tr[x] for x in t) / len(t) for t in thirds]
    if not (means[0] + 0.03 * height < means[1] and means[1] + 0.03 * height < means[2]):
        fail(f"{path}: the train loss's mean row by thirds, {means}, does not move down")
    first_x = (min(tr) - x0) / span
    if start is not None and abs(first_x - start) > 0.03:
        fail(f"{path}: the train loss starts at {first_x:.3f} of the x axis, expected {start} "
             "(the axis starts at 0)")
    if len(va) < 0.6 * inner:
        fail(f"{path}: the validation-loss colour is in {len(va)} of {inner} columns")
    vx = sorted(va)
    # smooth over 5 columns, then find the lowest point on the image (the least loss)
    sm = {x: sum(va[k] for k in vx[max(0, i - 2):i + 3]) / len(vx[max(0, i - 2):i + 3])
          for i, x in enumerate(vx)}
    low = max(vx, key=lambda x: sm[x])
    at = (low - x0) / span
    first, last = sum(sm[x] for x in vx[:5]) / 5, sum(sm[x] for x in vx[-5:]) / 5
    if not (first < sm[low] - 0.03 * height):
        fail(f"{path}: the validation loss does not fall first (row {first:.0f} at the left, "
             f"{sm[low]:.0f} at its lowest point)")
    if not (last < sm[low] - 0.2 * height):
        fail(f"{path}: the validation loss does not turn upward (row {last:.0f} at the right, "
             f"{sm[low]:.0f} at its lowest point, panel {height} rows)")
    if turn is not None and abs(at - turn) > 0.08:
        fail(f"{path}: the validation loss turns at {at:.2f} of the x axis, expected {turn}")
    print(f"plot_check: {path}: {w}x{h}, plot area x {x0}..{x1}, top panel rows {top}..{bottom}; "
          f"train loss in {len(tr)}/{inner} columns, mean rows {[round(m) for m in means]}; "
          f"validation turns at {at:.2f}, the train loss starts at {first_x:.3f}")


def metrics(path, turning=True):
    cols = ("epoch,step,lr,train_loss,grad_norm,val_loss,val_accuracy,samples_per_s,"
            "data_wait_pct,peak_memory,train_accuracy,test_loss,test_accuracy")
    with open(path, "w") as f:
        f.write(cols + "\n")
        for e in range(1, 9):
            tl = 2.0 * math.exp(-0.35 * e)
            vl = 0.9 + 0.12 * (e - 3) ** 2 if turning else 2.2 * math.exp(-0.3 * e)
            f.write(f"{e},{e * 100},{0.1 * 0.8 ** e:.6g},{tl:.6g},1.0,{vl:.6g},"
                    f"{0.5 + 0.04 * e:.4g},1000,1,100,{0.5 + 0.05 * e:.4g},nan,nan\n")


def blank(path, size):
    w, h = (int(v) for v in size.split("x"))
    raw = b"".join(b"\0" + b"\xff" * (3 * w) for _ in range(h))

    def chunk(k, b):
        return struct.pack(">I", len(b)) + k + b + struct.pack(">I", zlib.crc32(k + b))
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def svg(path, size):
    w, h = size.split("x")
    root = ET.parse(path).getroot()
    if not root.tag.endswith("svg"):
        fail(f"{path}: root element {root.tag}, not svg")
    rw, rh = root.get("width", ""), root.get("height", "")
    if not (rw.startswith(w) and rh.startswith(h)):
        fail(f"{path}: size {rw}x{rh}, expected {size}")
    if len(list(root.iter())) < 20:
        fail(f"{path}: only {len(list(root.iter()))} elements")
    print(f"plot_check: {path}: svg {rw}x{rh}, {len(list(root.iter()))} elements")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["metrics"] and len(a) == 2:
        metrics(a[1])
    elif a[:1] == ["falling"] and len(a) == 2:
        metrics(a[1], turning=False)
    elif a[:1] == ["decode"] and len(a) == 3:
        decode(a[1], a[2])
        print(f"plot_check: {a[1]}: decodes at {a[2]}")
    elif a[:1] == ["check"] and len(a) in (3, 4, 5):
        check(a[1], a[2], float(a[3]) if len(a) >= 4 else None,
              float(a[4]) if len(a) == 5 else None)
    elif a[:1] == ["blank"] and len(a) == 3:
        blank(a[1], a[2])
    elif a[:1] == ["svg"] and len(a) == 3:
        svg(a[1], a[2])
    else:
        print(__doc__)
        sys.exit(2)
