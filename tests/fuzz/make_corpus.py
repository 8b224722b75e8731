#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): small valid inputs
of each reader's features and one input per kind of malformation. Plain Python (gzip, json,
struct), no third-party package.

    python3 tests/fuzz/make_corpus.py [--build DIR] [TARGET...]

TARGET is safetensors, config, idx, csv or checkpoint (default: all). The checkpoint seeds
start from real checkpoints written by Ember itself: DIR (default: build) must hold a built
tests/fuzz/replay_checkpoint, which writes them when FUZZ_CHECKPOINT_WRITE_SEEDS is set; the
malformed ones are edits of those. Each corpus directory is emptied first, except the
safetensors files written by Python's safetensors (valid_python_*), which are kept."""
import gzip
import json
import os
import struct
import subprocess
import sys
import tempfile

FUZZ = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(FUZZ))


# ---- safetensors ------------------------------------------------------------------------

def st(header, data=b"", pad=True, hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


def t(dtype, shape, b, e):
    return {"dtype": dtype, "shape": shape, "data_offsets": [b, e]}


def safetensors():
    return {
        "valid_f32_meta": st({"__metadata__": {"format": "pt", "epoch": "3"},
                              "w": t("F32", [2, 2], 0, 16)}, bytes(range(16))),
        "valid_every_dtype": st({
            "a": t("I64", [2], 0, 16), "b": t("F64", [1], 16, 24), "c": t("F32", [1, 1], 24, 28),
            "d": t("I32", [1], 28, 32), "e": t("BF16", [2], 32, 36), "f": t("F16", [1], 36, 38),
            "g": t("U8", [1], 38, 39), "h": t("BOOL", [1], 39, 40)}, bytes(range(40))),
        "valid_scalar_and_empty": st({"s": t("F32", [], 0, 4), "z": t("F64", [0, 7], 4, 4)},
                                     b"\x00\x00\x80\x3f"),
        "valid_no_tensors": st({}),
        "valid_unpadded_leading_space": st(
            b' {"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}', b"abc", pad=False),
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


# ---- config (YAML) ----------------------------------------------------------------------

def config():
    files = {}
    for name in sorted(os.listdir(os.path.join(SRC, "examples"))):
        if name.endswith(".yaml"):
            with open(os.path.join(SRC, "examples", name), "rb") as f:
                files["valid_example_" + name[:-5].replace("-", "_")] = f.read()
    files.update({
        "valid_empty": b"",
        "valid_flow_and_block": b"a: [1, 2, {b: c}]\nd:\n  - e\n  - {f: [g, h]}\n",
        "valid_scalars": b"i: 1\nf: -2.5e-3\nb: true\nn: ~\ns: 'quoted: yes'\nd: \"esc\\t\\u00e9\"\n"
                         b"lit: |\n  two\n  lines\nfold: >\n  folded\n  text\n",
        "valid_anchor_alias": b"base: &b {lr: 0.1, momentum: 0.9}\nopt: *b\nlist: [*b, *b]\n",
        "valid_merge_key": b"base: &b {x: 1}\nother:\n  <<: *b\n  y: 2\n",
        "valid_tags": b"a: !!str 12\nb: !!int '7'\nc: !custom value\n",
        "valid_deep": b"a:" + b" [" * 60 + b"1" + b"]" * 60 + b"\n",
        "valid_comment_only": b"# nothing here\n",
        "valid_bom_crlf": b"\xef\xbb\xbfa: 1\r\nb: 2\r\n",
        "bad_duplicate_key": b"a: 1\nb: 2\na: 3\n",
        "bad_map_key": b"? [1, 2]\n: x\n",
        "bad_syntax_indent": b"a:\n  b: 1\n c: 2\n",
        "bad_unclosed_flow": b"a: [1, 2\n",
        "bad_unclosed_quote": b"a: 'text\n",
        "bad_undefined_alias": b"a: *nowhere\n",
        "bad_too_deep": b"a:" + b" [" * 80 + b"1" + b"]" * 80 + b"\n",
        "bad_two_documents": b"a: 1\n---\nb: 2\n",
        "bad_tab_indent": b"a:\n\tb: 1\n",
        "bad_nul": b"a: 1\x00\nb: 2\n",
    })
    return files


# ---- IDX (mnist) ------------------------------------------------------------------------

def idx_images(n, h, w, magic=0x803, pixels=None):
    data = pixels if pixels is not None else bytes((i * 7) % 256 for i in range(n * h * w))
    return struct.pack(">IIII", magic, n, h, w) + data


def idx_labels(n, labels=None, magic=0x801):
    return struct.pack(">II", magic, n) + (labels if labels is not None else
                                           bytes(i % 10 for i in range(n)))


def idx_input(images, labels, flags=0):
    return bytes([flags]) + struct.pack("<H", len(images)) + images + labels


def idx():
    g = lambda b: gzip.compress(b, mtime=0)
    return {
        "valid_raw": idx_input(idx_images(3, 2, 2), idx_labels(3)),
        "valid_gzip": idx_input(g(idx_images(4, 3, 2)), g(idx_labels(4))),
        "valid_test_split_256_classes": idx_input(idx_images(2, 1, 3),
                                                  idx_labels(2, b"\xff\x80"), flags=3),
        "valid_one_raw_one_gzip": idx_input(idx_images(2, 2, 2), g(idx_labels(2))),
        "bad_magic": idx_input(idx_images(2, 2, 2, magic=0x801), idx_labels(2)),
        "bad_label_magic": idx_input(idx_images(2, 2, 2), idx_labels(2, magic=0x803)),
        "bad_truncated_images": idx_input(idx_images(3, 2, 2)[:-3], idx_labels(3)),
        "bad_truncated_gzip": idx_input(g(idx_images(3, 2, 2))[:-6], idx_labels(3)),
        "bad_trailing_bytes": idx_input(idx_images(2, 2, 2) + b"xx", idx_labels(2)),
        "bad_count_mismatch": idx_input(idx_images(3, 2, 2), idx_labels(2)),
        "bad_label_range": idx_input(idx_images(2, 2, 2), idx_labels(2, b"\x01\x0a")),
        "bad_zero_items": idx_input(idx_images(0, 2, 2), idx_labels(0)),
        "bad_zero_width": idx_input(idx_images(2, 2, 0, pixels=b""), idx_labels(2)),
        "bad_huge_claim": idx_input(struct.pack(">IIII", 0x803, 1 << 20, 256, 256) + bytes(10),
                                    idx_labels(1 << 20, b"")),
        "bad_short_header": idx_input(b"\x00\x00\x08\x03\x00", idx_labels(1)),
    }


# ---- CSV ----------------------------------------------------------------------------------

def csv():
    c = lambda flags, text: bytes([flags]) + text
    return {
        "valid_header_labels": c(0, b"x1,x2,label\n1.5,-2,0\n\n3,\"4e1\",2\n  5 ,6,1\n"),
        "valid_no_header_first_label": c(0x28, b"1,0.5,0.25\n0,1,2\n"),
        "valid_semicolons": c(1, b"a;b;c\n1;2;0\n3;4;1\n"),
        "valid_tabs_regression": c(0x12, b"t\tx\ty\n0.5\t1\t2\n1.5\t3\t4\n"),
        "valid_spaces": c(3, b"1 2 0\n3 4 1\n"),
        "valid_quotes_crlf": c(0, b"\"a\",\"b\",\"c\"\r\n\"1\",\"2\",\"0\"\r\n"),
        "valid_bom": c(0, b"\xef\xbb\xbf1,2,0\n3,4,1\n"),
        "valid_no_final_newline": c(0, b"1,2,0\n3,4,1"),
        "bad_ragged": c(0, b"f1,f2,label\n1,2,0\n3,4\n"),
        "bad_not_a_number": c(0, b"1,2,0\n5,abc,1\n"),
        "bad_empty_field": c(0, b"1,2,0\n3,,1\n"),
        "bad_label_fraction": c(0, b"1,2,0.5\n"),
        "bad_unclosed_quote": c(0, b"1,2,\"0\n"),
        "bad_header_only": c(0, b"x,y\n"),
        "bad_empty": c(0, b""),
        "bad_nul_in_field": c(0, b"1,2,0\n1\x00garbage,2,0\n"),
        "bad_one_column_labels": c(0, b"1\n2\n"),
        "bad_inf": c(0, b"1,inf,0\n"),
        "bad_negative_label": c(0, b"1,2,-1\n"),
    }


# ---- checkpoint ---------------------------------------------------------------------------

def st_parse(blob):
    hlen = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + hlen]), blob[8 + hlen:]


