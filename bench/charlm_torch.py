#!/usr/bin/python3
"""The character-level language models of examples/charlm-*.yaml, trained by PyTorch with the
same data and settings as ember-train, for the comparison the README reports.

    bench/charlm_torch.py examples/charlm-lstm.yaml          # everything from the config
    bench/charlm_torch.py examples/charlm-transformer.yaml --threads 2
    bench/charlm_torch.py --model lstm --embed 32 --hidden 128 --layers 1 ...   # by flags

Given an Ember config, the model, the data options, the optimizer and the loop settings are
read from it (PyYAML), layer by layer, and anything this script does not mirror exactly (a
layer class, an option, a scheduler, a loop key) is an error naming it, so the twin cannot
drift from the config silently. Flags given beside a config override it (--epochs, --seed,
--path) and are printed.

The data is exactly what Ember's "text" dataset class gives (docs/data.md): the file's UTF-8
characters; the last floor(n * val_fraction) of them are the validation part; the vocabulary
is the training part's distinct characters sorted by code point, plus one unknown id (last)
when the validation part has characters the training part lacks; item i is the window at
i * stride: input t[s:s+L], target t[s+1:s+L+1]. Training: Adam, the gradients' total 2-norm
clipped (torch.nn.utils.clip_grad_norm_), the windows shuffled each epoch, the last batch kept
(drop_last False); the loss is the mean cross-entropy over every token of the (B, L, V)
logits. Each epoch prints the training and validation loss and perplexity (exp of the mean
token loss) and the unigram perplexity of the validation targets (exp of the entropy of their
own character frequencies), as ember-train's epoch lines do.

Ember's layers map to PyTorch's with Ember's (= PyTorch's) default initialisation: Embedding
N(0, 1); Linear and LSTM PyTorch's defaults; LearnedPositionalEncoding an nn.Embedding(max_len,
d_model) over arange(L), N(0, 1); TransformerEncoder nn.TransformerEncoder of
nn.TransformerEncoderLayer (each layer initialised on its own, as Ember's, not deep copies;
causal: the float -inf upper triangle as the mask; norm: a final LayerNorm). The seed seeds
torch's generator (initialisation) and the shuffling's; PyTorch's random streams are not
Ember's, so the two runs start from different draws of the same distributions.

Runs under Debian's python3-torch (1.13) or a newer PyTorch; prints the torch version.
"""
import argparse
import gzip
import math
import os
import sys
import time

from ember_config import REQUIRED, ConfigError, take  # bench/ember_config.py

import torch
import torch.nn as nn


def read_text(path):
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8")


def split_and_vocab(text, val_fraction):
    n = len(text)
    n_val = int(val_fraction * n)
    train, val = text[: n - n_val], text[n - n_val :]
    vocab = sorted(set(train))
    ids = {c: i for i, c in enumerate(vocab)}
    unk = len(vocab) if any(c not in ids for c in val) else None
    size = len(vocab) + (unk is not None)
    enc = lambda s: torch.tensor([ids.get(c, unk) for c in s], dtype=torch.int64)
    return enc(train), enc(val), size


def windows(tok, seq_len, stride):
    count = (len(tok) - seq_len - 1) // stride + 1
    starts = torch.arange(count) * stride
    idx = starts[:, None] + torch.arange(seq_len)[None, :]
    return tok[idx], tok[idx + 1]


class Lstm(nn.Module):
    def __init__(self, V, E, H, layers, dropout):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.rnn = nn.LSTM(E, H, num_layers=layers, batch_first=True,
                           dropout=dropout if layers > 1 else 0.0)
        self.out = nn.Linear(H, V)

    def forward(self, x):
        y, _ = self.rnn(self.emb(x))
        return self.out(y)


