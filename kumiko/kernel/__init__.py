"""Kernel IR: CPU loop nests (``loops``) lowered from a Region and its Plan."""
