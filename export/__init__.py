"""Export draft heads in the formats vLLM loads, with contract validation."""
