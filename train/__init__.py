"""Training: the frozen target, data, heads, the TTT unroll and the one loop."""
