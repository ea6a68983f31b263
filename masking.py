"""
Which positions each view of a sequence sees, and which it predicts; and what stands at the predicted positions:
BERT's corruption, ELECTRA's replacements.

Everything here returns index tensors of fixed shape, so a model can gather with
them and torch.compile sees static shapes (no boolean masks with ragged rows).
Depends on torch alone; copy it anywhere.

    views = make_views(batch_size=8, block_size=128, mask_ratio=0.5, cms=True)
    views.rows         # (16,)     input row of each view: 8 rows x 2 complementary views
    views.visible_pos  # (16, 64)  positions the view's encoder sees
    views.target_pos   # (16, 64)  positions the view predicts
"""
from typing import NamedTuple

import torch


class Views(NamedTuple):
    rows: torch.Tensor         # (N,) which input row each view is made from
    visible_pos: torch.Tensor  # (N, K) positions the view keeps
    target_pos: torch.Tensor   # (N, M) positions the view must predict; K + M = T

    # tensor-like, so that a trainer moves a batch's tensors and views alike
    def pin_memory(self):
        return Views(*(t.pin_memory() for t in self))

    def to(self, *args, **kwargs):
        return Views(*(t.to(*args, **kwargs) for t in self))


def view_shape(block_size, mask_ratio, cms):
    """(V, K, M): views per sequence, visible and predicted positions per view.

    Without CMS there is one view that masks round(mask_ratio * T) positions.
    With the Complementary Masking Strategy the positions are split into V equal
    chunks and each view sees one chunk and predicts the rest: the visible sets
    partition the sequence, and the ratio is 1 - 1/V (0.5, 0.667, 0.75, ...). A
    ratio that V equal chunks cannot realise is an error rather than silently
    becoming the nearest one.
    """
    T, m = block_size, mask_ratio
    if not 0 < m < 1:
        raise ValueError(f"mask_ratio={m}: must be strictly between 0 and 1")
    if not cms:
        M = round(m * T)
        if not 0 < M < T:
            raise ValueError(f"mask_ratio={m} masks {M} of {T} positions; pick a ratio that masks at least one and "
                             "keeps one")
        return 1, T - M, M
    V = max(2, round(1 / (1 - m)))  # at least two: a lone view would see the whole row and predict nothing
    if abs(1 - 1 / V - m) > 0.005:
        raise ValueError(f"complementary masking cuts a sequence into V equal views, so its mask ratio is 1 - 1/V: "
                         f"0.5, 0.667, 0.75, 0.8, ...; mask_ratio={m} is not one of them. Pick one, or set cms=False")
    if T % V:
        raise ValueError(f"CMS with mask_ratio={m} cuts each sequence into {V} views, so block_size "
                         f"must be a multiple of {V} (got {T}); change block_size or mask_ratio")
    return V, T // V, T - T // V


def make_views(batch_size, block_size, mask_ratio, cms, generator=None, device=None):
    """Random views of each row, reproducible from `generator` (made on its device)."""
    B, T = batch_size, block_size
    V, K, M = view_shape(T, mask_ratio, cms)
    device = generator.device if generator is not None else device
    # MAE's trick: argsort of uniform noise is a uniform random permutation of each row's positions
    shuffled_pos = torch.rand(B, T, generator=generator, device=device).argsort(dim=1)
    rows = torch.arange(B, device=device).repeat_interleave(V)
    if V == 1:
        return Views(rows, shuffled_pos[:, :K], shuffled_pos[:, K:])
    chunk_pos = shuffled_pos.view(B, V, T // V)
    # view v owns chunk v; the others, in order v+1, v+2, ... (mod V), are its complement
    step = torch.arange(V, device=device)
    others = (step[:, None] + step[None, 1:]) % V
    own_pos = chunk_pos.reshape(B * V, T // V)
    rest_pos = chunk_pos[:, others].reshape(B * V, T - T // V)
    return Views(rows, own_pos, rest_pos)


def corrupt(idx, target_pos, mask_id, u=None, noise=None):
    """BERT's input: the token ids idx (N, T) with those at target_pos (N, M) replaced by <mask>.

    With BERT's 80/10/10 rule, u (N, M) uniforms and noise (N, M) random ids below mask_id (where the real text ids
    are) come from the trainer's draws: a target becomes <mask> where u < 0.8, its noise id where u < 0.9, and stays
    as it is elsewhere.
    """
    fill = torch.full_like(target_pos, mask_id)
    if u is not None:
        fill = torch.where(u < 0.8, fill, torch.where(u < 0.9, noise, idx.gather(1, target_pos)))
    return idx.scatter(1, target_pos, fill)


def replace_tokens(idx, target_pos, logits, u):
    """idx (N, T) with a sample of softmax(logits) (N, M, vocab) at target_pos (N, M), drawn by inverse CDF from u
    (N, M), and where the token now differs from the original (a sample equal to it counts as original)."""
    cdf = torch.softmax(logits, -1, dtype=torch.float32).cumsum_(-1)
    sampled = torch.searchsorted(cdf, (u * cdf[..., -1])[..., None]).squeeze(-1)  # u < 1: always below vocab
    replaced = idx.scatter(1, target_pos, sampled)
    return replaced, replaced != idx


def draws_of_rows(draws, rows, n_views):
    """A model's random inputs for a batch (its draw(): the Views, then tensors with a row per view) cut to the input
    rows `rows` (a slice) of that batch: their views, with rows renumbered from 0 to index the cut batch, and the
    other draws' rows of those views. A trainer that splits a batch over processes and micro-steps draws for the
    whole batch and cuts, so each row's draws do not depend on how the batch is split."""
    views, *per_view = draws
    mine = slice(rows.start * n_views, rows.stop * n_views)  # the n_views views of each input row are consecutive
    return (Views(views.rows[mine] - rows.start, views.visible_pos[mine], views.target_pos[mine]),
            *(t[mine] for t in per_view))
