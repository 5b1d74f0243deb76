"""The names earlier releases published here (the vLLM entry point, the MLP speculator's `custom_class` path
`draftsmith.vllm_plugin.MLPSpeculatorProposer`, `speculative_kwargs`): they live in draftsmith.serve.plugin now."""

from draftsmith.serve.plugin import CLASS_PATH, MLPSpeculatorProposer, load_speculator, register, speculative_kwargs

__all__ = ["CLASS_PATH", "MLPSpeculatorProposer", "load_speculator", "register", "speculative_kwargs"]
