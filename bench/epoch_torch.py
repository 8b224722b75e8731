#!/usr/bin/python3
"""An Ember MNIST-class config (examples/fashion-mnist-mlp.yaml) trained by PyTorch: the same
IDX files, model, optimizer and loop settings, the same sets evaluated, as one process, for
the whole-process comparison of bench/epoch.sh (issue 27).

    bench/epoch_torch.py examples/fashion-mnist-mlp.yaml [--epochs N] [--path DIR] [--threads N]

Everything is read from the config (PyYAML), and anything this script does not mirror
exactly (a layer class or option, a data key, a transform, an optimizer or option, a loss, a
scheduler, a loop key) is an error naming it, so the twin cannot drift from the config
silently. Flags given beside it override the config's value (--epochs, --path) and are
printed.

Data, as Ember's "mnist" class (plugins/data/idx.c): in the directory, the train-* (split
train) or t10k-* (split test) images and labels files, an uncompressed file preferred to a
.gz; parsed here (magic, dims, counts, label range) into (N, 1, H, W) uint8 and int64 labels.
The batches are to_float's x / 255 in float32 (Ember's default for uint8 inputs), made per
batch from the uint8 tensor, as Ember's loader does. data.validation as a count or a fraction
of the training split: a random split of that many items (Ember's em_random_split: the same
sizes; PyTorch's generator, so other items). The training set is shuffled each epoch
(loop.shuffle), every batch kept (the last one short); validation after each epoch and the
test set after the last, in eval mode without gradients, at loop.eval_batch_size (default
batch_size) — what ember-train prints. loop.workers is accepted and not mirrored: it says how
Ember's loader fills batches, not what they hold; PyTorch indexes the tensors in memory on its
own thread, its fastest way for a dataset this size (a DataLoader worker process is slower).

Model: Flatten, Linear, ReLU, Dropout as PyTorch's, with PyTorch's default initialisation
(Ember's Linear initialises the same way: kaiming-uniform weights, uniform biases); the loss
is CrossEntropyLoss (ember-train's default for class labels). Optimizer SGD or Adam with its
options and parameter groups (params: name patterns, fnmatch, first match wins; the rest in
the optimizer's defaults, as ember-train). The seed seeds torch (initialisation) and the
shuffle; PyTorch's random streams are not Ember's, so the runs start from different draws of
the same distributions.

--threads N calls torch.set_num_threads(N) (bench/epoch.sh's "passive" and "threads"
configurations); without it torch keeps its default. Runs under Debian's python3-torch (1.13)
or a newer PyTorch; prints the torch version.
"""
import argparse
import fnmatch
import gzip
import os
import sys
import time

from ember_config import REQUIRED, ConfigError, take  # bench/ember_config.py

T_START = time.perf_counter()

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402






# ---- the IDX files, as Ember's mnist class reads them ------------------------------------------


def find_file(path, prefix, kind):
    names = [n for n in os.listdir(path) if n.startswith(prefix) and kind in n]
    if not names:
        raise ConfigError(f"{path}: no {prefix}{kind}* file")
    # an uncompressed file wins over a .gz, then the first name
    names.sort(key=lambda n: (n.endswith(".gz"), n))
    return os.path.join(path, names[0])


def read_idx(file, ndims):
    with open(file, "rb") as f:
        raw = f.read()
    if file.endswith(".gz"):
        raw = gzip.decompress(raw)
    if len(raw) < 4 + 4 * ndims or raw[:4] != bytes([0, 0, 8, ndims]):
        raise ConfigError(f"{file}: not an IDX file of unsigned bytes with {ndims} dims")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndims)]
    start, count = 4 + 4 * ndims, 1
    for d in dims:
        count *= d
    if len(raw) != start + count:
        raise ConfigError(f"{file}: {len(raw) - start} data bytes for dims {dims}")
    data = torch.frombuffer(bytearray(raw[start:]), dtype=torch.uint8)
    return data.view(*dims)


def read_split(path, split, classes):
    prefix = "train-" if split == "train" else "t10k-"
    images = read_idx(find_file(path, prefix, "images"), 3)
    labels = read_idx(find_file(path, prefix, "labels"), 1)
    if len(images) != len(labels):
        raise ConfigError(f"{path}: {len(images)} {prefix} images but {len(labels)} labels")
    if len(labels) and int(labels.max()) >= classes:
        raise ConfigError(f"{path}: a {prefix} label outside [0, {classes})")
    return images.unsqueeze(1), labels.long()


