"""Developer tools (op coverage)."""
