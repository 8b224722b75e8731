#!/usr/bin/python3
"""Convert scikit-learn's bundled copy of the UCI optdigits test set (digits.csv.gz, 1797
handwritten digits of 8x8 pixels valued 0..16, one label 0..9 per row) into the MNIST IDX
format that Ember's "mnist" dataset class reads, once; the output is committed under
data/digits/.

    data/convert_digits.py [/path/to/digits.csv.gz]     (default: python3-sklearn's copy)

Split: the first 1500 rows are train (train-*), the last 297 test (t10k-*), in the file's
order (its classes cycle through 0..9, so both splits hold every class). Pixels are scaled
from 0..16 to 0..255 (round(v * 255 / 16)) so that the usual to-float scaling of 1/255 gives
[0, 1], as for MNIST. Files are gzip-compressed with a zero timestamp, so reruns give
identical bytes. Uses only the standard library."""
import csv
import gzip
import os
import struct
import sys

SRC = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
NTRAIN = 1500


def write_gz(path, data):
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(data)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else SRC
    with gzip.open(src, "rt") as f:
        rows = [list(map(int, r)) for r in csv.reader(f) if r]
    assert len(rows) == 1797 and all(len(r) == 65 for r in rows), "unexpected digits.csv layout"
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits")
    os.makedirs(out, exist_ok=True)
    for prefix, part in (("train", rows[:NTRAIN]), ("t10k", rows[NTRAIN:])):
        images = bytearray(struct.pack(">IIII", 0x803, len(part), 8, 8))
        labels = bytearray(struct.pack(">II", 0x801, len(part)))
        for r in part:
            assert all(0 <= v <= 16 for v in r[:64]) and 0 <= r[64] <= 9
            images += bytes(round(v * 255 / 16) for v in r[:64])
            labels.append(r[64])
        write_gz(os.path.join(out, prefix + "-images-idx3-ubyte.gz"), bytes(images))
        write_gz(os.path.join(out, prefix + "-labels-idx1-ubyte.gz"), bytes(labels))
        print(f"{prefix}: {len(part)} images")


if __name__ == "__main__":
    main()
