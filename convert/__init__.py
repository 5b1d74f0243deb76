"""Heads made elsewhere: read every draft-checkpoint layout in use, write ours or theirs, diagnose (docs/convert.md)."""
