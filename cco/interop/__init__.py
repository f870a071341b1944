"""Interoperability test vectors: their generator, their JSON form and their checks.

The vectors in ``interop/vectors/`` are what another CCO implementation tests
itself against; ``cco-interop generate`` writes them and ``cco-interop check``
verifies them against this implementation (see ``interop/README.md``).
"""
