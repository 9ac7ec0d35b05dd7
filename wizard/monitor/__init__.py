"""The live side of `npu-wizard run` and `npu-wizard monitor`: job state, status stream, views."""
