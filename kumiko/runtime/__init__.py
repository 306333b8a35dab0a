"""Runtimes: compiling generated sources, loading them and running programs (CPU via ctypes, CUDA emulator)."""
