"""tests/onnx_check.py — judges Ember's ONNX files by other programs (tests/test_onnx.sh).

  onnx_check.py checker DIR   every DIR/*.onnx through onnx's full checker (Debian's
                              python3-onnx, the system python): the model, its opset's
                              schemas and shape inference; the initializers'
                              names against DIR/NAME.keys.txt (the state-dict keys)
  onnx_check.py run DIR       every DIR/NAME.opK.onnx in ONNX Runtime (the venv's python)
                              on DIR/NAME.bB.in.npy against Ember's DIR/NAME.bB.out.npy,
                              allclose(rtol=1e-5, atol=1e-6), for each batch B written

  onnx_check.py trainer MODEL.onnx PRED.csv IMAGES.idx.gz
                              ember-train's --export-onnx model (uint8 input, its transforms
                              as the first nodes) in ONNX Runtime on the raw IDX images against
                              the logits ember-train --predict --predict-scores logits wrote

Exit 0, or 1 after listing every mismatch.
"""
import glob
import os
import sys

import numpy as np


def checker(d):
    import onnx
    files = sorted(glob.glob(os.path.join(d, "*.onnx")))
    if not files:
        print("no .onnx files in", d)
        return 1
    bad = 0
    for f in files:
        try:
            m = onnx.load(f)
            onnx.checker.check_model(m, full_check=True)
            assert m.producer_name == "ember", m.producer_name
            assert m.ir_version == 8, m.ir_version
        except Exception as e:  # noqa: BLE001 - report every file's fault
            print("FAIL checker %s: %s" % (os.path.basename(f), e))
            bad += 1
    # the transforms: first nodes (raw uint8 input) by default, else only in the metadata
    u8, f32 = onnx.TensorProto.UINT8, onnx.TensorProto.FLOAT
    for f, elem, first in (("mlp.op17.onnx", u8, "Cast"), ("meta.onnx", f32, "Flatten")):
        if not os.path.exists(os.path.join(d, f)):
            continue
        m = onnx.load(os.path.join(d, f))
        meta = {p.key: p.value for p in m.metadata_props}
        got = (m.graph.input[0].type.tensor_type.elem_type, m.graph.node[0].op_type)
        if got != (elem, first) or "x / 255" not in meta.get("ember.input_transforms", ""):
            print("FAIL %s: input type and first node %s, metadata %s" % (f, got, meta))
            bad += 1
    # initializers carry the state-dict keys: as they are where the tensor is used as is,
    # else (the LSTM/GRU gates reordered) "KEY+KEY...:onnx_ORDER" under the layer's path;
    # every key is in some initializer's name, and nothing else is named like a key
    models = os.path.join(d, "models.txt")
    for name in open(models).read().split() if os.path.exists(models) else []:
        keys = open(os.path.join(d, name + ".keys.txt")).read().split()
        m = onnx.load(os.path.join(d, name + ".op17.onnx"))
        named = [i.name for i in m.graph.initializer if not i.name.startswith("/")]
        covered = set()
        for n in named:
            if n in keys:
                covered.add(n)
                continue
            base, _, order = n.partition(":")
            prefix, dot, first = base.split("+")[0].rpartition(".")
            parts = [prefix + dot + p if i else prefix + dot + first
                     for i, p in enumerate(base.split("+"))]
            if order not in ("onnx_iofc", "onnx_zrh") or not set(parts) <= set(keys):
                print("FAIL %s: initializer %r is neither a state-dict key nor made of them"
                      % (name, n))
                bad += 1
            covered.update(parts)
        missing = [k for k in keys if k not in covered]
        # buffers that the graph does not read (BatchNorm's num_batches_tracked)
        missing = [k for k in missing if not k.endswith("num_batches_tracked")]
        if missing:
            print("FAIL %s: state-dict keys without an initializer: %s" % (name, missing))
            bad += 1
    print("onnx %s checker: %d files, %d failed" % (onnx.__version__, len(files), bad))
    return 1 if bad else 0


def run(d):
    import onnxruntime as ort
    names = open(os.path.join(d, "models.txt")).read().split()
    bad = n = 0
    for name in names:
        for f in sorted(glob.glob(os.path.join(d, name + ".op*.onnx"))):
            so = ort.SessionOptions()
            so.log_severity_level = 3
            s = ort.InferenceSession(f, so, providers=["CPUExecutionProvider"])
            iname, oname = s.get_inputs()[0].name, s.get_outputs()[0].name
            for inp in sorted(glob.glob(os.path.join(d, name + ".b*.in.npy"))):
                x = np.load(inp)
                want = np.load(inp.replace(".in.npy", ".out.npy"))
                got = s.run([oname], {iname: x})[0]
                n += 1
                if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
                    err = np.abs(got - want).max() if got.shape == want.shape else "shape"
                    print("FAIL %s on %s: %s vs Ember's %s, max |diff| %s"
                          % (os.path.basename(f), os.path.basename(inp), got.shape, want.shape, err))
                    bad += 1
    print("onnxruntime %s: %d runs, %d mismatched" % (ort.__version__, n, bad))
    return 1 if bad or n == 0 else 0


def trainer(model, pred, images):
    import gzip
    import onnxruntime as ort
    raw = gzip.open(images).read()
    n, h, w = (int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(3))
    x = np.frombuffer(raw, np.uint8, n * h * w, 16).reshape(n, 1, h, w)
    rows = [line.split(",") for line in open(pred).read().split()[1:]]
    want = np.array([[float(v) for v in r[3:]] for r in rows], np.float32)
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    assert s.get_inputs()[0].type == "tensor(uint8)", s.get_inputs()[0].type
    bad = 0
    for b in (1, 7, n):
        got = np.concatenate([s.run(None, {s.get_inputs()[0].name: x[i:i + b]})[0]
                              for i in range(0, n, b)])
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-5, atol=1e-6):
            print("FAIL trainer: batches of %d: max |diff| %s" % (b, np.abs(got - want).max()))
            bad += 1
    print("trainer: %d digits in batches of 1, 7 and %d: %s" % (n, n, "FAIL" if bad else "ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1] == "trainer":
        sys.exit(trainer(*sys.argv[2:5]))
    sys.exit({"checker": checker, "run": run}[sys.argv[1]](sys.argv[2]))
