"""Reference implementations the tests compare against: plain, one query at a time, no cleverness."""

import torch


def single_query_step(head, tok, pos, prev, cache):
    """One draft position (a single query) with explicit full attention over the keys in `cache` + its own."""
    import math

    import torch.nn.functional as F

    from draftsmith.train.heads.eagle3 import apply_rope

    layer, attn = head.layers[0], head.layers[0].self_attn
    residual = prev
    hidden = layer.hidden_norm(prev)
    if layer.norm_before_residual:
        residual = hidden
    x = torch.cat([layer.input_layernorm(head.embed_tokens(tok)), hidden], dim=-1)
    B = x.shape[0]
    q = attn.q_proj(x).view(B, 1, attn.nh, attn.hd).transpose(1, 2)
    k = attn.k_proj(x).view(B, 1, attn.nkv, attn.hd).transpose(1, 2)
    v = attn.v_proj(x).view(B, 1, attn.nkv, attn.hd).transpose(1, 2)
    cos, sin = attn.rope(pos, q.dtype)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    rep = attn.nh // attn.nkv
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    cache.append((k, v))
    K = torch.cat([c[0] for c in cache], dim=2)
    Vv = torch.cat([c[1] for c in cache], dim=2)
    p = F.softmax((q @ K.transpose(-1, -2)) / math.sqrt(attn.hd), dim=-1)
    o = attn.o_proj((p @ Vv).transpose(1, 2).reshape(B, 1, -1))
    residual = residual + o
    return residual + layer.mlp(layer.post_attention_layernorm(residual))


def record_proposals(drafter) -> list:
    """Wrap `drafter.propose` so every proposal it makes is appended to the returned list (per decoding round)."""
    proposals = []
    propose = drafter.propose

    def recorded(*args, **kwargs):
        proposals.append(propose(*args, **kwargs))
        return proposals[-1]

    drafter.propose = recorded
    return proposals
