"""The serving seam: everything that runs inside vLLM (the plugin, the hybrid drafter's wrap and its policy, the CPU
fixes, the hidden-state connector, the one-engine runner) and `draftsmith serve`. eval depends on it, never the
reverse."""
