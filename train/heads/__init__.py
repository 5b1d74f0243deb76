"""Draft heads: plain nn.Modules whose parameter names are the exported checkpoint keys."""
