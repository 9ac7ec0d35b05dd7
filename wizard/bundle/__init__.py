"""`npu-wizard bundle RUN`: one bounded, secret-free archive of a run for whoever must help."""
