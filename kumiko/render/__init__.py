"""Renderers: kernel IR -> C (``c``)."""