def encoder(E, heads, ff, dropout, layers, activation="relu", eps=1e-5, batch_first=True,
            norm_first=True, norm=False):
    make = lambda: nn.TransformerEncoderLayer(E, heads, ff, dropout, activation=activation,
                                              layer_norm_eps=eps, batch_first=batch_first,
                                              norm_first=norm_first)
    enc = nn.TransformerEncoder(make(), layers, norm=nn.LayerNorm(E, eps=eps) if norm else None,
                                enable_nested_tensor=False)
    # nn.TransformerEncoder deep-copies its layer, so every layer would start from the same
    # weights; Ember's TransformerEncoder initialises each layer on its own, and so here.
    enc.layers = nn.ModuleList([make() for _ in range(layers)])
    return enc


def causal_mask(L, device):
    return torch.triu(torch.full((L, L), float("-inf"), device=device), diagonal=1)


class Transformer(nn.Module):
    def __init__(self, V, E, layers, heads, seq_len, dropout):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.pos = nn.Embedding(seq_len, E)
        self.enc = encoder(E, heads, 4 * E, dropout, layers)
        self.out = nn.Linear(E, V)

    def forward(self, x):
        L = x.shape[1]
        h = self.emb(x) + self.pos(torch.arange(L, device=x.device))[None]
        return self.out(self.enc(h, mask=causal_mask(L, x.device)))


def build(args, V):
    if args.model == "mlp":
        return nn.Sequential(nn.Embedding(V, args.embed), nn.Linear(args.embed, args.hidden),
                             nn.GELU(), nn.Linear(args.hidden, V))
    if args.model == "lstm":
        return Lstm(V, args.embed, args.hidden, args.layers, args.dropout)
    return Transformer(V, args.embed, args.layers, args.heads, args.seq_len, args.dropout)


# ---- an Ember config, read layer by layer ---------------------------------------------------






class LstmOutput(nn.Module):
    """Ember's LSTM with output: sequence (its default): the outputs of every step."""

    def __init__(self, o):
        super().__init__()
        self.rnn = nn.LSTM(o["input_size"], o["hidden_size"], num_layers=o["num_layers"],
                           bias=o["bias"], batch_first=o["batch_first"], dropout=o["dropout"],
                           bidirectional=o["bidirectional"])

    def forward(self, x):
        return self.rnn(x)[0]


class LearnedPositions(nn.Module):
    """Ember's LearnedPositionalEncoding: x + Embedding(max_len, d_model)(arange(L))."""

    def __init__(self, o):
        super().__init__()
        self.weight = nn.Embedding(o["max_len"], o["d_model"])  # N(0, 1), as Ember's
        self.batch_first, self.drop = o["batch_first"], nn.Dropout(o["dropout"])

    def forward(self, x):
        L = x.shape[1 if self.batch_first else 0]
        p = self.weight(torch.arange(L, device=x.device))
        return self.drop(x + (p[None] if self.batch_first else p[:, None]))


class Encoder(nn.Module):
    """Ember's TransformerEncoder; causal: the float -inf upper triangle as the mask."""

    def __init__(self, o):
        super().__init__()
        self.enc = encoder(o["d_model"], o["nhead"], o["dim_feedforward"], o["dropout"],
                           o["num_layers"], o["activation"], o["layer_norm_eps"],
                           o["batch_first"], o["norm_first"], o["norm"])
        self.causal, self.batch_first = o["causal"], o["batch_first"]

    def forward(self, x):
        L = x.shape[1 if self.batch_first else 0]
        return self.enc(x, mask=causal_mask(L, x.device) if self.causal else None)