def st_build(header, data):
    return st(json.dumps(header, separators=(",", ":")).encode(), data)


def edit_meta(blob, **changes):
    h, data = st_parse(blob)
    for k, v in changes.items():
        k = k.replace("__", ".")
        if v is None:
            h["__metadata__"].pop(k, None)
        else:
            h["__metadata__"][k] = v
    return st_build(h, data)


def add_tensor(blob, key, dtype, shape, nbytes):
    h, data = st_parse(blob)
    h[key] = t(dtype, shape, len(data), len(data) + nbytes)
    return st_build(h, data + bytes(nbytes))


def drop_tensor(blob, key):
    h, data = st_parse(blob)
    b, e = h.pop(key)["data_offsets"]
    n = e - b
    for v in h.values():
        if isinstance(v, dict) and "data_offsets" in v and v["data_offsets"][0] >= e:
            v["data_offsets"] = [v["data_offsets"][0] - n, v["data_offsets"][1] - n]
    return st_build(h, data[:b] + data[e:])


def checkpoint(build):
    exe = os.path.join(build, "tests", "fuzz", "replay_checkpoint")
    if not os.path.exists(exe):
        sys.exit("make_corpus.py: no %s: build the tree first (make), or pass --build DIR" % exe)
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, FUZZ_CHECKPOINT_WRITE_SEEDS=d, EMBER_LOG="error")
        subprocess.run([exe], env=env, check=True)
        with open(os.path.join(d, "valid_fresh"), "rb") as f:
            fresh = f.read()
        with open(os.path.join(d, "valid_trained"), "rb") as f:
            trained = f.read()
    h, _ = st_parse(trained)
    meta = h["__metadata__"]
    state = sorted(k for k in h if k.startswith("optim.state."))
    return {
        "valid_fresh": fresh,
        "valid_trained": trained,
        "bad_not_a_checkpoint": edit_meta(trained, ember__checkpoint=None),
        "bad_format_version": edit_meta(trained, ember__checkpoint="99"),
        "bad_parts_missing": edit_meta(trained, ember__parts=None),
        "bad_parts_lacking": edit_meta(trained, ember__parts="model"),
        "bad_optim_groups_json": edit_meta(trained, optim__param_groups="{\"class\":"),
        "bad_optim_class": edit_meta(trained, optim__param_groups=meta["optim.param_groups"]
                                     .replace("Adam", "SGD")),
        "bad_sched_state": edit_meta(trained, sched__state="[]"),
        "bad_loader_batch": edit_meta(trained, loader__state="{\"seed\":\"1\",\"epoch\":0,"
                                      "\"batch\":-5}"),
        "bad_loader_huge_batch": edit_meta(trained, loader__state="{\"seed\":\"1\",\"epoch\":0,"
                                           "\"batch\":100000000000000000000}"),
        "bad_rng": edit_meta(trained, rng__default="{\"seed\":\"x\"}"),
        "bad_loop": edit_meta(trained, loop="{\"epoch\":1}"),
        "bad_loop_huge_step": edit_meta(trained, loop="{\"epoch\":1,\"step\":9223372036854775807,"
                                        "\"best_metric\":\"nan\"}"),
        "bad_best_metric": edit_meta(trained, loop="{\"epoch\":1,\"step\":2,\"best_metric\":[]}"),
        "bad_unexpected_model_key": add_tensor(trained, "model.extra", "F32", [2], 8),
        "bad_missing_model_key": drop_tensor(trained, "model.bias"),
        "bad_model_shape": add_tensor(drop_tensor(trained, "model.bias"), "model.bias", "F32",
                                      [3], 12),
        "bad_foreign_tensor": add_tensor(trained, "other", "U8", [1], 1),
        "bad_optim_key": add_tensor(trained, "optim.state.x", "F32", [], 4),
        "bad_optim_index": add_tensor(trained, "optim.state.9.exp_avg", "F32", [2], 8),
        "bad_optim_shape": add_tensor(drop_tensor(trained, state[0]), state[0], "F32", [7], 28),
        "bad_optim_zero_dim_state": add_tensor(drop_tensor(trained, state[0]), state[0], "F32",
                                               [], 4),
        "bad_truncated": trained[:len(trained) - 5],
    }


TARGETS = {"safetensors": safetensors, "config": config, "idx": idx, "csv": csv,
           "checkpoint": checkpoint}


def main():
    args = sys.argv[1:]
    build = os.path.join(SRC, "build")
    if args[:1] == ["--build"]:
        build, args = os.path.abspath(args[1]), args[2:]
    for name in args or list(TARGETS):
        if name not in TARGETS:
            sys.exit("make_corpus.py: unknown target %s (one of %s)" % (name, ", ".join(TARGETS)))
        files = TARGETS[name](build) if name == "checkpoint" else TARGETS[name]()
        out = os.path.join(FUZZ, "corpus", name)
        os.makedirs(out, exist_ok=True)
        for old in os.listdir(out):
            if not old.startswith("valid_python_"):
                os.unlink(os.path.join(out, old))
        for fname, blob in files.items():
            with open(os.path.join(out, fname), "wb") as f:
                f.write(blob)
        print("wrote", len(files), "files to", out)


if __name__ == "__main__":
    main()
