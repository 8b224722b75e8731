#!/usr/bin/python3
"""The character-level language models of examples/charlm-*.yaml, trained by PyTorch with the
same data and settings as ember-train, for the comparison the README reports.

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

The Transformer is Ember's Embedding -> LearnedPositionalEncoding (max_len seq_len, N(0, 1)) ->
TransformerEncoder (pre-norm, ReLU, feed-forward 4 * embed, causal: the float -inf upper
triangle as the mask, each layer initialised on its own) -> Linear, without a final LayerNorm.

    bench/charlm_torch.py --model mlp        # examples/charlm-mlp.yaml's model and settings
    bench/charlm_torch.py --model lstm --embed 64 --hidden 256 --layers 2
    bench/charlm_torch.py --model transformer --embed 64 --layers 2 --heads 4 --seq-len 64 \
        --batch 32 --lr 0.002 --epochs 2     # examples/charlm-transformer.yaml's

Runs under Debian's python3-torch (1.13) or a newer PyTorch; prints the torch version.
"""
import argparse
import gzip
import math
import time

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


class Transformer(nn.Module):
    def __init__(self, V, E, layers, heads, seq_len, dropout):
        super().__init__()
        self.emb = nn.Embedding(V, E)
        self.pos = nn.Embedding(seq_len, E)
        make = lambda: nn.TransformerEncoderLayer(E, heads, 4 * E, dropout, batch_first=True,
                                                  norm_first=True)
        self.enc = nn.TransformerEncoder(make(), layers)
        # nn.TransformerEncoder deep-copies its layer, so every layer would start from the same
        # weights; Ember's TransformerEncoder initialises each layer on its own, and so here.
        self.enc.layers = nn.ModuleList([make() for _ in range(layers)])
        self.out = nn.Linear(E, V)

    def forward(self, x):
        L = x.shape[1]
        h = self.emb(x) + self.pos(torch.arange(L, device=x.device))[None]
        mask = torch.triu(torch.full((L, L), float("-inf")), diagonal=1)
        return self.out(self.enc(h, mask=mask))


def build(args, V):
    if args.model == "mlp":
        return nn.Sequential(nn.Embedding(V, args.embed), nn.Linear(args.embed, args.hidden),
                             nn.GELU(), nn.Linear(args.hidden, V))
    if args.model == "lstm":
        return Lstm(V, args.embed, args.hidden, args.layers, args.dropout)
    return Transformer(V, args.embed, args.layers, args.heads, args.seq_len, args.dropout)


@torch.no_grad()
def evaluate(model, x, y, batch, V):
    model.eval()
    total, tokens = 0.0, 0
    for i in range(0, len(x), batch):
        out = model(x[i : i + batch])
        total += nn.functional.cross_entropy(out.reshape(-1, V), y[i : i + batch].reshape(-1),
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
    ap.add_argument("--path", default="/usr/share/doc/jargon-text/jargon.txt.gz")
    ap.add_argument("--model", choices=["mlp", "lstm", "transformer"], default="mlp")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--stride", type=int, default=0, help="0: seq_len")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--embed", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train_tok, val_tok, V = split_and_vocab(read_text(args.path), args.val_fraction)
    stride = args.stride or args.seq_len
    xt, yt = windows(train_tok, args.seq_len, stride)
    xv, yv = windows(val_tok, args.seq_len, stride)
    print(f"torch {torch.__version__}; {args.path}: vocabulary {V}, {len(xt)} training and "
          f"{len(xv)} validation windows of {args.seq_len}")
    model = build(args, V)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    uni = unigram_perplexity(yv, V)
    t0 = time.time()
    for epoch in range(args.epochs):
        perm = torch.randperm(len(xt), generator=gen)
        total, n = 0.0, 0
        for i in range(0, len(xt), args.batch):
            b = perm[i : i + args.batch]
            out = model(xt[b])
            loss = nn.functional.cross_entropy(out.reshape(-1, V), yt[b].reshape(-1))
            opt.zero_grad()
            loss.backward()
            if args.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            total += loss.item() * len(b)
            n += len(b)
        vl = evaluate(model, xv, yv, args.batch, V)
        tl = total / n
        print(f"epoch {epoch + 1}/{args.epochs}: train loss {tl:.4f} ppl {math.exp(tl):.3f}  "
              f"val loss {vl:.4f} ppl {math.exp(vl):.3f} (unigram {uni:.3f})  "
              f"{time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
