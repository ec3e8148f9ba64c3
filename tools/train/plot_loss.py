#!/usr/bin/python3
"""plot_loss.py — the model card's loss curve from train.py's log.jsonl (matplotlib, Debian's
python3-matplotlib): the training loss (1/t-weighted masked CE, mean per logged window) and the
held-out loss against tokens seen, and the held-out masked-token accuracy at mask ratio 0.5 against
the unigram baseline. Steps logged twice (a run resumed from an earlier checkpoint) keep the
later entry."""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--log", default="models/train-work/run/log.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="unmask-code-13m: masked-diffusion pre-training")
    args = ap.parse_args()
    train, evals = {}, {}
    for line in open(args.log):
        e = json.loads(line)
        (evals if "eval_loss" in e else train)[e["step"]] = e
    tr = [train[k] for k in sorted(train)]
    ev = [evals[k] for k in sorted(evals)]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    a1.plot([e["tokens"] / 1e6 for e in tr], [e["loss"] for e in tr], lw=0.8, alpha=0.6, label="train loss (window mean)")
    a1.plot([e["tokens"] / 1e6 for e in tr], [e["ce"] for e in tr], lw=0.8, alpha=0.6, label="train masked CE (unweighted)")
    a1.plot([e["tokens"] / 1e6 for e in ev], [e["eval_loss"] for e in ev], "o-", lw=1.5, label="held-out loss")
    a1.set_xlabel("tokens seen (millions)")
    a1.set_ylabel("nats per token")
    a1.grid(alpha=0.3)
    a1.legend()
    a2.plot([e["tokens"] / 1e6 for e in ev], [100 * e["eval_acc@0.5"] for e in ev], "o-", label="model")
    a2.plot([e["tokens"] / 1e6 for e in ev], [100 * e["eval_unigram_acc@0.5"] for e in ev], "s--",
            label="unigram guess")
    a2.set_xlabel("tokens seen (millions)")
    a2.set_ylabel("held-out accuracy, 50% masked (%)")
    a2.grid(alpha=0.3)
    a2.legend()
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
