"""Served acceptance: draft heads and training-free baselines in real vLLM speculative decoding.

`draftsmith.eval.acceptance.run_acceptance` runs the methods, `draftsmith.eval.prompts.load_prompts`
reads benchmark prompts. Nothing is imported here.
"""
