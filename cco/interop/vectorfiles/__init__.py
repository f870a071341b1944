"""The vector files, one module each: its generator and its check side by side.

Every module has ``FILE`` (the file name under ``interop/vectors``), ``vectors()``
(the file's vectors, built from fixed inputs and checked before they are returned)
and ``check(vectors)`` (what is wrong with a file: the rules of interop/README.md and
interop/payload.md as code; empty when every vector holds).
"""
