"""draftsmith: train EAGLE-3 and MLP-speculator draft heads, export them for vLLM, measure served acceptance."""

__version__ = "0.1.0"
