"""The Hydra config tree, shipped as package data (draftsmith.conf): presets in conf/, groups beside them."""
