"""Each task's metric (data/tasks.py names them), on numpy arrays of predictions and gold labels; binary metrics take
class 1 as positive."""
import math

import numpy as np


def accuracy(pred, gold):
    return float(np.mean(pred == gold))


def f1(pred, gold, positive=1):
    tp = np.sum((pred == positive) & (gold == positive))
    wrong = np.sum((pred == positive) != (gold == positive))  # false positives + false negatives
    return float(2 * tp / (2 * tp + wrong)) if tp else 0.0


def macro_f1(pred, gold):
    return float(np.mean([f1(pred, gold, c) for c in np.union1d(pred, gold)]))


def matthews(pred, gold):
    tp, tn = float(np.sum((pred == 1) & (gold == 1))), float(np.sum((pred != 1) & (gold != 1)))
    fp, fn = float(np.sum((pred == 1) & (gold != 1))), float(np.sum((pred != 1) & (gold == 1)))
    den = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return (tp * tn - fp * fn) / den if den else 0.0  # a constant prediction or gold: no correlation


def pearson(x, y):
    x, y = x - np.mean(x), y - np.mean(y)
    den = math.sqrt(np.sum(x * x) * np.sum(y * y))
    return float(np.sum(x * y) / den) if den else 0.0


def ranks(x):
    """1-based ranks of x; tied values share the average of their ranks."""
    order = np.argsort(x, kind="stable")
    xs = np.asarray(x)[order]
    starts = np.flatnonzero(np.r_[True, xs[1:] != xs[:-1]])
    ends = np.r_[starts[1:], len(xs)]
    r = np.empty(len(xs))
    r[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return r


def spearman(x, y):
    return pearson(ranks(x), ranks(y))


METRICS = dict(acc=accuracy, f1=f1, macro_f1=macro_f1, mcc=matthews, pearson=pearson, spearman=spearman)