# ---- the config --------------------------------------------------------------------------------

LAYERS = {
    "Flatten": ({"start_dim": 1, "end_dim": -1},
                lambda o: nn.Flatten(o["start_dim"], o["end_dim"])),
    "Linear": ({"in_features": REQUIRED, "out_features": REQUIRED, "bias": True},
               lambda o: nn.Linear(o["in_features"], o["out_features"], bias=o["bias"])),
    "ReLU": ({}, lambda o: nn.ReLU()),
    "Dropout": ({"p": 0.5}, lambda o: nn.Dropout(o["p"])),
}

OPTIMIZERS = {
    "SGD": ({"lr": REQUIRED, "momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0,
             "nesterov": False, "maximize": False}, torch.optim.SGD),
    "Adam": ({"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
              "amsgrad": False, "maximize": False}, torch.optim.Adam),
}


def build_model(model):
    if not isinstance(model, list):
        raise ConfigError("model: expected a list of layers")
    layers = []
    for i, spec in enumerate(model):
        if isinstance(spec, dict) and len(spec) != 1:
            raise ConfigError(f"model[{i}]: a layer is a map with one key, the class")
        cls, opts = (spec, None) if isinstance(spec, str) else next(iter(spec.items()))
        if cls not in LAYERS:
            raise ConfigError(f"model[{i}]: {cls}: not mirrored by this script (it mirrors "
                              f"{', '.join(LAYERS)})")
        allowed, make = LAYERS[cls]
        layers.append(make(take(opts, f"model[{i}] {cls}", allowed)))
    return nn.Sequential(*layers)


def read_config(path):
    import yaml  # PyYAML: Debian's python3-yaml, or pip install pyyaml

    with open(path) as f:
        cfg = yaml.safe_load(f)
    top = take(cfg, "top level", {"model": REQUIRED, "data": REQUIRED, "optimizer": REQUIRED,
                                  "loss": "CrossEntropyLoss", "loop": {}})
    if top["loss"] not in ("CrossEntropyLoss", {"class": "CrossEntropyLoss"}):
        raise ConfigError(f"loss {top['loss']}: only CrossEntropyLoss without options is "
                          "mirrored")
    data = take(top["data"], "data", {"class": REQUIRED, "options": REQUIRED,
                                      "train": {"split": "train"}, "validation": None,
                                      "test": None})
    if data["class"] != "mnist":
        raise ConfigError(f"data.class {data['class']}: this script reads class mnist only")
    base = take(data["options"], "data.options", {"path": REQUIRED, "split": "train",
                                                  "classes": 10})
    sets = {}
    for key in ("train", "validation", "test"):
        v = data[key]
        if v is None or (key == "validation" and not isinstance(v, dict)):
            continue
        sets[key] = take(v, f"data.{key}", {"split": REQUIRED})["split"]
    val = data["validation"]
    if val is not None and not isinstance(val, dict) and (
            isinstance(val, bool) or not isinstance(val, (int, float)) or val <= 0):
        raise ConfigError(f"data.validation {val!r}: a count, a fraction or a map of options")
    o = top["optimizer"]
    if not isinstance(o, dict) or "class" not in o:
        raise ConfigError("optimizer: a map with a class")
    if o["class"] not in OPTIMIZERS:
        raise ConfigError(f"optimizer.class {o['class']}: not mirrored (it mirrors "
                          f"{', '.join(OPTIMIZERS)})")
    allowed, make = OPTIMIZERS[o["class"]]
    opt = take({k: v for k, v in o.items() if k not in ("class", "groups")},
               "optimizer", allowed)
    groups = []
    for g, spec in enumerate(o.get("groups") or []):
        gopt = {k: v for k, v in (spec or {}).items() if k != "params"}
        if not isinstance(spec, dict) or "params" not in spec:
            raise ConfigError(f"optimizer.groups[{g}]: params (name patterns) is the only "
                              "selector mirrored")
        take(gopt, f"optimizer.groups[{g}]", {k: None for k in allowed})
        pats = spec["params"] if isinstance(spec["params"], list) else [spec["params"]]
        groups.append((pats, gopt))
    loop = take(top["loop"], "loop", {"epochs": 10, "batch_size": 64, "seed": 0,
                                      "shuffle": True, "workers": 0, "eval_batch_size": 0})
    p = base["path"]
    if not os.path.isabs(p):
        p = os.path.join(os.path.dirname(path), p)
    return dict(model=top["model"], path=p, classes=base["classes"], sets=sets, val=val,
                opt_class=o["class"], make_opt=make, opt=opt, groups=groups, loop=loop)


