#!/usr/bin/env python3
"""Write the seed corpus of the safetensors fuzzer (tests/fuzz/corpus/): small valid files
of every dtype and layout feature, and one file per kind of malformation. Plain Python, no
safetensors needed: python3 tests/fuzz/make_corpus.py"""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def st(header, data=b"", pad=True, hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


FILES = {
    "valid_f32_meta": st({"__metadata__": {"format": "pt", "epoch": "3"},
                          "w": t("F32", [2, 2], 0, 16)}, bytes(range(16))),
    "valid_every_dtype": st({
        "a": t("I64", [2], 0, 16), "b": t("F64", [1], 16, 24), "c": t("F32", [1, 1], 24, 28),
        "d": t("I32", [1], 28, 32), "e": t("BF16", [2], 32, 36), "f": t("F16", [1], 36, 38),
        "g": t("U8", [1], 38, 39), "h": t("BOOL", [1], 39, 40)}, bytes(range(40))),
    "valid_scalar_and_empty": st({"s": t("F32", [], 0, 4), "z": t("F64", [0, 7], 4, 4)},
                                 b"\x00\x00\x80\x3f"),
    "valid_no_tensors": st({}),
    "valid_unpadded_leading_space": st(b' {"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}',
                                       b"abc", pad=False),
    "bad_truncated": st({"w": t("F32", [4], 0, 16)}, bytes(8)),
    "bad_header_past_end": st({"w": t("U8", [1], 0, 1)}, b"x", hlen=4096),
    "bad_header_too_big": st({}, hlen=100000001),
    "bad_overlap": st({"a": t("F32", [2], 0, 8), "b": t("F32", [2], 4, 12)}, bytes(12)),
    "bad_hole": st({"a": t("U8", [2], 2, 4)}, bytes(4)),
    "bad_shape_bytes": st({"a": t("F32", [3], 0, 8)}, bytes(8)),
    "bad_duplicate": st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                        b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"x"),
    "bad_json": st(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]', b"x"),
    "bad_dtype_i8": st({"q": t("I8", [2], 0, 2)}, b"\x01\x02"),
    "bad_metadata_int": st(b'{"__metadata__":{"k":1}}'),
    "bad_nine_dims": st({"a": t("U8", [1] * 9, 0, 1)}, b"x"),
    "bad_short": b"\x05\x00\x00",
}


def main():
    os.makedirs(HERE, exist_ok=True)
    for name, blob in FILES.items():
        with open(os.path.join(HERE, name), "wb") as f:
            f.write(blob)
    print("wrote", len(FILES), "files to", HERE)


if __name__ == "__main__":
    main()
