"""Render: answers in, project files out.

Takes a checked `Answers` and gives a project folder: the cookiecutter template rendered through a staging
folder (render.py, staging.py, replace.py), Kubernetes manifests (k8s.py), the pristine copy of what was
generated, and `npu-wizard update`, which merges new answers into a project the user has edited.
"""
