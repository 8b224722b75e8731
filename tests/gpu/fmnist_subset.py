#!/usr/bin/python3
"""fmnist_subset.py SRC_DIR DST_DIR N_TRAIN N_TEST

Write the first N_TRAIN training and the first N_TEST test images and labels of the
Fashion-MNIST IDX files in SRC_DIR (Debian: apt-get install dataset-fashion-mnist, which puts
them in /usr/share/datasets/fashion-mnist) to DST_DIR as uncompressed IDX files with the same
names (train-images-idx3-ubyte, ...), which the 'mnist' dataset class reads. The first items,
in file order, so the subset is the same on every machine: the GPU harness's bundle carries
it and the committed CPU reference of tests/gpu/train_ref was made from it.
Fashion-MNIST is MIT-licensed (Zalando Research); see tests/gpu/README.md.
"""
import gzip
import os
import struct
import sys


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        sys.exit(f"fmnist_subset: {path}: not an unsigned-byte IDX file")
    ndim = data[3]
    dims = list(struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim]))
    return dims, data[4 + 4 * ndim:]


def find(src, stem):
    for name in (stem, stem + ".gz"):
        p = os.path.join(src, name)
        if os.path.exists(p):
            return p
    sys.exit(f"fmnist_subset: {src} has no {stem} or {stem}.gz "
             "(apt-get install dataset-fashion-mnist)")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    src, dst, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.makedirs(dst, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        for kind, nd in (("images", 3), ("labels", 1)):
            stem = f"{prefix}-{kind}-idx{nd}-ubyte"
            dims, body = read_idx(find(src, stem))
            if len(dims) != nd or n > dims[0]:
                sys.exit(f"fmnist_subset: {stem}: dims {dims}, asked for {n} items")
            item = 1
            for d in dims[1:]:
                item *= d
            out = bytes([0, 0, 8, nd]) + struct.pack(">" + "I" * nd, n, *dims[1:]) + body[:n * item]
            with open(os.path.join(dst, stem), "wb") as f:
                f.write(out)


if __name__ == "__main__":
    main()
