"""Test helpers shared by the CPU and GPU suites (import as ``helpers``: tests/ is put on sys.path)."""