LAYERS = {
    # class: (options with Ember's defaults, builder)
    "Embedding": ({"num_embeddings": REQUIRED, "embedding_dim": REQUIRED},
                  lambda o: nn.Embedding(o["num_embeddings"], o["embedding_dim"])),
    "Linear": ({"in_features": REQUIRED, "out_features": REQUIRED, "bias": True},
               lambda o: nn.Linear(o["in_features"], o["out_features"], bias=o["bias"])),
    "GELU": ({"approximate": "none"}, lambda o: nn.GELU(approximate=o["approximate"])),
    "ReLU": ({}, lambda o: nn.ReLU()),
    "Dropout": ({"p": 0.5}, lambda o: nn.Dropout(o["p"])),
    "LSTM": ({"input_size": REQUIRED, "hidden_size": REQUIRED, "num_layers": 1, "bias": True,
              "batch_first": False, "dropout": 0.0, "bidirectional": False,
              "output": "sequence"}, LstmOutput),
    "LearnedPositionalEncoding": ({"d_model": REQUIRED, "max_len": 512, "batch_first": False,
                                   "dropout": 0.0}, LearnedPositions),
    "TransformerEncoder": ({"d_model": REQUIRED, "nhead": REQUIRED, "dim_feedforward": 2048,
                            "dropout": 0.1, "activation": "relu", "layer_norm_eps": 1e-5,
                            "batch_first": False, "norm_first": False, "causal": False,
                            "num_layers": REQUIRED, "norm": False}, Encoder),
}


def build_from_config(model, V):
    if not isinstance(model, list):
        raise ConfigError("model: expected a list of layers")
    layers = []
    for i, spec in enumerate(model):
        cls, opts = (spec, None) if isinstance(spec, str) else next(iter(spec.items()))
        if not isinstance(spec, str) and len(spec) != 1:
            raise ConfigError(f"model[{i}]: a layer is a map with one key, the class")
        if cls not in LAYERS:
            raise ConfigError(f"model[{i}]: {cls}: not mirrored by this script (it mirrors "
                              f"{', '.join(LAYERS)})")
        allowed, make = LAYERS[cls]
        o = take(opts, f"model[{i}] {cls}", allowed)
        if cls == "LSTM" and o["output"] != "sequence":
            raise ConfigError(f"model[{i}] LSTM: output {o['output']}: not mirrored")
        if cls == "Embedding" and o["num_embeddings"] < V:
            raise ConfigError(f"model[{i}] Embedding: num_embeddings {o['num_embeddings']} but "
                              f"the data's vocabulary has {V} ids")
        layers.append(make(o))
    return nn.Sequential(*layers)


def read_config(path, args):
    import yaml  # PyYAML: Debian's python3-yaml, or pip install pyyaml

    with open(path) as f:
        cfg = yaml.safe_load(f)
    top = take(cfg, path, {"model": REQUIRED, "data": REQUIRED, "optimizer": REQUIRED,
                           "loop": {}})
    data = take(top["data"], "data", {"class": REQUIRED, "options": REQUIRED,
                                      "validation": REQUIRED})
    if data["class"] != "text":
        raise ConfigError(f"data.class {data['class']}: this script reads class text only")
    if data["validation"] != {"split": "validation"}:
        raise ConfigError("data.validation: only {split: validation} is mirrored")
    d = take(data["options"], "data.options", {"path": REQUIRED, "seq_len": 128, "stride": 0,
                                               "val_fraction": 0.1, "level": "char",
                                               "unknown": "token"})
    if d["level"] != "char" or d["unknown"] != "token":
        raise ConfigError("data.options: level char and unknown token only are mirrored")
    opt = take(top["optimizer"], "optimizer", {"class": REQUIRED, "lr": 1e-3,
                                               "betas": [0.9, 0.999], "eps": 1e-8,
                                               "weight_decay": 0.0})
    if opt["class"] != "Adam":
        raise ConfigError(f"optimizer.class {opt['class']}: only Adam is mirrored")
    loop = take(top["loop"], "loop", {"epochs": 10, "batch_size": 64, "clip_grad_norm": 0.0,
                                      "seed": 0, "eval_batch_size": 0})
    p = d["path"]
    if not os.path.isabs(p):
        p = os.path.join(os.path.dirname(path), p)
    args.path = args.path or p
    args.seq_len, args.stride, args.val_fraction = d["seq_len"], d["stride"], d["val_fraction"]
    args.lr, args.betas, args.eps, args.weight_decay = (opt["lr"], tuple(opt["betas"]),
                                                        opt["eps"], opt["weight_decay"])
    args.batch, args.clip = loop["batch_size"], loop["clip_grad_norm"]
    args.eval_batch = loop["eval_batch_size"] or args.batch
    args.epochs = args.epochs if args.epochs is not None else loop["epochs"]
    args.seed = args.seed if args.seed is not None else loop["seed"]
    return top["model"]


