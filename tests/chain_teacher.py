"""A hand-written multihop teacher for tests of the evidence and routing studies."""

import torch


class ChainTeacher(torch.nn.Module):
    """A hand-written multihop teacher: it answers exactly by following the query's links among the
    visible items, and its (one-block) attention from the query falls on the first link only, as the
    trained teachers' last layer does (docs/evidence.md: the second link is composed inside the item
    tokens, so attention never points at it). So leave-one-out evidence is the whole chain and the
    attention target misses the second link, by construction."""

    dim, depth = 8, 1

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.scale = torch.nn.Parameter(torch.tensor(10.0))

    def forward(self, items, query, visible, positions=None, return_attn=False, return_hidden=False):
        B, N, _ = items.shape
        node, found = query[:, 0].clone(), torch.ones(B, dtype=torch.bool)
        first = torch.zeros(B, N, dtype=torch.bool)
        for hop in range(int(query[:, 1].max())):
            live = found & (hop < query[:, 1])
            match = (items[..., 0] == node[:, None]) & visible
            if hop == 0:
                first = match
            nxt = items[..., 1].gather(1, match.float().argmax(1, keepdim=True))[:, 0]
            found = torch.where(live, match.any(1), found)
            node = torch.where(live & found, nxt, node)
        logits = torch.nn.functional.one_hot(node, self.vocab).float() * self.scale * found[:, None]
        if not return_attn:
            return logits, []
        attn = torch.zeros(B, 1, N + 1, N + 1)
        row = torch.cat([torch.zeros(B, 1), first.float()], 1) + 1e-3 * torch.cat(
            [torch.zeros(B, 1), visible.float()], 1
        )
        attn[:, 0, 0] = row / row.sum(1, keepdim=True)
        return logits, [attn]