def param_groups(model, opt, groups):
    """ember-train's grouping: each parameter to the first group whose patterns match its
    name; the rest to the optimizer's defaults (a last group)."""
    out = [[] for _ in range(len(groups) + 1)]
    for name, p in model.named_parameters():
        g = next((i for i, (pats, _) in enumerate(groups)
                  if any(fnmatch.fnmatchcase(name, t) for t in pats)), len(groups))
        out[g].append(p)
    res = []
    for i, (pats, gopt) in enumerate(groups):
        if not out[i]:
            raise ConfigError(f"optimizer.groups[{i}]: {pats} selects no parameter")
        res.append(dict(params=out[i], **gopt))
    if out[-1]:
        res.append(dict(params=out[-1]))
    return res


@torch.no_grad()
def evaluate(model, x, y, batch):
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x), batch):
        out = model(x[i:i + batch].float().div_(255))
        t = y[i:i + batch]
        loss += nn.functional.cross_entropy(out, t, reduction="sum").item()
        correct += int((out.argmax(1) == t).sum())
    model.train()
    return loss / len(x), correct / len(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="an Ember config with data class mnist")
    ap.add_argument("--path", help="the IDX directory (default: the config's)")
    ap.add_argument("--epochs", type=int, help="default: the config's loop.epochs")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    try:
        c = read_config(args.config)
    except (ConfigError, OSError) as e:
        sys.exit(f"epoch_torch.py: {args.config}: {e}")
    loop = c["loop"]
    epochs = args.epochs if args.epochs is not None else loop["epochs"]
    batch = loop["batch_size"]
    eval_batch = loop["eval_batch_size"] or batch
    path = args.path or c["path"]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(loop["seed"])
    gen = torch.Generator().manual_seed(loop["seed"])
    try:
        xt, yt = read_split(path, c["sets"].get("train", "train"), c["classes"])
        xv = yv = xs = ys = None
        if "validation" in c["sets"]:
            xv, yv = read_split(path, c["sets"]["validation"], c["classes"])
        elif c["val"] is not None:
            n = len(xt)
            k = int(c["val"]) if float(c["val"]) >= 1 else max(1, round(c["val"] * n))
            if not 1 <= k < n:
                raise ConfigError(f"data.validation {c['val']}: outside [1, {n - 1}]")
            perm = torch.randperm(n, generator=gen)
            xv, yv = xt[perm[n - k:]], yt[perm[n - k:]]
            xt, yt = xt[perm[:n - k]], yt[perm[:n - k]]
        if "test" in c["sets"]:
            xs, ys = read_split(path, c["sets"]["test"], c["classes"])
        model = build_model(c["model"])
        opt = c["make_opt"](param_groups(model, c["opt"], c["groups"]), **c["opt"])
    except (ConfigError, OSError) as e:
        sys.exit(f"epoch_torch.py: {args.config}: {e}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {path}: "
          f"{len(xt)} training, {0 if xv is None else len(xv)} validation, "
          f"{0 if xs is None else len(xs)} test items; batch {batch}, {c['opt_class']} "
          f"{c['opt']}, {epochs} epochs, seed {loop['seed']}; start-up and data "
          f"{time.perf_counter() - T_START:.2f}s", flush=True)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    t0 = time.perf_counter()
    for epoch in range(epochs):
        n = len(xt)
        order = torch.randperm(n, generator=gen) if loop["shuffle"] else torch.arange(n)
        total = 0.0
        for i in range(0, n, batch):
            b = order[i:i + batch]
            out = model(xt[b].float().div_(255))
            loss = loss_fn(out, yt[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(b)
        line = f"epoch {epoch + 1}/{epochs}: train loss {total / n:.4f}"
        if xv is not None:
            vl, va = evaluate(model, xv, yv, eval_batch)
            line += f"  val loss {vl:.4f} accuracy {100 * va:.2f}%"
        print(f"{line}  {time.perf_counter() - t0:.1f}s", flush=True)
    if xs is not None:
        tl, ta = evaluate(model, xs, ys, eval_batch)
        print(f"test: loss {tl:.6f} accuracy {100 * ta:.4f}% ({len(xs)} samples)")
    print(f"epoch_torch.py: {time.perf_counter() - T_START:.2f}s after the imports began")


if __name__ == "__main__":
    main()
