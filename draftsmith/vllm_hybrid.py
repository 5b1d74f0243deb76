"""The names earlier releases published here (`hybrid_kwargs`, `install`): they live in draftsmith.serve.hybrid now."""

from draftsmith.serve.hybrid import KEY, hybrid_kwargs, install

__all__ = ["KEY", "hybrid_kwargs", "install"]
