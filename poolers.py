"""
Poolers: token states (B, T, C) and their padding mask (B, T) -> one embedding (B, C) per sequence.

embed.py trains them on a frozen (or finetuned) encoder; export.py ships them beside the exported encoder, so a
saved pooler gives the same vectors everywhere. Both start out as exactly plain mean pooling (our choice), so
training moves away from the zero-shot row. Depends on torch alone.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def mean_pool(h, mask):
    """Average of the token states h (B, T, C) over the real tokens (mask True), in float32."""
    m = mask.unsqueeze(-1).float()
    return (h.float() * m).sum(1) / m.sum(1)


class MeanPooler(nn.Module):
    """Mean pooling, then a learned linear head."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.head = nn.Linear(n_embd, n_embd, bias=False)
        nn.init.eye_(self.head.weight)

    def forward(self, h, mask):
        return self.head(mean_pool(h, mask))


class AttentionPooler(nn.Module):
    """One learned query cross-attends the token states; padded tokens are masked out."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Parameter(torch.zeros(n_embd))  # zero query: uniform attention, i.e. mean pooling
        self.k = nn.Linear(n_embd, n_embd, bias=False)
        self.v = nn.Linear(n_embd, n_embd, bias=False)
        self.proj = nn.Linear(n_embd, n_embd, bias=False)
        nn.init.normal_(self.k.weight, std=0.02)
        nn.init.eye_(self.v.weight)
        nn.init.eye_(self.proj.weight)

    def forward(self, h, mask):
        B, T, C = h.shape
        q = self.query.view(1, self.n_head, 1, -1).expand(B, -1, -1, -1)
        k = self.k(h).view(B, T, self.n_head, -1).transpose(1, 2)
        v = self.v(h).view(B, T, self.n_head, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.bool()[:, None, None, :])
        return self.proj(y.reshape(B, C))


POOLERS = {"mean": MeanPooler, "attn": AttentionPooler}