@torch.no_grad()
def evaluate(model, x, y, batch, V):
    model.eval()
    total, tokens = 0.0, 0
    for i in range(0, len(x), batch):
        out = model(x[i : i + batch])
        total += nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]),
                                             y[i : i + batch].reshape(-1),
                                             reduction="sum").item()
        tokens += y[i : i + batch].numel()
    model.train()
    return total / tokens


def unigram_perplexity(y, V):
    p = torch.bincount(y.reshape(-1), minlength=V).double()
    p = p[p > 0] / p.sum()
    return math.exp(-(p * p.log()).sum().item())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="an Ember config (examples/charlm-*.yaml)")
    ap.add_argument("--path", help="the text (default: the config's, or Debian's jargon-text)")
    ap.add_argument("--model", choices=["mlp", "lstm", "transformer"], default="mlp",
                    help="without a config: the model")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--stride", type=int, default=0, help="0: seq_len")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, help="default: the config's, or 3")
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, help="default: the config's loop.seed, or 0")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    args.betas, args.eps, args.weight_decay = (0.9, 0.999), 1e-8, 0.0
    spec = None
    if args.config:
        try:
            spec = read_config(args.config, args)
        except ConfigError as e:
            sys.exit(f"charlm_torch.py: {args.config}: {e}")
    else:
        args.path = args.path or "/usr/share/doc/jargon-text/jargon.txt.gz"
        args.epochs = 3 if args.epochs is None else args.epochs
        args.seed = 0 if args.seed is None else args.seed
        args.eval_batch = args.batch
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train_tok, val_tok, V = split_and_vocab(read_text(args.path), args.val_fraction)
    stride = args.stride or args.seq_len
    xt, yt = windows(train_tok, args.seq_len, stride)
    xv, yv = windows(val_tok, args.seq_len, stride)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.path}: "
          f"vocabulary {V}, {len(xt)} training and {len(xv)} validation windows of "
          f"{args.seq_len} (stride {stride}); batch {args.batch}, Adam lr {args.lr}, clip "
          f"{args.clip}, {args.epochs} epochs, seed {args.seed}")
    try:
        model = build_from_config(spec, V) if spec is not None else build(args, V)
    except ConfigError as e:
        sys.exit(f"charlm_torch.py: {args.config}: {e}")
    print(model)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, betas=args.betas, eps=args.eps,
                           weight_decay=args.weight_decay)
    gen = torch.Generator().manual_seed(args.seed)
    uni = unigram_perplexity(yv, V)
    t0, c0 = time.time(), time.process_time()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xt), generator=gen)
        total, n = 0.0, 0
        for i in range(0, len(xt), args.batch):
            b = perm[i : i + args.batch]
            out = model(xt[b])
            loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), yt[b].reshape(-1))
            opt.zero_grad()
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            total += loss.item() * len(b)
            n += len(b)
        vl = evaluate(model, xv, yv, args.eval_batch, V)
        tl = total / n
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {tl:.4f} ppl {math.exp(tl):.3f}  "
              f"val loss {vl:.4f} ppl {math.exp(vl):.3f} (unigram {uni:.3f})  "
              f"{time.time() - t0:.1f}s wall, {time.process_time() - c0:.1f}s CPU", flush=True)


if __name__ == "__main__":
    main()
